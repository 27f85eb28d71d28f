from .onnx import ExportWrapper, check_onnx, export_onnx, exportable_model

__all__ = ['ExportWrapper', 'exportable_model', 'export_onnx', 'check_onnx']
