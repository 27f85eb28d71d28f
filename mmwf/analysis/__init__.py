"""Analysis of backbones and their task models: params / FLOPs, effective receptive field, dynamic strength, and the
workloads the benchmark tools time. Not imported by ``import mmwf``: the tools import what they use."""
from mmwf.configs import build_task_model, task_model_config

from .complexity import (
                         classifier_counts,
                         count_flops,
                         crop_size,
                         flop_analyzer,
                         generator_counts,
                         released_order,
                         task_model_counts,
)
from .dynamic_strength import dynamic_layers, dynamic_strength, save_strength_png, strength_table
from .erf import area_ratio, effective_receptive_field, outside_fraction, save_erf_png
from .images import DEMO_IMAGES, load_images
from .models import backbone_config, build_backbone, build_classifier, classifier_config, imagenet_model_name
from .workload import MODES, Workload

__all__ = ['flop_analyzer', 'count_flops', 'released_order', 'classifier_counts', 'task_model_counts', 'crop_size',
           'generator_counts',
           'dynamic_layers', 'dynamic_strength', 'strength_table', 'save_strength_png', 'effective_receptive_field',
           'area_ratio', 'outside_fraction', 'save_erf_png', 'DEMO_IMAGES', 'load_images', 'imagenet_model_name',
           'backbone_config', 'build_backbone', 'build_classifier', 'classifier_config',
           'build_task_model', 'task_model_config', 'Workload', 'MODES']
