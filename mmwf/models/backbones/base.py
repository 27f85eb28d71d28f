"""The skeleton shared by mmwf's plain (single-scale, ViT-like) backbones.

A plain backbone is a patch-embedding stem, a stack of blocks on one token grid, and an optional final norm and
ImageNet head. :class:`PlainBackbone` holds all of that except what a family differs in: its extra stem
(:meth:`PlainBackbone.embed`), its blocks and its pooling for classification. As detectron2's ``vit.py`` /
``utils.py`` and timm's ``vision_transformer.py`` split the same pieces.
"""
from __future__ import annotations

from collections import deque
from collections.abc import Sequence

import torch
import torch.nn as nn
from mmengine.logging import print_log
from mmengine.model import BaseModule

from mmwf.models.initializers import init_weights_pretrained_last
from mmwf.models.layers import PatchEmbed, resolve_arch, run_blocks, tokens_to_map


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


class PlainBackbone(BaseModule):
    """Stem, blocks on one token grid, final norm and ImageNet head; a family adds its stem extras, its blocks
    and its pooling.

    Args:
        arch (str | dict): a name of the family's ``ARCH_SETTINGS`` or a dict with exactly their keys
            (:func:`mmwf.models.layers.resolve_arch`).
        in_channels (int): image channels. Defaults to 3.
        patch_size (int): stem conv kernel and stride p. Defaults to 16.
        out_indices (int | Sequence[int]): blocks whose patch-token outputs :meth:`forward` returns (negative
            from the end). Defaults to -1.
        final_norm (bool): apply ``norm`` to the last block's output. Defaults to True.
        with_cp (bool): activation checkpointing of every block while training. Defaults to False.
        out_type (str): what :meth:`forward` returns: ``'featmap'``, the (B, C, H/p, W/p) maps of ``out_indices``
            (dense prediction), or ``'logits'``, the ImageNet classifier's (B, num_classes) logits as a one-tuple
            (an mmpretrain ``ImageClassifier`` with a parameter-free ``ClsHead``; needs ``num_classes`` > 0, and
            released checkpoints load with their head). Defaults to ``'featmap'``.
        init_cfg (dict | list[dict], optional): mmengine init config. ``Pretrained`` entries keep mmengine's
            contract (applied after the others; ``prefix`` with or without its dot; ``map_location``; local files,
            URLs and mmengine's named checkpoints) and load strictly
            (:class:`mmwf.models.initializers.StrictPretrained`): a whole detector / segmentor / classifier /
            distiller checkpoint gives its backbone's tensors. Defaults to None.

    A subclass calls ``super().__init__`` (which builds ``patch_embed``), builds its own stem tensors and
    ``blocks``, then :meth:`init_head`; it implements :meth:`embed` and :meth:`pool`, and may extend
    :meth:`checkpoint_filter_fn` to convert another release's keys.
    """

    ARCH_SETTINGS: dict[str, dict] = {}
    MIN_GRID = 1  # smallest token grid side the blocks accept
    WEIGHTS_HINT = ''  # where to get the released weights, for the not-found error

    OUT_TYPES = ('featmap', 'logits')

    def __init__(self, arch: str | dict, in_channels: int = 3, patch_size: int = 16,
                 out_indices: int | Sequence[int] = -1, final_norm: bool = True, with_cp: bool = False,
                 out_type: str = 'featmap', init_cfg: dict | list | None = None) -> None:
        super().__init__(init_cfg=init_cfg)
        name = type(self).__name__
        if out_type not in self.OUT_TYPES:
            raise ValueError(f'{name} out_type must be one of {self.OUT_TYPES}, got {out_type!r}')
        self.out_type = out_type
        self.arch = resolve_arch(arch, self.ARCH_SETTINGS, name)
        self.embed_dims, self.depth = self.arch['embed_dims'], self.arch['depth']
        self.patch_size, self.final_norm, self.with_cp = patch_size, final_norm, with_cp
        self.out_indices = resolve_out_indices(out_indices, self.depth, name)
        self.patch_embed = PatchEmbed(in_channels, self.embed_dims, patch_size)

    def init_linears(self) -> None:
        """timm's and the release's init of every nn.Linear: weights trunc_normal(std 0.02), biases zero."""
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.trunc_normal_(m.weight, std=0.02)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)

    def stem(self) -> list[nn.Module | nn.Parameter]:
        """What ``frozen_stages >= 0`` freezes before the blocks: the patch embedding (a family adds its stem
        extras)."""
        return [self.patch_embed]

    def freeze_stages(self, frozen_stages: int) -> None:
        """Freeze (no gradients, eval mode) the stem for ``frozen_stages`` >= 0, and blocks 0..frozen_stages-1
        (and ``norm`` when all of them are); -1 freezes nothing. Applied again by :meth:`train`."""
        self.frozen_stages = frozen_stages
        if frozen_stages < 0:
            return
        frozen = [*self.stem(), *self.blocks[:frozen_stages]]
        if frozen_stages >= self.depth:
            frozen.append(self.norm)
        for part in frozen:
            if isinstance(part, nn.Parameter):
                part.requires_grad = False
                continue
            part.eval()
            for p in part.parameters():
                p.requires_grad = False

    def train(self, mode: bool = True) -> PlainBackbone:
        super().train(mode)
        self.freeze_stages(getattr(self, 'frozen_stages', -1))
        return self

    def init_weights(self) -> None:
        """mmengine's ``init_weights`` with ``Pretrained`` (and ``SoftmaxTransfer``) entries applied last and
        strictly (:func:`mmwf.models.initializers.init_weights_pretrained_last`)."""
        init_weights_pretrained_last(self, super().init_weights)

    def init_head(self, num_classes: int) -> None:
        """The final LayerNorm ``norm`` (when used) and, for ``num_classes > 0``, the ImageNet ``head``."""
        if self.out_type == 'logits' and num_classes <= 0:
            raise ValueError(f"{type(self).__name__} with out_type='logits' needs num_classes > 0 (e.g. 1000)")
        self.norm = nn.LayerNorm(self.embed_dims, eps=1e-6) if self.final_norm or num_classes else nn.Identity()
        self.head = nn.Linear(self.embed_dims, num_classes) if num_classes > 0 else None

    def grid(self, x: torch.Tensor) -> tuple[int, int]:
        """Token grid (H/p, W/p) of an image batch, with a clear error for bad input."""
        return image_grid(x, self.patch_embed.proj, self.MIN_GRID, type(self).__name__)

    def embed(self, x: torch.Tensor, classify: bool) -> tuple[torch.Tensor, tuple[int, int], int]:
        """Images (B, C, H, W) -> tokens (B, prefix + H*W, C) entering the blocks, the grid, and the number of
        prefix (class) tokens; ``classify`` for :meth:`forward_classifier`."""
        raise NotImplementedError

    def pool(self, x: torch.Tensor, prefix: int) -> torch.Tensor:
        """Normed tokens (B, N, C) -> image features (B, C) for the head."""
        raise NotImplementedError

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Images (B, C, H, W) -> tuple of (B, C', H/p, W/p) maps of the patch tokens, one per ``out_indices``
        (or, with ``out_type='logits'``, the one-tuple of classifier logits)."""
        if self.out_type == 'logits':
            return (self.forward_classifier(x),)
        x, hw, prefix = self.embed(x, classify=False)
        feats = [self.norm(feat) if i == self.depth - 1 and self.final_norm else feat
                 for i, feat in run_blocks(self.blocks, x, hw, with_cp=self.with_cp) if i in self.out_indices]
        return tuple(tokens_to_map(f[:, prefix:] if prefix else f, hw).contiguous() for f in feats)

    def forward_classifier(self, x: torch.Tensor) -> torch.Tensor:
        """Images (B, C, H, W) -> ImageNet logits (B, num_classes): blocks, ``norm``, :meth:`pool`, ``head``."""
        if self.head is None:
            raise RuntimeError(f'this {type(self).__name__} has no classification head; build it with '
                               'num_classes=1000')
        x, hw, prefix = self.embed(x, classify=True)
        _, x = deque(run_blocks(self.blocks, x, hw, with_cp=self.with_cp), maxlen=1)[0]  # the last output, none kept
        return self.head(self.pool(self.norm(x), prefix))

    def checkpoint_filter_fn(self, state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """A released checkpoint -> this model's keys: the tensors of modules this model was built without (a
        1000-class ``head`` in a dense backbone, ``norm`` with ``final_norm=False``, a class token) are dropped
        and logged. A family with other key names converts them here."""
        own = {k.split('.')[0] for k in self.state_dict()}
        skipped = [k for k in state_dict if k.split('.')[0] not in own]
        if skipped:
            print_log(f'{type(self).__name__}: skipped {len(skipped)} checkpoint tensors of modules this model omits: '
                      f'{", ".join(skipped[:5])}{" ..." if len(skipped) > 5 else ""}', logger='current')
        return {k: v for k, v in state_dict.items() if k.split('.')[0] in own}
