"""mmwf: attention-free, linear-time vision backbones for OpenMMLab.

``import mmwf`` (or ``custom_imports = dict(imports=['mmwf'])`` in a config) checks the installed stack (and
warns, never raises: the train / test tools refuse a broken stack), makes mmengine checkpoints load
weights-only, and registers every public module in mmengine's root registries, so any MMLab project finds them
under its own default scope. ``mmwf.analysis`` (counting, benchmarks) is imported by the tools that use it.
"""
from .utils import check_stack, enable_safe_mmengine_checkpoints
from .version import __version__

check_stack(warn=True)
enable_safe_mmengine_checkpoints()

from . import datasets, engine, evaluation, models  # noqa: E402  (registers modules)

__all__ = ['__version__', 'datasets', 'models', 'engine', 'evaluation']
