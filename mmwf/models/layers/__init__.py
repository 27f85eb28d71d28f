from .arch import dynamic_block_ids, resolve_arch
from .attention import (
                        AttentionBase,
                        ELUAttention,
                        InLineAttention,
                        KernelAttention,
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
from .ffn import FFN_TYPES, ffn_widths, gelu_linear, swiglu
from .implementation import CHOICES, evaluation, has_forward_hooks, implementation
from .norm import TOKEN_NORMS, LayerNorm2d, build_token_norm
from .sequence import run_blocks
from .tokens import (
                     PatchEmbed,
                     map_to_tokens,
                     partition,
                     pool_tokens,
                     resample_pos_embed,
                     tokens_to_map,
                     unpartition,
)
from .ttt_attention import TTTAttention

# DeiT's attention operators by short name (the one table: configs use the class names, tools the short names);
# each class says whether it takes a class token (``with_cls_token``)
OPERATORS = {'softmax': SoftmaxAttention, 'elu': ELUAttention, 'relu': ReLUAttention, 'inline': InLineAttention,
             'mhla': MHLAttention, 'ttt': TTTAttention}

__all__ = ['LayerNorm2d', 'TOKEN_NORMS', 'build_token_norm', 'FFN_TYPES', 'ffn_widths', 'gelu_linear', 'swiglu',
           'DynamicLinear', 'GAPDynamicLinear', 'LinearDynamicLinear', 'NonlinearDynamicLinear',
           'DeepDynamicLinear', 'BilateralDynamicLinear', 'StaticLinear', 'DynamicDWConv', 'GAPDynamicDWConv',
           'AdaptiveDynamicDWConv', 'AmpDirDynamicDWConv', 'ConvDynamicDWConv', 'StaticDWConv', 'AttentionBase',
           'KernelAttention', 'OPERATORS', 'SoftmaxAttention', 'ELUAttention', 'ReLUAttention', 'InLineAttention',
           'MHLAttention', 'TTTAttention',
           'PatchEmbed', 'tokens_to_map', 'map_to_tokens', 'pool_tokens', 'partition', 'unpartition',
           'resample_pos_embed', 'resolve_arch', 'dynamic_block_ids', 'implementation', 'evaluation', 'CHOICES',
           'has_forward_hooks',
           'run_blocks']
