from . import hooks, optimizers
from .resume import resume_checkpoint

__all__ = ['hooks', 'optimizers', 'resume_checkpoint']
