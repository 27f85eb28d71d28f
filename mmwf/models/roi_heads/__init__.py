from .vitdet_cascade_roi_head import ScaleGradient, ViTDetCascadeRoIHead

__all__ = ['ScaleGradient', 'ViTDetCascadeRoIHead']
