from .base import PlainBackbone
from .deit import DeiT
from .weightformer import WeightFormer

__all__ = ['PlainBackbone', 'WeightFormer', 'DeiT']
