"""Helpers shared by our backbones: running blocks, strict checkpoint loading."""
from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.checkpoint as cp
from mmengine.logging import print_log

from mmwf.utils.checkpoint import load_state_dict_file


def run_blocks(blocks: nn.ModuleList, x: torch.Tensor, hw: tuple[int, int],
               with_cp: bool = False) -> Iterator[tuple[int, torch.Tensor]]:
    """Apply ``blocks`` in turn to tokens x (B, N, C) on grid ``hw``, yielding (index, output) after each;
    ``with_cp`` checkpoints activations while training."""
    for i, block in enumerate(blocks):
        if with_cp and block.training and x.requires_grad:
            x = cp.checkpoint(block, x, hw, use_reentrant=False)
        else:
            x = block(x, hw)
        yield i, x


def resolve_arch(arch: str | dict, table: dict[str, dict], name: str) -> dict:
    """An ``arch`` of a backbone's table (by name) or a custom dict with the same keys."""
    keys = sorted(next(iter(table.values())))
    if isinstance(arch, str):
        if arch.lower() not in table:
            raise ValueError(f'unknown {name} arch {arch!r}; choose from {sorted(table)} or pass a dict with '
                             f'{", ".join(keys)}')
        return table[arch.lower()]
    missing = sorted(set(keys) - set(arch))
    if missing:
        raise ValueError(f'custom {name} arch {dict(arch)} lacks {missing}; a custom arch needs {", ".join(keys)}, '
                         f'e.g. {table[next(iter(table))]}')
    return arch


def resolve_out_indices(out_indices: int | Sequence[int], depth: int, name: str) -> list[int]:
    """``out_indices`` as block indices in [0, depth) (negative ones count from the end); out of range is an
    error, not a silent wrap-around."""
    indices = [out_indices] if isinstance(out_indices, int) else list(out_indices)
    bad = [i for i in indices if not -depth <= i < depth]
    if bad:
        raise ValueError(f'out_indices {bad} out of range for a {name} of {depth} blocks: use 0..{depth - 1} '
                         f'(or -{depth}..-1 from the end)')
    return [i % depth for i in indices]


def image_grid(x: torch.Tensor, stem: nn.Conv2d, min_grid: int, name: str) -> tuple[int, int]:
    """The patch grid (H/p, W/p) of images ``x`` (B, C, H, W) for a backbone whose stem is ``stem`` (a conv with
    kernel = stride = p); a clear error when the batch is not images the stem can take."""
    p = stem.stride[0]
    if x.dim() != 4 or x.shape[1] != stem.in_channels:
        raise ValueError(f'{name} needs images (B, {stem.in_channels}, H, W); got a tensor of shape '
                         f'{tuple(x.shape)}. Add the batch dimension or convert the images to '
                         f'{stem.in_channels} channels.')
    h, w = x.shape[-2] // p, x.shape[-1] // p
    if h < min_grid or w < min_grid:
        raise ValueError(f'{name} needs images with H, W >= {min_grid * p} ({min_grid} x {min_grid} patches of {p}); '
                         f'got shape {tuple(x.shape)}. Resize or pad the input.')
    dtype = stem.weight.dtype
    if x.dtype != dtype and not (x.is_floating_point() and torch.is_autocast_enabled(x.device.type)):
        raise ValueError(f'{name} has {dtype} weights but got {x.dtype} images. Normalise the images to floats '
                         f'of the weights\' dtype, or run under mixed precision (torch.autocast; in a config '
                         "optim_wrapper.type='AmpOptimWrapper') instead of casting the input.")
    return h, w


def resample_grid_tokens(tokens: torch.Tensor, grid: int, hw: tuple[int, int]) -> torch.Tensor:
    """Tokens (1, grid*grid, C) of a square grid (a position table) -> (1, H*W, C) on ``hw``, bicubic."""
    x = tokens.reshape(1, grid, grid, -1).permute(0, 3, 1, 2).float()
    x = F.interpolate(x, size=hw, mode='bicubic', align_corners=False)
    return x.permute(0, 2, 3, 1).flatten(1, 2).to(tokens.dtype)


def _listing(keys: list[str], limit: int = 20) -> str:
    more = f' ... and {len(keys) - limit} more' if len(keys) > limit else ''
    return ', '.join(keys[:limit]) + more


def load_backbone_checkpoint(model: nn.Module, path: str, prefix: str | None = None,
                             convert: callable | None = None) -> None:
    """Load ``path`` into ``model`` strictly; any mismatch is an error that lists the keys.

    Args:
        model: the backbone.
        path: ``.pth`` (weights-only) or ``.safetensors``; tensors at the top level or under
            ``state_dict`` / ``model``.
        prefix: keep only keys under this prefix (e.g. ``'backbone.'`` for a detector checkpoint) and strip
            it. Without it, a checkpoint whose keys all start with ``backbone.`` is unwrapped automatically.
        convert: optional function mapping the checkpoint's state dict to our names and shapes.

    Keys under a top-level name the model was built without (a 1000-class ``head`` in a dense backbone,
    ``norm`` with ``final_norm=False``) are skipped and logged; every other unexpected, missing or
    mis-shaped key raises.
    """
    try:
        state = load_state_dict_file(path)
    except FileNotFoundError as err:
        hint = getattr(model, 'WEIGHTS_HINT', '')
        raise FileNotFoundError(f'{err} {hint} To train from scratch instead, set the backbone\'s '
                                'init_cfg=None.') from None
    if prefix is None and state and all(k.startswith('backbone.') for k in state):
        prefix = 'backbone.'
    if prefix:
        state = {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}
        if not state:
            raise ValueError(f'{path!r} has no keys under prefix {prefix!r}.')
    if convert is not None:
        state = convert(state)
    own = model.state_dict()
    own_tops = {k.split('.')[0] for k in own}
    skipped = [k for k in state if k.split('.')[0] not in own_tops]
    for k in skipped:
        del state[k]
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    mismatched = sorted(f'{k}: checkpoint {tuple(state[k].shape)} vs model {tuple(own[k].shape)}'
                        for k in set(own) & set(state) if state[k].shape != own[k].shape)
    if missing or unexpected or mismatched:
        lines = [f'{path!r} does not match {type(model).__name__} (is it a checkpoint of this architecture '
                 'and size?).']
        if missing:
            lines.append(f'missing keys ({len(missing)}): {_listing(missing)}')
        if unexpected:
            lines.append(f'unexpected keys ({len(unexpected)}): {_listing(unexpected)}')
        if mismatched:
            lines.append(f'shape mismatches ({len(mismatched)}): {_listing(mismatched)}')
        raise ValueError('\n'.join(lines))
    model.load_state_dict(state, strict=True)
    note = f'; skipped {len(skipped)} keys of modules this model omits: {_listing(skipped, 5)}' if skipped else ''
    print_log(f'loaded {len(state)} tensors into {type(model).__name__} from {path}{note}', logger='current')


class StrictPretrainedMixin:
    """``init_weights`` that loads ``init_cfg=dict(type='Pretrained', checkpoint=..., prefix=...)`` through
    :func:`load_backbone_checkpoint` (strict, with key lists) instead of mmengine's lenient loader; any other
    ``init_cfg`` goes to ``BaseModule.init_weights``. Put it before ``BaseModule`` in the bases."""

    def init_weights(self) -> None:
        if isinstance(self.init_cfg, dict) and self.init_cfg.get('type') == 'Pretrained':
            load_backbone_checkpoint(self, self.init_cfg['checkpoint'], prefix=self.init_cfg.get('prefix'))
            self._is_init = True
        else:
            super().init_weights()
