"""Dataset checks (``checks``, needs mmengine only), the generation datasets (``generation``) and the synthetic demo
data generator (``synthetic``, needs OpenCV)."""
from importlib.util import find_spec

from .checks import (
    CheckAnnotations,
    annotation_file_error,
    check_classes,
    check_dataset_paths,
    configure_annotation_checks,
    head_class_counts,
)
from .generation_data import ClassFolderImages, LatentCacheDataset, SamplingLabels, center_crop_arr, class_folder

__all__ = ['CheckAnnotations', 'annotation_file_error', 'check_classes', 'check_dataset_paths',
           'configure_annotation_checks', 'head_class_counts', 'ClassFolderImages', 'LatentCacheDataset',
           'SamplingLabels', 'center_crop_arr', 'class_folder']

if find_spec('cv2') is not None:
    from .synthetic import generate, make_image, write_ade, write_classification, write_coco

    __all__ += ['generate', 'make_image', 'write_coco', 'write_ade', 'write_classification']
