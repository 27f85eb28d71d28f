from . import hooks, optimizers, strategies
from .resume import resume_checkpoint

__all__ = ['hooks', 'optimizers', 'strategies', 'resume_checkpoint']
