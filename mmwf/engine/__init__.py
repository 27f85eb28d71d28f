from . import hooks, optimizers
from .runner import StrictRunner

__all__ = ['hooks', 'optimizers', 'StrictRunner']
