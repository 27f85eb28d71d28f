from . import optimizers

__all__ = ['optimizers']
