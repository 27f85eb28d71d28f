from . import deit_study  # noqa: F401  (registers the study's DeiTs with timm)
from .base import PlainBackbone
from .deit import DeiT
from .weightformer import WeightFormer

__all__ = ['PlainBackbone', 'WeightFormer', 'DeiT']
