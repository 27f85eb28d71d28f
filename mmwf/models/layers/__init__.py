from .attention import (
                        AttentionBase,
                        ELUAttention,
                        InLineAttention,
                        MHLAttention,
                        ReLUAttention,
                        SoftmaxAttention,
)
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
from .norm import LayerNorm2d
from .tokens import (
                     PatchEmbed,
                     map_to_tokens,
                     partition,
                     pool_tokens,
                     resample_grid_tokens,
                     resample_pos_embed,
                     tokens_to_map,
                     unpartition,
)
from .ttt_attention import TTTAttention

__all__ = ['LayerNorm2d', 'DynamicLinear', 'GAPDynamicLinear', 'LinearDynamicLinear', 'NonlinearDynamicLinear',
           'DeepDynamicLinear', 'BilateralDynamicLinear', 'StaticLinear', 'DynamicDWConv', 'GAPDynamicDWConv',
           'AdaptiveDynamicDWConv', 'AmpDirDynamicDWConv', 'ConvDynamicDWConv', 'StaticDWConv', 'AttentionBase',
           'SoftmaxAttention', 'ELUAttention', 'ReLUAttention', 'InLineAttention', 'MHLAttention', 'TTTAttention',
           'PatchEmbed', 'tokens_to_map', 'map_to_tokens', 'pool_tokens', 'partition', 'unpartition',
           'resample_grid_tokens', 'resample_pos_embed']
