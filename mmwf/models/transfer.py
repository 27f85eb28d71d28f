"""Initialise a linear-attention DeiT from a softmax DeiT checkpoint (docs/linear_attention.md section 8).

Recipes (the transfer paper's names):

- ``copy``: per block the attention projections, ``attn.qkv`` (queries, keys, values) and, with
  ``copy_proj``, ``attn.proj``;
- ``mlp_copy``: per block ``mlp.fc1`` and ``mlp.fc2`` only;
- ``full_copy``: every tensor the student shares with softmax DeiT: patch embedding, position embedding,
  class token (students that have one), norms, attention projections, MLPs, final norm, head (classifiers).

"Random" is no transfer (``init_cfg=None``). Tensors softmax DeiT does not have (MHLA's ``lepe`` and
``block_mixing``, TTT's ``w1``, ``w2``, ``w3``) keep their initialisation; TTT's ``qkv`` takes the checkpoint's
3C rows into its first 3C rows (its 3d conv-head rows stay), and its wider ``proj`` is not copied. A position
table of another grid is resampled (bicubic) to the student's pretraining grid, class slot kept; students
without a class token never read that slot. Every tensor copied, partly copied, resampled, kept or skipped is
logged.
"""
from __future__ import annotations

import logging
import re

import torch
import torch.nn as nn
from mmengine.logging import print_log

from mmwf.models.layers import resample_pos_embed
from mmwf.registry import WEIGHT_INITIALIZERS
from mmwf.utils.checkpoint import read_state_dict

RECIPES = {
    'copy': r'blocks\.\d+\.attn\.qkv\.',
    'mlp_copy': r'blocks\.\d+\.mlp\.',
    'full_copy': r'',
}
# student tensors absent from softmax DeiT: the new operators' and layer scale's
OPERATOR_EXTRAS = re.compile(r'blocks\.\d+\.(attn\.(?!qkv\.|proj\.)|gamma[12]$)')


def shape_fits(name: str, src: torch.Size, dst: torch.Size, dim: int) -> bool:
    """Whether a checkpoint tensor can initialise ours: same shape, or one of the three known differences of
    the same width ``dim``: another position grid, extra qkv rows (TTT), a wider output projection (TTT)."""
    if src == dst:
        return True
    if name == 'pos_embed':
        return len(src) == 3 and src[-1] == dst[-1] == dim
    if '.attn.qkv.' in name:
        return src[1:] == dst[1:] and src[0] == 3 * dim < dst[0]
    if name.endswith('.attn.proj.weight'):
        return src[0] == dst[0] == dim and src[1] == dim < dst[1]
    return False


