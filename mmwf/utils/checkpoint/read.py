"""Reading checkpoints, in one place: every file mmwf reads weights (local ``.pth`` / ``.safetensors``, URLs,
mmengine's ``torchvision://`` / ``open-mmlab://`` / ``mmcls://`` names) goes through :func:`load_state_dict_file` or
:func:`load_weights_only`, weights-only, with errors that name the file, what is wrong and the fix.

torch >= 2.6 loads with ``weights_only=True``, which refuses every global that is not allow-listed. Checkpoints
written by mmwf runs hold none (:mod:`.content`); older mmengine training checkpoints hold ``HistoryBuffer`` objects
and numpy values, which mmwf's own reads allow for the duration of the read (:func:`safe_loading`) and nowhere
else.
"""
from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.error import URLError
from urllib.parse import urlparse

import numpy as np
import torch
from mmengine.logging import HistoryBuffer, print_log

from .errors import CheckpointError, check_exists, diagnose


def safe_checkpoint_globals() -> list:
    """The globals an mmengine checkpoint written before mmwf wrote plain checkpoints needs beyond torch's defaults.

    None of them runs code from the file: ``HistoryBuffer``'s own ``__setstate__`` stores the pickled data;
    ``_reconstruct``, ``scalar``, ``ndarray`` and the dtypes build numpy arrays and scalars from raw bytes; ``bytes``
    rebuilds the empty byte string that pickle protocol 2 writes for a zero-size array's data.
    """
    from numpy._core.multiarray import _reconstruct, scalar

    dtype_classes = [t for t in vars(np.dtypes).values() if isinstance(t, type) and issubclass(t, np.dtype)]
    return [HistoryBuffer, _reconstruct, scalar, np.ndarray, np.dtype, *dtype_classes, bytes]


@contextmanager
def safe_loading() -> Iterator[None]:
    """Allow :func:`safe_checkpoint_globals` in weights-only loads inside the block only."""
    with torch.serialization.safe_globals(safe_checkpoint_globals()):
        yield


def load_weights_only(path: str, map_location: str | torch.device = 'cpu', mmap: bool = False,
                      allowed: tuple = ()) -> object:
    """``torch.load(path, weights_only=True)`` with :func:`safe_loading` (and the classes ``allowed`` for this read,
    e.g. ``argparse.Namespace`` for DiT's checkpoints); a missing or unreadable file raises an error that names the
    file, what is wrong with it (empty, truncated, not a checkpoint, a refused object type) and the fix. ``mmap``
    maps the tensors instead of reading them (zip checkpoints)."""
    check_exists(path)
    try:
        with safe_loading(), torch.serialization.safe_globals(list(allowed)):
            return torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
    except Exception as err:
        raise (diagnose(path, err, [*safe_checkpoint_globals(), *allowed]) or err) from err


def checkpoint_problem(path: str, allowed: list | None = None) -> CheckpointError | None:
    """Why the local checkpoint ``path`` cannot be loaded weights-only, or None when it is complete: :func:`diagnose`,
    then a weights-only load (tensors mapped, not read) for what only loading finds (members written without CRCs,
    pickles the scan cannot read). ``allowed``: the globals allowed beyond torch's defaults. Defaults to None:
    :func:`safe_checkpoint_globals`, as mmwf's reads; ``[]`` checks what mmengine's own loader will accept."""
    allowed = safe_checkpoint_globals() if allowed is None else list(allowed)
    problem = diagnose(path, allowed=allowed)
    if problem is not None or path.endswith('.safetensors'):
        return problem
    try:
        with torch.serialization.safe_globals(allowed):
            torch.load(path, map_location='cpu', weights_only=True, mmap=_is_zip(path))
    except Exception as err:
        return diagnose(path, err, allowed) or CheckpointError(f'cannot read checkpoint {path!r}: {err}', str(err))
    return None


def _is_zip(path: str) -> bool:
    with open(path, 'rb') as f:
        return f.read(4) == b'PK\x03\x04'


