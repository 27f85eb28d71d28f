from .deit import DeiT, SoftmaxAttention
from .weightformer import WeightFormer

__all__ = ['WeightFormer', 'DeiT', 'SoftmaxAttention']
