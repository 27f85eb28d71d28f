from .non_finite_loss import NonFiniteLossHook
from .show_predictions import ShowPredictionsHook

__all__ = ['NonFiniteLossHook', 'ShowPredictionsHook']
