from . import hooks, optimizers

__all__ = ['hooks', 'optimizers']
