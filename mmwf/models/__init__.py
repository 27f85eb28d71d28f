from . import backbones, distillers, layers, necks
from .transfer import transfer_softmax_weights

__all__ = ['backbones', 'distillers', 'layers', 'necks', 'transfer_softmax_weights']