def unwrap_state_dict(ckpt: object, path: str) -> dict[str, torch.Tensor]:
    """The tensors of a loaded checkpoint: at the top level or under ``state_dict`` / ``model`` / ``module``
    (mmengine, the WeightFormer and DeiT releases); anything else is a :class:`CheckpointError` naming ``path``."""
    for key in ('state_dict', 'model', 'module'):
        if isinstance(ckpt, dict) and isinstance(ckpt.get(key), dict):
            ckpt = ckpt[key]
            break
    if not isinstance(ckpt, dict) or not ckpt or not all(isinstance(v, torch.Tensor) for v in ckpt.values()):
        found = type(ckpt).__name__ if not isinstance(ckpt, dict) else (
            'an empty dict' if not ckpt else
            f"a dict whose entries are not all tensors: {', '.join(sorted(map(str, ckpt))[:5])}"
            f"{', ...' if len(ckpt) > 5 else ''}")
        raise CheckpointError(f'cannot read checkpoint {path!r}: it is not a state dict (found {found}; expected '
                              "names mapped to tensors, at the top level or under 'state_dict' / 'model'). Check "
                              'that the path points at model weights, not another kind of file.')
    return ckpt


def cached_download(url: str) -> str:
    """The local copy of ``url`` in torch's hub cache (``$TORCH_HOME/hub/checkpoints``), named by a hash of the whole
    URL and its file name (two links that both end in ``model.safetensors`` are two files), downloaded by the first
    process of each node while the others wait, as mmengine's loader does; a failure names the address."""
    from mmengine.dist import barrier, get_dist_info, get_local_rank
    from torch.hub import download_url_to_file, get_dir
    name = os.path.basename(urlparse(url).path) or 'checkpoint.pth'
    cached = os.path.join(get_dir(), 'checkpoints', f'{hashlib.sha256(url.encode()).hexdigest()[:16]}-{name}')
    if get_local_rank() == 0 and not os.path.isfile(cached):
        os.makedirs(os.path.dirname(cached), exist_ok=True)
        print_log(f'downloading {url} to {cached}', logger='current')
        try:
            download_url_to_file(url, cached, progress=False)  # into a temporary file, moved when complete
        except (URLError, OSError, ValueError) as err:
            raise FileNotFoundError(f'cannot download checkpoint {url!r}: {getattr(err, "reason", err)}. Check the '
                                    'address and the network, or download the file yourself and give its local '
                                    'path.') from err
    if get_dist_info()[1] > 1:
        barrier()
    return cached


HUB_FILE_URL = re.compile(r'https://huggingface\.co/(?P<repo>[^/]+/[^/]+)/(?:resolve|blob)/(?P<rev>[^/]+)/(?P<file>.+)')


def hub_download(url: str) -> str | None:
    """The local copy of a Hugging Face hub file link (``https://huggingface.co/<repo>/resolve/<revision>/<file>``)
    in the hub's own cache (``huggingface_hub.hf_hub_download``: shared with timm and ``from_pretrained``, offline
    mode and tokens honoured); None for any other address."""
    match = HUB_FILE_URL.fullmatch(urlparse(url)._replace(query='', fragment='').geturl())  # '?download=true' too
    if match is None:
        return None
    from huggingface_hub import hf_hub_download
    try:
        return hf_hub_download(match['repo'], match['file'], revision=match['rev'])
    except OSError as err:  # the hub's HTTP and not-in-cache errors are OSErrors
        raise FileNotFoundError(f'cannot download checkpoint {url!r} from the Hugging Face hub: {err}. Check the '
                                'address and the network (or HF_HUB_OFFLINE and the hub cache), or download the file '
                                'yourself and give its local path.') from err


def _named_url(scheme: str, name: str, table: dict) -> str:
    if name not in table:
        import difflib
        close = difflib.get_close_matches(name, list(table), n=3)
        raise KeyError(f'{scheme}{name} is not a checkpoint mmengine knows; '
                       + (f'did you mean {" or ".join(close)}?' if close else
                          f'{scheme} names: {", ".join(sorted(table)[:12])}{" ..." if len(table) > 12 else ""}'))
    return table[name]


def resolve_address(address: str) -> str:
    """The local file behind ``address``: a Hugging Face hub link in the hub's cache (:func:`hub_download`), another
    URL downloaded (:func:`cached_download`), mmengine's ``torchvision://``
    (``modelzoo://``), ``open-mmlab://`` (``openmmlab://``) and ``mmcls://`` names looked up in mmengine's tables
    and downloaded; a local path as it is."""
    from mmengine.runner import checkpoint as mmengine_checkpoint
    scheme, _, name = address.partition('://')
    if not name:
        return os.path.expanduser(address)
    if scheme in ('http', 'https'):
        return hub_download(address) or cached_download(address)
    if scheme in ('torchvision', 'modelzoo'):
        return cached_download(_named_url(f'{scheme}://', name, mmengine_checkpoint.get_torchvision_models()))
    if scheme in ('open-mmlab', 'openmmlab'):
        name = mmengine_checkpoint.get_deprecated_model_names().get(name, name)
        url = _named_url(f'{scheme}://', name, mmengine_checkpoint.get_external_models())
        if url.startswith(('http://', 'https://')):
            return cached_download(url)
        return os.path.join(mmengine_checkpoint._get_mmengine_home(), url)
    if scheme == 'mmcls':
        return cached_download(_named_url('mmcls://', name, mmengine_checkpoint.get_mmcls_models()))
    raise ValueError(f'cannot read checkpoint {address!r}: mmwf reads local files, http(s):// URLs and mmengine\'s '
                     "torchvision:// / open-mmlab:// / mmcls:// names; copy the file to a local path.")


