"""DeiT (Touvron et al., 2021) as a plain dense-prediction backbone, the baseline of Tables 4 and 5.

Keys follow timm's ``VisionTransformer`` (``patch_embed.proj``, ``cls_token``, ``pos_embed``,
``blocks.{i}.{norm1,attn.qkv,attn.proj,norm2,mlp.fc1,mlp.fc2}``, ``norm``, ``head``), so official DeiT and
timm checkpoints load as they are. The absolute position embedding, pretrained on a 14 x 14 grid, is
resampled (bicubic) to the input grid. ViTDet-style window attention (no class token) can be enabled in
chosen blocks.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F
from mmengine.model import BaseModule
from timm.layers import DropPath, Mlp

from mmwf.models.transfer import transfer_softmax_weights
from mmwf.models.utils import (
    StrictPretrainedMixin,
    image_grid,
    resample_grid_tokens,
    resolve_arch,
    resolve_out_indices,
    run_blocks,
)
from mmwf.registry import MODELS

ARCH_SETTINGS = {
    't': dict(embed_dims=192, depth=12, num_heads=3, mlp_ratio=4),
    's': dict(embed_dims=384, depth=12, num_heads=6, mlp_ratio=4),
    'b': dict(embed_dims=768, depth=12, num_heads=12, mlp_ratio=4),
}


@MODELS.register_module()
class SoftmaxAttention(nn.Module):
    """Softmax multi-head self-attention, timm layout: ``qkv`` Linear(C, 3C), ``proj`` Linear(C, C).

    Tokens x (B, N, C) -> (B, N, C); ``hw`` (the patch grid) is unused by softmax attention.
    """

    def __init__(self, dim: int, num_heads: int, qkv_bias: bool = True, proj_drop: float = 0.0) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)

    def forward(self, x: torch.Tensor, hw: tuple[int, int] | None = None) -> torch.Tensor:
        B, N, C = x.shape
        q, k, v = self.qkv(x).reshape(B, N, 3, self.num_heads, C // self.num_heads).permute(2, 0, 3, 1, 4)
        x = F.scaled_dot_product_attention(q, k, v)
        return self.proj_drop(self.proj(x.transpose(1, 2).reshape(B, N, C)))


def window_partition(x: torch.Tensor, hw: tuple[int, int], size: int) -> tuple[torch.Tensor, tuple[int, int]]:
    """Tokens (B, H*W, C) -> windows (B*nW, size*size, C), zero-padding the grid to multiples of ``size``."""
    B, _, C = x.shape
    H, W = hw
    x = x.view(B, H, W, C)
    ph, pw = -H % size, -W % size
    x = F.pad(x, (0, 0, 0, pw, 0, ph))
    Hp, Wp = H + ph, W + pw
    x = x.view(B, Hp // size, size, Wp // size, size, C).transpose(2, 3)
    return x.reshape(-1, size * size, C), (Hp, Wp)


def window_unpartition(x: torch.Tensor, hw: tuple[int, int], padded: tuple[int, int], size: int) -> torch.Tensor:
    """Inverse of :func:`window_partition`: windows -> tokens (B, H*W, C), padding removed."""
    (H, W), (Hp, Wp) = hw, padded
    C = x.shape[-1]
    x = x.view(-1, Hp // size, Wp // size, size, size, C).transpose(2, 3).reshape(-1, Hp, Wp, C)
    return x[:, :H, :W].reshape(-1, H * W, C)


class DeiTBlock(nn.Module):
    """Pre-norm transformer block: x + attn(norm1(x)), then x + mlp(norm2(x)); optional window attention."""

    def __init__(self, dim: int, num_heads: int, mlp_ratio: float, attn_cfg: dict, window_size: int = 0,
                 drop_path: float = 0.0) -> None:
        super().__init__()
        self.window_size = window_size
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.attn = MODELS.build(dict(attn_cfg, dim=dim, num_heads=num_heads))
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), act_layer=nn.GELU)
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()

    def forward(self, x: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
        y = self.norm1(x)
        if self.window_size:
            y, padded = window_partition(y, hw, self.window_size)
            y = self.attn(y, (self.window_size, self.window_size))
            y = window_unpartition(y, hw, padded, self.window_size)
        else:
            y = self.attn(y, hw)
        x = x + self.drop_path(y)
        return x + self.drop_path(self.mlp(self.norm2(x)))


@MODELS.register_module()
class DeiT(StrictPretrainedMixin, BaseModule):
    """DeiT backbone for dense prediction (and the ImageNet classifier when ``num_classes > 0``).

    Args:
        arch: 't', 's', 'b' or a dict with ``embed_dims``, ``depth``, ``num_heads``, ``mlp_ratio``.
        patch_size: stem conv kernel and stride.
        pretrain_size: image size the position embedding was trained at (224: a 14 x 14 grid).
        with_cls_token: keep the class token through the blocks (timm DeiT); must be False with windows.
        window_size: window attention size (0: global attention everywhere).
        window_block_indexes: blocks that use window attention (ViTDet: all but 2, 5, 8, 11).
        attn_cfg: attention operator config (``type`` registered in MODELS): ``SoftmaxAttention`` (default),
            ``ELUAttention``, ``ReLUAttention``, ``InLineAttention``, ``MHLAttention``, ``TTTAttention``
            (the last two take no class token). Extra keys go to the operator.
        out_indices: blocks whose patch-token outputs are returned.
        final_norm: apply ``norm`` to the last block's output.
        drop_path_rate: stochastic depth, linearly increasing.
        with_cp: activation checkpointing while training.
        num_classes: > 0 adds the class-token head for :meth:`forward_classifier`.
        init_cfg: ``dict(type='Pretrained', checkpoint=PATH)`` loads a DeiT / timm checkpoint strictly;
            ``dict(type='SoftmaxTransfer', checkpoint=PATH, recipe='copy' | 'mlp_copy' | 'full_copy')``
            initialises a linear-attention DeiT from a softmax one (:func:`mmwf.models.transfer_softmax_weights`).

    Input (B, 3, H, W) with H, W >= patch_size; outputs a tuple of (B, C, H/p, W/p) maps.
    """

    WEIGHTS_HINT = ('Official DeiT weights: deit_{tiny,small,base}_patch16_224-*.pth from the facebookresearch/deit '
                    'repository (timm deit_*_patch16_224 checkpoints load as well).')

    def __init__(self,
                 arch: str | dict = 't',
                 patch_size: int = 16,
                 pretrain_size: int = 224,
                 with_cls_token: bool = True,
                 window_size: int = 0,
                 window_block_indexes: Sequence[int] = (),
                 attn_cfg: dict = dict(type='SoftmaxAttention'),
                 out_indices: int | Sequence[int] = -1,
                 final_norm: bool = True,
                 drop_path_rate: float = 0.0,
                 with_cp: bool = False,
                 num_classes: int = 0,
                 init_cfg: dict | list | None = None) -> None:
        super().__init__(init_cfg=init_cfg)
        arch = resolve_arch(arch, ARCH_SETTINGS, 'DeiT')
        if window_size and window_block_indexes and with_cls_token:
            raise ValueError('window attention has no class token: set with_cls_token=False')
        attn_cls = MODELS.get(attn_cfg['type'])
        if attn_cls is None:
            raise KeyError(f'unknown attention operator {attn_cfg["type"]!r} (attn_cfg); registered in mmwf: '
                           'SoftmaxAttention, ELUAttention, ReLUAttention, InLineAttention, MHLAttention, '
                           'TTTAttention')
        self.cls_pool = getattr(attn_cls, 'with_cls_token', True)
        if with_cls_token and not self.cls_pool:
            raise ValueError(f'{attn_cfg["type"]} has no class token: build DeiT with with_cls_token=False')
        self.embed_dims, self.depth = arch['embed_dims'], arch['depth']
        self.patch_size, self.with_cls_token, self.with_cp = patch_size, with_cls_token, with_cp
        self.pretrain_grid = pretrain_size // patch_size
        self.out_indices = resolve_out_indices(out_indices, self.depth, 'DeiT')
        self.final_norm = final_norm
        C = self.embed_dims
        self.patch_embed = nn.Module()
        self.patch_embed.proj = nn.Conv2d(3, C, patch_size, stride=patch_size)
        if with_cls_token or (num_classes and self.cls_pool):
            self.cls_token = nn.Parameter(torch.zeros(1, 1, C))
        self.pos_embed = nn.Parameter(torch.zeros(1, 1 + self.pretrain_grid ** 2, C))
        dpr = torch.linspace(0, drop_path_rate, self.depth).tolist()
        self.blocks = nn.ModuleList(
            DeiTBlock(C, arch['num_heads'], arch['mlp_ratio'], attn_cfg,
                      window_size if i in window_block_indexes else 0, dpr[i]) for i in range(self.depth))
        self.norm = nn.LayerNorm(C, eps=1e-6) if final_norm or num_classes else nn.Identity()
        self.head = nn.Linear(C, num_classes) if num_classes > 0 else None
        self._init_timm()

    def _init_timm(self) -> None:
        nn.init.trunc_normal_(self.pos_embed, std=0.02)
        if hasattr(self, 'cls_token'):
            nn.init.normal_(self.cls_token, std=1e-6)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.trunc_normal_(m.weight, std=0.02)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)

    def init_weights(self) -> None:
        if isinstance(self.init_cfg, dict) and self.init_cfg.get('type') == 'SoftmaxTransfer':
            cfg = {k: v for k, v in self.init_cfg.items() if k != 'type'}
            transfer_softmax_weights(self, **cfg)
            self._is_init = True
        else:
            super().init_weights()

    def grid(self, x: torch.Tensor) -> tuple[int, int]:
        """Token grid (H/p, W/p) of an image batch, with a clear error for bad input."""
        return image_grid(x, self.patch_embed.proj, 1, 'DeiT')

    def patch_pos_embed(self, hw: tuple[int, int]) -> torch.Tensor:
        """Position embedding of the patch tokens, (1, H*W, C), resampled from the pretraining grid."""
        pos = self.pos_embed[:, 1:]
        if hw == (self.pretrain_grid, self.pretrain_grid):
            return pos
        return resample_grid_tokens(pos, self.pretrain_grid, hw)

    def embed(self, x: torch.Tensor, cls_token: bool) -> tuple[torch.Tensor, tuple[int, int]]:
        """Images -> tokens (B, [1 +] H*W, C) with position embedding, and the grid."""
        hw = self.grid(x)
        x = self.patch_embed.proj(x).flatten(2).transpose(1, 2) + self.patch_pos_embed(hw)
        if cls_token:
            cls = self.cls_token + self.pos_embed[:, :1]
            x = torch.cat([cls.expand(x.shape[0], -1, -1), x], dim=1)
        return x, hw

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Images (B, 3, H, W) -> tuple of (B, C, H/p, W/p) patch-token maps, one per ``out_indices``."""
        x, hw = self.embed(x, self.with_cls_token)
        prefix = 1 if self.with_cls_token else 0
        outs = []
        for i, feat in run_blocks(self.blocks, x, hw, self.with_cp):
            if i in self.out_indices:
                out = self.norm(feat) if i == self.depth - 1 and self.final_norm else feat
                outs.append(out[:, prefix:].transpose(1, 2).reshape(x.shape[0], -1, *hw).contiguous())
        return tuple(outs)

    def forward_classifier(self, x: torch.Tensor) -> torch.Tensor:
        """Images -> logits from the class token (DeiT / timm classifier), or from the mean patch token for
        operators without one (MHLA, TTT)."""
        if self.head is None:
            raise RuntimeError('this DeiT has no classification head; build it with num_classes=1000')
        x, hw = self.embed(x, self.cls_pool)
        for block in self.blocks:
            x = block(x, hw)
        x = self.norm(x)
        return self.head(x[:, 0] if self.cls_pool else x.mean(1))
