"""mmwf: attention-free, linear-time vision backbones for OpenMMLab.

``import mmwf`` (or ``custom_imports = dict(imports=['mmwf'])`` in a config) checks the installed stack (and
warns, never raises: the train / test tools refuse a broken stack) and registers mmwf's modules under their own
names. It changes nothing else in the process: mmengine's checkpoint loaders and file backends, torch's
weights-only allow-list and every existing registry entry stay as they were. What mmwf guarantees for checkpoints
(weights-only reads, strict loads, atomic writes) it does in its own runs (hooks its configs select), tools and
functions. ``mmwf.analysis`` (counting, benchmarks) is imported by the tools that use it.
"""
from .utils import check_stack
from .version import __version__

check_stack(warn=True)

from . import datasets, engine, evaluation, models  # noqa: E402  (registers modules)

__all__ = ['__version__', 'datasets', 'models', 'engine', 'evaluation']
