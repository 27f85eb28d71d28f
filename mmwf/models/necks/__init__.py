from .simple_fpn import SimpleFeaturePyramid
from .vit_baseline_pyramid import ViTBaselinePyramid

__all__ = ['SimpleFeaturePyramid', 'ViTBaselinePyramid']
