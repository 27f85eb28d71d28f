from .synthetic import generate, make_image, write_ade, write_classification, write_coco, write_softmax_deit

__all__ = ['generate', 'make_image', 'write_coco', 'write_ade', 'write_classification', 'write_softmax_deit']