def load_checkpoint_file(address: str, map_location: str | torch.device = 'cpu') -> object:
    """The loaded checkpoint at ``address`` (see :func:`resolve_address`): ``.safetensors`` read as safetensors,
    anything else weights-only (:func:`load_weights_only`); ``mmcls://`` keys converted as mmengine converts them."""
    path = resolve_address(address)
    check_exists(path)
    if path.endswith('.safetensors'):
        from safetensors.torch import load_file
        try:
            return load_file(path, device=str(map_location))
        except Exception as err:
            raise (diagnose(path, err) or err) from err
    ckpt = load_weights_only(path, map_location)
    if address.startswith('mmcls://'):
        from mmengine.runner.checkpoint import _process_mmcls_checkpoint
        ckpt = _process_mmcls_checkpoint(ckpt)
    return ckpt


def load_state_dict_file(address: str, map_location: str | torch.device = 'cpu') -> dict[str, torch.Tensor]:
    """The tensors of the checkpoint at ``address`` (:func:`load_checkpoint_file`), unwrapped by
    :func:`unwrap_state_dict`."""
    return unwrap_state_dict(load_checkpoint_file(address, map_location), address)


# where a backbone's tensors sit in a whole-model checkpoint: a distiller's student, or a detector / segmentor /
# classifier (mmdet, mmseg, mmpretrain all name the module ``backbone``)
WHOLE_MODEL_PREFIXES = ('student.backbone.', 'backbone.')


def modules_of(keys: list[str]) -> str:
    """The top modules ``keys`` are under, as ``name.*`` (a distiller's two levels), for messages."""
    names = sorted({'.'.join(k.split('.')[:2 if k.startswith(('student.', 'teacher.')) else 1]) for k in keys})
    return ', '.join(f'{n}.*' for n in names[:6]) + (' ...' if len(names) > 6 else '')


def read_state_dict(path: str, prefix: str | None = None, hint: str = '',
                    map_location: str | torch.device = 'cpu') -> dict[str, torch.Tensor]:
    """:func:`load_state_dict_file`, keeping only the keys under ``prefix`` (stripped; with or without its dot, as
    mmengine's ``Pretrained``). Without a prefix, a whole-model checkpoint is reduced to its backbone: the
    ``student.backbone.`` keys of a distiller, else the ``backbone.`` keys of a detector, segmentor or classifier
    (logged). ``hint`` is added to the not-found error (where to get the weights)."""
    try:
        state = load_state_dict_file(path, map_location)
    except FileNotFoundError as err:
        raise FileNotFoundError(f'{err} {hint}'.strip()) from None
    if prefix is None:
        return whole_model_part(state, path)
    if prefix and not prefix.endswith('.'):
        prefix += '.'
    if not prefix:
        return state
    kept = {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}
    if not kept:
        raise CheckpointError(f'cannot read checkpoint {path!r}: it has no keys under prefix {prefix!r} (its keys '
                              f'start with {modules_of(list(state))}). Set the init_cfg\'s prefix to where the '
                              "backbone's keys are, or leave it out.")
    return kept


def whole_model_part(state: dict[str, torch.Tensor], source: str) -> dict[str, torch.Tensor]:
    """A backbone's tensors from ``state``: the ``student.backbone.`` keys of a distiller, else the ``backbone.``
    keys of a detector, segmentor or classifier (stripped and logged, naming ``source``), else ``state`` itself."""
    prefix = next((p for p in WHOLE_MODEL_PREFIXES if any(k.startswith(p) for k in state)), None)
    if prefix is None:
        return state
    kept = {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}
    others = [k for k in state if not k.startswith(prefix)]
    print_log(f'{source}: a whole-model checkpoint; using its {len(kept)} {prefix!r} tensors'
              + (f', not the {len(others)} of {modules_of(others)}' if others else ''), logger='current')
    return kept
