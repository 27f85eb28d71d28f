from .detector import CascadeMaskRCNNGraph, DetectorSession, compare_detections, export_detector, pytorch_detections
from .onnx import (
    ExportWrapper,
    ImageSession,
    check_onnx,
    export_facts,
    export_onnx,
    exportable_model,
    graph_metadata,
    preprocessed_sizes,
    write_metadata,
)
from .segmentor import SegmentorSession, label_agreement, pytorch_label_map

__all__ = ['ExportWrapper', 'exportable_model', 'export_facts', 'export_onnx', 'check_onnx', 'CascadeMaskRCNNGraph',
           'export_detector', 'DetectorSession', 'compare_detections', 'SegmentorSession', 'label_agreement',
           'pytorch_detections', 'pytorch_label_map', 'ImageSession', 'graph_metadata', 'preprocessed_sizes',
           'write_metadata']
