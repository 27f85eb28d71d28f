from .complexity import count_flops, flop_analyzer, released_order
from .dynamic_strength import dynamic_layers, dynamic_strength, save_strength_png, strength_table
from .erf import area_ratio, effective_receptive_field, outside_fraction, save_erf_png
from .inputs import backbone_config, build_backbone, load_images
from .workload import MODES, Workload

__all__ = ['flop_analyzer', 'count_flops', 'released_order', 'dynamic_layers', 'dynamic_strength',
           'strength_table', 'save_strength_png', 'effective_receptive_field', 'area_ratio', 'outside_fraction',
           'save_erf_png', 'backbone_config', 'build_backbone', 'load_images', 'Workload', 'MODES']
