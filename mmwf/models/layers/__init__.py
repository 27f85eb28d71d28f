from .dynamic_dwconv import (
                             AdaptiveDynamicDWConv,
                             AmpDirDynamicDWConv,
                             ConvDynamicDWConv,
                             DynamicDWConv,
                             GAPDynamicDWConv,
                             StaticDWConv,
)
from .dynamic_linear import (
                             BilateralDynamicLinear,
                             DeepDynamicLinear,
                             DynamicLinear,
                             GAPDynamicLinear,
                             LinearDynamicLinear,
                             NonlinearDynamicLinear,
                             StaticLinear,
)
from .norm import LN2d

__all__ = ['LN2d', 'DynamicLinear', 'GAPDynamicLinear', 'LinearDynamicLinear', 'NonlinearDynamicLinear',
           'DeepDynamicLinear', 'BilateralDynamicLinear', 'StaticLinear', 'DynamicDWConv', 'GAPDynamicDWConv',
           'AdaptiveDynamicDWConv', 'AmpDirDynamicDWConv', 'ConvDynamicDWConv', 'StaticDWConv']
