from importlib.util import find_spec

from . import backbones, diffusion, distillers, layers, necks
from .transfer import transfer_softmax_weights, write_softmax_stand_in

__all__ = ['backbones', 'diffusion', 'distillers', 'layers', 'necks', 'transfer_softmax_weights',
           'write_softmax_stand_in']

if find_spec('mmdet') is not None:  # the RoI heads extend mmdet's; the rest of mmwf needs no mmdet
    from . import roi_heads  # noqa: F401

    __all__.append('roi_heads')
