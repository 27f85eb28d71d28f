"""WeightFormer: global visual modelling by dynamically predicted weights instead of attention.

He, Han and Huang, "Linear-Time Global Visual Modeling without Explicit Attention" (Tsinghua University). The
default settings reproduce the released ImageNet models exactly (checkpoint keys included); the paper's
Table 1 strategy space is reachable through ``dynamic_linear``, ``dynamic_dwc``, ``dynamic_mlp`` and
``dynamic_blocks``.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn as nn
from mmengine.model import BaseModule
from timm.layers import DropPath

from mmwf.models.layers import StaticDWConv, StaticLinear
from mmwf.models.layers.dynamic_linear import map_to_tokens, tokens_to_map
from mmwf.models.utils import StrictPretrainedMixin, image_grid, resolve_arch, resolve_out_indices, run_blocks
from mmwf.registry import MODELS

ARCH_SETTINGS = {
    # WeightFormer-B is WeightFormer-S trained and run at 448 x 448.
    't': dict(embed_dims=192, depth=17, mlp_ratio=4),
    's': dict(embed_dims=384, depth=17, mlp_ratio=4),
    'b': dict(embed_dims=384, depth=17, mlp_ratio=4),
}


class GELU(nn.GELU):
    """Exact GELU; in place when autograd is off (inference), saving a 4C-wide buffer per block."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x) if torch.is_grad_enabled() else torch.ops.aten.gelu_(x)


