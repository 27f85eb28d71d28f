"""What can be wrong with a checkpoint file, found once: the error types and the one diagnosis of a file that
cannot be read (missing, empty, truncated, damaged, not a checkpoint, holding objects weights-only loading refuses).
"""
from __future__ import annotations

import os
import re
import zipfile

import torch

REFETCH = 'Download or copy the file again.'
CLEAN = ('If it is a training checkpoint you trust, convert it once with '
         '`python tools/model_converters/clean_checkpoint.py SRC DST --trust-source`.')


class CheckpointError(ValueError):
    """A checkpoint that cannot be used; the message names the file, what was found and the fix, and ``what``
    holds what was found alone."""

    def __init__(self, message: str, what: str | None = None) -> None:
        super().__init__(message)
        self.what = what or message


class UnsafeCheckpointError(CheckpointError):
    """A checkpoint holding a Python object that weights-only loading refuses (unpickling it could run code)."""


class CheckpointMismatchError(CheckpointError):
    """A readable checkpoint that does not fit the model; the message names the file and lists the keys."""


def check_exists(path: str) -> None:
    """FileNotFoundError naming ``path`` and the folder relative paths are taken from, unless it is a file."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f'checkpoint not found: {path!r}. Check the path (relative paths are '
                                f'taken from {os.getcwd()!r}).')


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[-1].split('. ')[0] if text else type(err).__name__


def _refused_globals(path: str, allowed: list) -> list[str]:
    """The globals of a torch zip checkpoint that weights-only loading refuses, given the extra ``allowed`` ones."""
    names = {f'{g.__module__}.{g.__qualname__}' for g in allowed}
    return [g for g in torch.serialization.get_unsafe_globals_in_checkpoint(path) if g not in names]


def diagnose(path: str, err: BaseException | None = None, allowed: list | None = None) -> CheckpointError | None:
    """Why the checkpoint file ``path`` cannot be read, as one :class:`CheckpointError` naming the file, what was
    found and the fix; None when nothing is wrong. Found without unpickling: empty files, files that are no
    checkpoint, damaged zip archives (members checked against their CRCs), objects weights-only loading refuses
    (beyond torch's defaults and ``allowed``). ``err``, the error a load raised, is reported when nothing else
    explains it. A member written without a CRC (``torch.serialization.set_crc32_options(False)``) cannot be
    checked that way: such a file is damaged when loading it fails (the caller passes that ``err``)."""
    check_exists(path)
    size = os.path.getsize(path)
    with open(path, 'rb') as f:
        head = f.read(12)
    detail = _first_line(err) if err is not None else ''
    what, fix, kind = None, REFETCH, CheckpointError
    if size == 0:
        what = 'the file is empty (0 bytes)'
    elif path.endswith('.safetensors'):
        if err is not None:
            what = f'its safetensors header is corrupt or the file is truncated ({detail}; {size} bytes)'
    elif not head.startswith(b'PK\x03\x04') and head[:1] != b'\x80':  # neither zip (torch >= 1.6) nor pickle
        what = f'it is not a PyTorch or safetensors checkpoint (no zip archive or pickle; it starts with {head!r})'
        fix = 'Check that the path points at the weights file (.pth / .safetensors).'
    elif head.startswith(b'PK\x03\x04'):
        truncated = f'{REFETCH} A run killed while saving leaves such a file: resume from an earlier checkpoint.'
        try:
            with zipfile.ZipFile(path) as archive:
                bad = archive.testzip()
                unchecked = bad is not None and archive.getinfo(bad).CRC == 0
        except (zipfile.BadZipFile, EOFError, RuntimeError, OSError) as zip_err:
            what, fix = f'the zip archive is truncated or damaged ({size} bytes: {_first_line(zip_err)})', truncated
        else:
            if bad and not unchecked:
                what, fix = f'the zip archive member {bad} is damaged (CRC mismatch; {size} bytes)', truncated
            elif bad and err is not None:
                what, fix = f'the zip archive is damaged ({size} bytes: {detail})', truncated
            elif err is None:
                try:
                    refused = _refused_globals(path, allowed or [])
                except Exception:  # opcodes the scanner does not know (pickle protocol 5): loading will tell
                    refused = []
                if refused:
                    kind, fix = UnsafeCheckpointError, CLEAN
                    what = f'it holds a Python object that weights-only loading refuses ({", ".join(refused[:4])})'
    if what is None and err is not None:
        if 'Weights only load failed' in str(err) or 'Unsupported global' in str(err):
            refused = re.search(r'GLOBAL (\S+) was not an allowed global|Unsupported operand \d+', str(err))
            kind, fix = UnsafeCheckpointError, CLEAN
            what = ('it holds a Python object that weights-only loading refuses '
                    f'({(refused.group(1) or refused.group(0)) if refused else detail})')
        else:
            what = f'the pickle stream is truncated or damaged ({size} bytes: {detail})'
    if what is None:
        return None
    return kind(f'cannot read checkpoint {path!r}: {what}. {fix}', what)
