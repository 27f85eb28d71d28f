from . import hooks, optimizers, strategies
from .resume import resume_checkpoint
from .runner import ImageSizeRunner

__all__ = ['hooks', 'optimizers', 'strategies', 'resume_checkpoint', 'ImageSizeRunner']