class WeightFormerBlock(nn.Module):
    """One block on tokens x (B, H*W, C).

    Static (released): ``x = x + dwc(x)``; ``x = x + drop_path(drop(linear2(drop(act(linear1(norm2(x)))))))``.
    The residual adds are done in place on the branch outputs (fresh tensors that autograd does not keep).
    Dynamic (released): first ``x = norm1(x)`` (the stream itself is normalised, a release quirk), then the
    same with a dynamic ``dwc`` and/or dynamic ``linear1`` / ``linear2``.
    """

    def __init__(self, dim: int, mlp_ratio: float, dwc: dict, linear1: dict, linear2: dict,
                 norm_stream: bool, drop: float = 0.0, drop_path: float = 0.0) -> None:
        super().__init__()
        hidden = int(dim * mlp_ratio)
        self.norm1 = nn.LayerNorm(dim, eps=1e-6) if norm_stream else nn.Identity()
        self.dwc = MODELS.build(dict(dwc, dim=dim))
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.linear1 = MODELS.build(dict(linear1, in_features=dim, out_features=hidden))
        self.act = GELU()
        self.drop = nn.Dropout(drop)
        self.linear2 = MODELS.build(dict(linear2, in_features=hidden, out_features=dim))
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()

    def forward(self, x: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
        x = self.norm1(x)
        x = self.dwc(x, hw).add_(x)
        y = self.drop(self.act(self.linear1(self.norm2(x), hw)))
        y = self.drop(self.linear2(y, hw))
        return self.drop_path(y).add_(x)


@MODELS.register_module()
class WeightFormer(StrictPretrainedMixin, BaseModule):
    """WeightFormer backbone (and ImageNet classifier when ``num_classes > 0``).

    Args:
        arch: 't', 's', 'b' or a dict with ``embed_dims``, ``depth``, ``mlp_ratio``.
        in_channels: image channels.
        patch_size: stem conv kernel and stride.
        out_indices: blocks whose outputs are returned (negative counts from the end).
        final_norm: apply the final LayerNorm ``norm`` to the last block's output.
        drop_rate: dropout in the MLPs.
        drop_path_rate: stochastic depth, linearly increasing over blocks.
        dynamic_blocks: which blocks are dynamic: ``dict(every=k, offset=o)`` (block i is dynamic when
            i % k == o; released: every=3, offset=1, i.e. blocks 1, 4, ..., 16) or a list of indices
            (``[]`` gives Table 2's static baseline CNN).
        dynamic_linear: config of the dynamic linear strategy (``type`` from layers.dynamic_linear).
        dynamic_dwc: config of the dynamic depthwise-conv strategy, or None for a static DWC in dynamic
            blocks.
        dynamic_mlp: which MLP linear is dynamic in dynamic blocks: 'first' (released), 'second', 'both'
            or 'none'.
        frozen_stages: -1 freezes nothing; 0 the stem; i > 0 the stem and blocks 0..i-1 (and ``norm`` when
            i == depth).
        with_cp: activation checkpointing of every block while training.
        num_classes: > 0 adds the ImageNet head (final norm, mean over tokens, Linear) for
            :meth:`forward_classifier`.
        init_cfg: mmengine init config; ``dict(type='Pretrained', checkpoint=PATH)`` loads a released or
            mmwf checkpoint strictly (see :func:`load_backbone_checkpoint`).

    Input (B, in_channels, H, W) with H, W >= 2 * patch_size; outputs a tuple of (B, C, H/p, W/p) maps
    (floor division), one per ``out_indices``.
    """

    WEIGHTS_HINT = ('Released ImageNet weights: model.safetensors of the Hugging Face models '
                    'RuizeHe/weightformer-{t,s,b}, or the training checkpoints linked from the LeapLabTHU/WeightFormer '
                    'repository (clean those with tools/model_converters/clean_checkpoint.py).')

    def __init__(self,
                 arch: str | dict = 't',
                 in_channels: int = 3,
                 patch_size: int = 16,
                 out_indices: int | Sequence[int] = -1,
                 final_norm: bool = True,
                 drop_rate: float = 0.0,
                 drop_path_rate: float = 0.0,
                 dynamic_blocks: dict | Sequence[int] = dict(every=3, offset=1),
                 dynamic_linear: dict = dict(type='BilateralDynamicLinear'),
                 dynamic_dwc: dict | None = dict(type='AdaptiveDynamicDWConv'),
                 dynamic_mlp: str = 'first',
                 frozen_stages: int = -1,
                 with_cp: bool = False,
                 num_classes: int = 0,
                 init_cfg: dict | list | None = None) -> None:
        super().__init__(init_cfg=init_cfg)
        arch = resolve_arch(arch, ARCH_SETTINGS, 'WeightFormer')
        self.embed_dims, self.depth = arch['embed_dims'], arch['depth']
        self.patch_size = patch_size
        self.dynamic_ids = self._dynamic_ids(dynamic_blocks, self.depth)
        if dynamic_mlp not in ('first', 'second', 'both', 'none'):
            raise ValueError(f"dynamic_mlp must be 'first', 'second', 'both' or 'none', got {dynamic_mlp!r}")
        self.out_indices = resolve_out_indices(out_indices, self.depth, 'WeightFormer')
        self.final_norm, self.frozen_stages, self.with_cp = final_norm, frozen_stages, with_cp

        static_linear, static_dwc = dict(type=StaticLinear), dict(type=StaticDWConv)
        self.patch_embed = nn.Module()
        self.patch_embed.proj = nn.Conv2d(in_channels, self.embed_dims, patch_size, stride=patch_size)
        self.init_norm = nn.LayerNorm(self.embed_dims, eps=1e-6)
        dpr = torch.linspace(0, drop_path_rate, self.depth).tolist()
        blocks = []
        for i in range(self.depth):
            dyn = i in self.dynamic_ids
            blocks.append(WeightFormerBlock(
                self.embed_dims, arch['mlp_ratio'],
                dwc=dynamic_dwc if dyn and dynamic_dwc is not None else static_dwc,
                linear1=dynamic_linear if dyn and dynamic_mlp in ('first', 'both') else static_linear,
                linear2=dynamic_linear if dyn and dynamic_mlp in ('second', 'both') else static_linear,
                norm_stream=dyn, drop=drop_rate, drop_path=dpr[i]))
        self.blocks = nn.ModuleList(blocks)
        self.norm = nn.LayerNorm(self.embed_dims, eps=1e-6) if final_norm or num_classes else nn.Identity()
        self.head = nn.Linear(self.embed_dims, num_classes) if num_classes > 0 else None
        self._init_released()
        self._freeze_stages()

    @staticmethod
    def _dynamic_ids(spec: dict | Sequence[int], depth: int) -> set[int]:
        if isinstance(spec, dict):
            return {i for i in range(depth) if i % spec['every'] == spec.get('offset', 0)}
        ids = {i % depth for i in spec}
        if any(not -depth <= i < depth for i in spec):
            raise ValueError(f'dynamic_blocks {list(spec)} out of range for depth {depth}')
        return ids

    def _init_released(self) -> None:
        """The release's init: Linear trunc_normal(0.02) with zero bias, LayerNorm (1, 0), convs and the
        dynamic layers' raw parameters as their modules set them."""
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.trunc_normal_(m.weight, std=0.02)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, nn.LayerNorm):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)

    def _freeze_stages(self) -> None:
        if self.frozen_stages < 0:
            return
        frozen = [self.patch_embed, self.init_norm, *self.blocks[:self.frozen_stages]]
        if self.frozen_stages >= self.depth:
            frozen.append(self.norm)
        for module in frozen:
            module.eval()
            for p in module.parameters():
                p.requires_grad = False

    def train(self, mode: bool = True) -> WeightFormer:
        super().train(mode)
        self._freeze_stages()
        return self

    def grid(self, x: torch.Tensor) -> tuple[int, int]:
        """Token grid (H/p, W/p) of an image batch (at least 2 x 2), with a clear error for bad input."""
        return image_grid(x, self.patch_embed.proj, 2, 'WeightFormer')

    def forward_tokens(self, x: torch.Tensor) -> tuple[list[torch.Tensor], tuple[int, int]]:
        """Images (B, 3, H, W) -> outputs of ``out_indices`` as tokens (B, N, C), and the grid."""
        hw = self.grid(x)
        x = self.init_norm(map_to_tokens(self.patch_embed.proj(x)))
        outs = []
        for i, feat in run_blocks(self.blocks, x, hw, self.with_cp):
            if i in self.out_indices:
                outs.append(self.norm(feat) if i == self.depth - 1 and self.final_norm else feat)
        return outs, hw

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Images (B, 3, H, W) -> tuple of (B, C, H/p, W/p) maps, one per ``out_indices``."""
        outs, hw = self.forward_tokens(x)
        return tuple(tokens_to_map(o, hw).contiguous() for o in outs)

    def forward_classifier(self, x: torch.Tensor) -> torch.Tensor:
        """Images (B, 3, H, W) -> ImageNet logits (B, num_classes): norm, mean over tokens, head."""
        if self.head is None:
            raise RuntimeError('this WeightFormer has no classification head; build it with num_classes=1000')
        hw = self.grid(x)
        x = self.init_norm(map_to_tokens(self.patch_embed.proj(x)))
        for block in self.blocks:
            x = block(x, hw)
        return self.head(self.norm(x).mean(1))
