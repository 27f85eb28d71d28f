"""WeightFormer: global visual modelling by dynamically predicted weights instead of attention.

He, Han and Huang, "Linear-Time Global Visual Modeling without Explicit Attention"; docs/weightformer.md. The
default settings reproduce the released ImageNet models exactly (checkpoint keys included); the paper's Table 1
strategy space is reachable through ``dynamic_linear``, ``dynamic_dwc``, ``dynamic_mlp`` and ``dynamic_blocks``.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn as nn
from timm.layers import DropPath

from mmwf.models.layers import StaticDWConv, StaticLinear, dynamic_block_ids, map_to_tokens
from mmwf.registry import MODELS

from .base import PlainBackbone


def has_forward_hooks(module: nn.Module) -> bool:
    """Whether a forward hook could see an output of ``module`` or of its submodules."""
    return bool(nn.modules.module._global_forward_hooks) or any(m._forward_hooks for m in module.modules())


class WeightFormerBlock(nn.Module):
    """One block on tokens x (B, H*W, C) of grid ``hw``.

    Static (released): ``x = x + dwc(x)``; ``x = x + drop_path(drop(linear2(drop(act(linear1(norm2(x)))))))``.
    Dynamic (released): first ``x = norm1(x)`` (the stream itself is normalised, a release quirk), then the
    same with a dynamic ``dwc`` and/or dynamic ``linear1`` / ``linear2``. At inference without forward hooks the
    GELU and the residual adds run in place on fresh branch outputs (saving a 4C-wide buffer); otherwise every
    module's output stays as it returned it.

    Args:
        dim (int): channels C.
        mlp_ratio (float): hidden width of the MLP, in C.
        dwc (dict): config of the token mixer (a depthwise conv, static or dynamic).
        linear1 (dict): config of the MLP's first linear (static or dynamic).
        linear2 (dict): config of the MLP's second linear.
        norm_stream (bool): normalise the stream first (dynamic blocks of the release).
        drop (float): dropout in the MLP. Defaults to 0.
        drop_path (float): stochastic depth of the MLP branch. Defaults to 0.
        linear2_context (bool): a dynamic ``linear2`` predicts its update from the MLP's C-wide input
            ``norm2(x)``, not from its own 4C-wide input. Defaults to False.
    """

    def __init__(self, dim: int, mlp_ratio: float, dwc: dict, linear1: dict, linear2: dict,
                 norm_stream: bool, drop: float = 0.0, drop_path: float = 0.0, linear2_context: bool = False) -> None:
        super().__init__()
        hidden = int(dim * mlp_ratio)
        self.norm1 = nn.LayerNorm(dim, eps=1e-6) if norm_stream else nn.Identity()
        self.dwc = MODELS.build(dict(dwc, dim=dim))
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.linear1 = MODELS.build(dict(linear1, in_features=dim, out_features=hidden))
        self.act = nn.GELU()
        self.drop = nn.Dropout(drop)
        self.linear2_context = linear2_context
        context = dict(context_features=dim) if linear2_context else {}
        self.linear2 = MODELS.build(dict(linear2, in_features=hidden, out_features=dim, **context))
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()

    def forward(self, x: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
        inplace = not torch.is_grad_enabled() and not has_forward_hooks(self)
        x = self.norm1(x)
        y = self.dwc(x, hw)
        x = y.add_(x) if inplace else y + x
        z = self.norm2(x)
        y = self.linear1(z, hw)
        y = self.drop(torch.ops.aten.gelu_(y) if inplace else self.act(y))
        y = self.drop_path(self.drop(self.linear2(y, hw, z) if self.linear2_context else self.linear2(y, hw)))
        return y.add_(x) if inplace else y + x


@MODELS.register_module()
class WeightFormer(PlainBackbone):
    """WeightFormer backbone (and ImageNet classifier when ``num_classes > 0``).

    Args:
        arch (str | dict): 't', 's', 'b', 't18' (Table 2's 18-block networks) or a dict with ``embed_dims``, ``depth``,
            ``mlp_ratio``. Defaults to 't'.
        in_channels (int): image channels. Defaults to 3.
        patch_size (int): stem conv kernel and stride. Defaults to 16.
        out_indices (int | Sequence[int]): blocks whose outputs are returned (negative from the end). Defaults
            to -1.
        final_norm (bool): apply the final LayerNorm ``norm`` to the last block's output. Defaults to True.
        drop_rate (float): dropout in the MLPs. Defaults to 0.
        drop_path_rate (float): stochastic depth, rising linearly over the blocks. Defaults to 0.
        dynamic_blocks (dict | Sequence[int]): which blocks are dynamic: ``dict(every=k, offset=o)`` (block i is
            dynamic when i % k == o) or a list of indices (``[]``: Table 2's static baseline CNN). Defaults to
            ``dict(every=3, offset=1)``, the release's blocks 1, 4, ..., 16.
        dynamic_linear (dict): the dynamic linear strategy (a ``type`` of ``layers.dynamic_linear``). Defaults to
            ``dict(type='BilateralDynamicLinear')`` (eq. 8, released).
        dynamic_dwc (dict, optional): the dynamic depthwise-conv strategy, or None for a static DWC in dynamic
            blocks. Defaults to ``dict(type='AdaptiveDynamicDWConv')`` (eq. 11, released).
        dynamic_mlp (str): which MLP linear is dynamic in dynamic blocks: 'first', 'second', 'both' or 'none'.
            Defaults to 'first' (released).
        linear2_context (str): what a dynamic second linear predicts its update from: ``'input'``, the MLP's
            C-wide input (the paper's Table 2 counts: Dynamic Linear 2 costs what Dynamic Linear 1 costs), or
            ``'hidden'``, its own 4C-wide input. Defaults to ``'input'``.
        frozen_stages (int): -1 freezes nothing; 0 the stem; i > 0 the stem and blocks 0..i-1 (and ``norm`` when
            i == depth). Defaults to -1.
        with_cp (bool): activation checkpointing of every block while training. Defaults to False.
        num_classes (int): > 0 adds the ImageNet head (final norm, mean over tokens, Linear) for
            :meth:`forward_classifier`. Defaults to 0.
        out_type (str): ``'featmap'`` (dense maps) or ``'logits'`` (classifier logits, for mmpretrain). Defaults
            to ``'featmap'``.
        init_cfg (dict | list[dict], optional): ``dict(type='Pretrained', checkpoint=PATH)`` loads a released or
            mmwf checkpoint strictly. Defaults to None.

    Input (B, in_channels, H, W) with H, W >= 2 * patch_size; outputs a tuple of (B, C, H/p, W/p) maps
    (floor division), one per ``out_indices``.
    """

    ARCH_SETTINGS = {
        't': dict(embed_dims=192, depth=17, mlp_ratio=4),
        't18': dict(embed_dims=192, depth=18, mlp_ratio=4),  # Table 2's networks: one more static block
        's': dict(embed_dims=384, depth=17, mlp_ratio=4),
        'b': dict(embed_dims=384, depth=17, mlp_ratio=4),  # WeightFormer-S trained and run at 448 x 448
    }
    MIN_GRID = 2
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
                 linear2_context: str = 'input',
                 frozen_stages: int = -1,
                 with_cp: bool = False,
                 num_classes: int = 0,
                 out_type: str = 'featmap',
                 init_cfg: dict | list | None = None) -> None:
        super().__init__(arch, in_channels, patch_size, out_indices, final_norm, with_cp, out_type, init_cfg)
        self.dynamic_ids = dynamic_block_ids(dynamic_blocks, self.depth)
        if dynamic_mlp not in ('first', 'second', 'both', 'none'):
            raise ValueError(f"dynamic_mlp must be 'first', 'second', 'both' or 'none', got {dynamic_mlp!r}")
        if linear2_context not in ('input', 'hidden'):
            raise ValueError(f"linear2_context must be 'input' or 'hidden', got {linear2_context!r}")
        self.init_norm = nn.LayerNorm(self.embed_dims, eps=1e-6)
        static_linear, static_dwc = dict(type=StaticLinear), dict(type=StaticDWConv)
        dpr = torch.linspace(0, drop_path_rate, self.depth).tolist()
        blocks = []
        for i in range(self.depth):
            dyn = i in self.dynamic_ids
            blocks.append(WeightFormerBlock(
                self.embed_dims, self.arch['mlp_ratio'],
                dwc=dynamic_dwc if dyn and dynamic_dwc is not None else static_dwc,
                linear1=dynamic_linear if dyn and dynamic_mlp in ('first', 'both') else static_linear,
                linear2=dynamic_linear if dyn and dynamic_mlp in ('second', 'both') else static_linear,
                norm_stream=dyn, drop=drop_rate, drop_path=dpr[i],
                linear2_context=dyn and dynamic_mlp in ('second', 'both') and linear2_context == 'input'))
        self.blocks = nn.ModuleList(blocks)
        self.init_head(num_classes)
        self._init_released()
        self.freeze_stages(frozen_stages)

    def _init_released(self) -> None:
        """The release's init: Linear trunc_normal(0.02) with zero bias, LayerNorm (1, 0), convs and the
        dynamic layers' raw parameters as their modules set them."""
        self.init_linears()
        for m in self.modules():
            if isinstance(m, nn.LayerNorm):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)

    def stem(self) -> list[nn.Module | nn.Parameter]:
        return [self.patch_embed, self.init_norm]

    def embed(self, x: torch.Tensor, classify: bool) -> tuple[torch.Tensor, tuple[int, int], int]:
        """Images -> normalised patch tokens (B, H*W, C) (stem: patch conv, ``init_norm``), no prefix token."""
        hw = self.grid(x)
        return self.init_norm(map_to_tokens(self.patch_embed(x))), hw, 0

    def pool(self, x: torch.Tensor, prefix: int) -> torch.Tensor:
        """Mean over the tokens."""
        return x.mean(1)
