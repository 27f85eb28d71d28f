import warnings
from importlib.util import find_spec

from mmwf.utils.stack import FIX

from . import backbones, diffusion, distillers, initializers, layers, necks
from .transfer import transfer_softmax_weights

__all__ = ['backbones', 'diffusion', 'distillers', 'initializers', 'layers', 'necks', 'transfer_softmax_weights']

if find_spec('mmdet') is not None:  # the RoI heads extend mmdet's; the rest of mmwf needs no mmdet
    try:
        from . import roi_heads  # noqa: F401
    except Exception as err:  # mmdet's own import checks failed (e.g. its mmcv version assertion)
        warnings.warn(f'mmwf: the RoI heads are unavailable because importing mmdet failed ({type(err).__name__}: '
                      f'{err}). {FIX}', stacklevel=2)
    else:
        __all__.append('roi_heads')
