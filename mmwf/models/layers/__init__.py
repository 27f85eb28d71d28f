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
from .linear_attention import ELUAttention, InLineAttention, MHLAttention, ReLUAttention
from .norm import LN2d
from .ttt_attention import TTTAttention

__all__ = ['LN2d', 'DynamicLinear', 'GAPDynamicLinear', 'LinearDynamicLinear', 'NonlinearDynamicLinear',
           'DeepDynamicLinear', 'BilateralDynamicLinear', 'StaticLinear', 'DynamicDWConv', 'GAPDynamicDWConv',
           'AdaptiveDynamicDWConv', 'AmpDirDynamicDWConv', 'ConvDynamicDWConv', 'StaticDWConv', 'ELUAttention',
           'ReLUAttention', 'InLineAttention', 'MHLAttention', 'TTTAttention']