def transfer_softmax_weights(model: nn.Module, checkpoint: str, recipe: str, copy_proj: bool = True,
                             prefix: str | None = None) -> dict[str, list[str]]:
    """Copy the ``recipe``'s tensors of the softmax DeiT ``checkpoint`` into the DeiT ``model`` in place.

    Args:
        model (nn.Module): our ``DeiT`` backbone with any attention operator.
        checkpoint (str): a DeiT / timm checkpoint (``.pth``, weights-only, or ``.safetensors``; tensors at the top
            level or under ``model`` / ``state_dict``).
        recipe (str): ``'copy'``, ``'mlp_copy'`` or ``'full_copy'``.
        copy_proj (bool): ``copy`` also takes ``attn.proj`` (where the shapes agree). Defaults to True.
        prefix (str, optional): keep only checkpoint keys under this prefix and strip it (e.g. ``'backbone'``);
            without it a whole-model checkpoint gives its ``backbone.`` (``student.backbone.``) keys. Defaults to
            None.

    Returns:
        ``{'copied', 'partial', 'resampled', 'kept', 'skipped'}``: student tensor names (``partial`` and
        ``kept`` with the reason), and checkpoint keys left unused (``skipped``).

    Raises:
        ValueError: unknown recipe, or the checkpoint lacks tensors the recipe needs (it lists them, and the
            checkpoint keys a softmax DeiT does not have).
    """
    if recipe not in RECIPES:
        raise ValueError(f'unknown transfer recipe {recipe!r}; choose from {sorted(RECIPES)} '
                         "(for 'random', set init_cfg=None)")
    state = read_state_dict(checkpoint, prefix, f'{getattr(model, "WEIGHTS_HINT", "")} For the Random init, set '
                            'init_cfg=None.')
    pattern = RECIPES[recipe] + (r'|blocks\.\d+\.attn\.proj\.' if recipe == 'copy' and copy_proj else '')
    own = model.state_dict()
    selected = [k for k in own if re.match(pattern, k)]
    needed = [k for k in selected if not OPERATOR_EXTRAS.match(k) and not k.startswith('head.')]
    missing = [k for k in needed if k not in state]
    if missing:
        known = {re.sub(r'blocks\.\d+\.', 'blocks.N.', k) for k in own if not OPERATOR_EXTRAS.match(k)}
        unexpected = sorted({re.sub(r'blocks\.\d+\.', 'blocks.N.', k) for k in state}
                            - known - {'cls_token', 'head.weight', 'head.bias', 'norm.weight', 'norm.bias'})
        raise ValueError(f'{checkpoint!r} is not a softmax DeiT checkpoint of this size: recipe {recipe!r} needs '
                         f'{len(missing)} tensors it lacks: {", ".join(missing[:12])}'
                         + (f'; it has keys DeiT does not: {", ".join(unexpected[:12])}' if unexpected else ''))
    C = own['patch_embed.proj.weight'].shape[0]
    bad = [f'{k}: checkpoint {tuple(state[k].shape)} vs {tuple(own[k].shape)}' for k in selected
           if k in state and not shape_fits(k, state[k].shape, own[k].shape, C)]
    if bad:
        raise ValueError(f'{checkpoint!r} has another DeiT size than this model: {"; ".join(bad[:8])}')
    # TTT's proj reads C + d channels: it is kept whole (its bias too)
    reshaped = {k.rsplit('.', 1)[0] for k in selected
                if '.attn.proj.' in k and k in state and state[k].shape != own[k].shape}
    report: dict[str, list[str]] = dict(copied=[], partial=[], resampled=[], kept=[], skipped=[])
    used = set()
    with torch.no_grad():
        for name, param in own.items():
            src = state.get(name)
            if name not in selected:
                report['kept'].append(f'{name} (not in {recipe})')
                continue
            if src is None:
                report['kept'].append(f'{name} (new in this operator)')
                continue
            if name.rsplit('.', 1)[0] in reshaped:
                report['kept'].append(f'{name} (checkpoint {tuple(src.shape)} vs {tuple(param.shape)}; the module '
                                      'has another shape)')
                continue
            if src.shape == param.shape:
                param.copy_(src)
                report['copied'].append(name)
            elif name == 'pos_embed':  # another grid (shape_fits checked the width)
                param.copy_(resample_pos_embed(src, int(round((param.shape[1] - 1) ** 0.5))))
                report['resampled'].append(f'{name} ({src.shape[1] - 1} -> {param.shape[1] - 1} patch positions)')
            else:  # qkv of an operator with extra rows (TTT)
                param[:src.shape[0]].copy_(src)
                report['partial'].append(f'{name} (rows 0:{src.shape[0]} of {param.shape[0]})')
            used.add(name)
    report['skipped'] = sorted(set(state) - used)
    for kind, names in report.items():  # every tensor at DEBUG (about 200 lines for DeiT-B); the counts at INFO
        for name in names:
            print_log(f'transfer {recipe}: {kind} {name}', logger='current', level=logging.DEBUG)
    print_log(f'transfer {recipe} from {checkpoint}: ' + ', '.join(f'{len(v)} {k}' for k, v in report.items()),
              logger='current')
    return report


@WEIGHT_INITIALIZERS.register_module(name='SoftmaxTransfer')
class SoftmaxTransferInit:
    """Initializer: ``init_cfg=dict(type='SoftmaxTransfer', checkpoint=..., recipe=...)`` on a DeiT backbone runs
    :func:`transfer_softmax_weights`.

    Args:
        checkpoint (str): a softmax DeiT / timm checkpoint.
        recipe (str): ``'copy'``, ``'mlp_copy'`` or ``'full_copy'``.
        copy_proj (bool): ``copy`` also takes ``attn.proj``. Defaults to True.
        prefix (str, optional): keep only the checkpoint keys under this prefix. Defaults to None.
    """

    def __init__(self, checkpoint: str, recipe: str, copy_proj: bool = True, prefix: str | None = None) -> None:
        self.checkpoint, self.recipe, self.copy_proj, self.prefix = checkpoint, recipe, copy_proj, prefix

    def __call__(self, module: nn.Module) -> None:
        transfer_softmax_weights(module, self.checkpoint, self.recipe, self.copy_proj, self.prefix)
