from .non_finite_loss import NonFiniteLossHook

__all__ = ['NonFiniteLossHook']
