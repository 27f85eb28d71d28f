"""The benchmarks of ``tools/analysis/benchmark.py``, one module a sub-command: each has ``add_arguments(parser)``
and ``run(args)`` (``args.device``, ``args.threads`` and ``args.script``, the tool's path for its fresh-process
memory probes, are the tool's). Every timing goes through :mod:`mmwf.analysis.timing` (synchronised, interleaved
rounds)."""
from . import engine_split, generation, inference, kernels, onnx, train, workload

# sub-command -> its module
BENCHMARKS = {'inference': inference, 'kernels': kernels, 'train': train, 'generation': generation,
              'workload': workload, 'engine-split': engine_split, 'onnx': onnx}

__all__ = ['BENCHMARKS']
