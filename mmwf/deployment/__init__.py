from .onnx import ExportWrapper, check_onnx, export_facts, export_onnx, exportable_model

__all__ = ['ExportWrapper', 'exportable_model', 'export_facts', 'export_onnx', 'check_onnx']
