"""mmwf's models. ``mmwf.models.roi_heads`` (:class:`ViTDetCascadeRoIHead`) extends mmdet's heads and so imports
mmdet: it registers when imported, as the Cascade configs do (``custom_imports``); nothing else in mmwf imports
mmdet."""
from . import backbones, diffusion, distillers, initializers, layers, necks
from .transfer import transfer_softmax_weights

__all__ = ['backbones', 'diffusion', 'distillers', 'initializers', 'layers', 'necks', 'transfer_softmax_weights']
