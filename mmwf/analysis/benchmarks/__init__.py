"""The benchmarks of ``tools/analysis/benchmark.py``, one module a sub-command: each has ``add_arguments(parser)``
and ``run(args)`` (``args.device``, ``args.threads`` and ``args.script``, the tool's path for its fresh-process
memory probes, are the tool's). Every timing goes through :mod:`mmwf.analysis.timing` (synchronised, interleaved
rounds)."""
from . import (
               engine_split_benchmark,
               generation_benchmark,
               inference_benchmark,
               kernels_benchmark,
               onnx_benchmark,
               train_benchmark,
               workload_benchmark,
)

# sub-command -> its module
BENCHMARKS = {'inference': inference_benchmark, 'kernels': kernels_benchmark, 'train': train_benchmark,
              'generation': generation_benchmark, 'workload': workload_benchmark,
              'engine-split': engine_split_benchmark, 'onnx': onnx_benchmark}

__all__ = ['BENCHMARKS']
