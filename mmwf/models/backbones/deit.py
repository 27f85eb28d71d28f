"""DeiT (Touvron et al., 2021) as a plain dense-prediction backbone, the baseline of Tables 4 and 5.

Keys follow timm's ``VisionTransformer`` (``patch_embed.proj``, ``cls_token``, ``pos_embed``,
``blocks.{i}.{norm1,attn.qkv,attn.proj,norm2,mlp.fc1,mlp.fc2}``, ``norm``, ``head``), so official DeiT and
timm checkpoints load as they are. The absolute position embedding, pretrained on a 14 x 14 grid, is
resampled (bicubic) to the input grid. ViTDet-style window attention (no class token) can be enabled in
chosen blocks; the attention operator is chosen by ``attn_cfg`` (``layers/attention.py``). The DeiTs of the
linear-attention study are timm models too (``deit_t_relu``, ...; ``deit_study.py``).
"""
from __future__ import annotations

import re
from collections.abc import Sequence

import torch
import torch.nn as nn
from mmengine.logging import print_log
from timm.layers import DropPath, Mlp, SwiGLUPacked, resample_abs_pos_embed

from mmwf.models.layers import (
    OPERATORS,
    build_token_norm,
    ffn_widths,
    gelu_linear,
    has_forward_hooks,
    partition,
    resample_pos_embed,
    unpartition,
)
from mmwf.registry import MODELS

from .base import PlainBackbone

__all__ = ['DeiT', 'DeiTBlock']


class DeiTBlock(nn.Module):
    """Pre-norm transformer block on tokens (B, N, C): x + attn(norm1(x)), then x + mlp(norm2(x)); with
    ``window_size`` > 0 the attention runs in windows of that many tokens a side (ViTDet).

    Args:
        dim (int): channels C.
        num_heads (int): attention heads.
        mlp_ratio (float): hidden width of the MLP, in C.
        attn_cfg (dict): the attention operator (``type`` registered in MODELS).
        window_size (int): window side in tokens, 0 for global attention. Defaults to 0.
        drop_path (float): stochastic depth of both branches. Defaults to 0.
        layer_scale (bool): scale each branch by a learnt per-channel ``gamma1`` / ``gamma2`` (init 1), as
            ViT-Adapter's plain ViT. Defaults to False.
        norm_cfg (dict): the token norms (``layers.build_token_norm``). Defaults to ``dict(type='LN')``.
        ffn_type (str): ``'mlp'`` (timm's GELU ``Mlp``) or ``'swiglu'`` (timm's ``SwiGLUPacked``: ``mlp.fc1``
            the packed gate and up projections, ``mlp.fc2`` the down projection). Defaults to ``'mlp'``.
    """

    def __init__(self, dim: int, num_heads: int, mlp_ratio: float, attn_cfg: dict, window_size: int = 0,
                 drop_path: float = 0.0, layer_scale: bool = False, norm_cfg: dict = dict(type='LN'),
                 ffn_type: str = 'mlp') -> None:
        super().__init__()
        self.window_size = window_size
        if layer_scale:
            self.gamma1 = nn.Parameter(torch.ones(dim))
            self.gamma2 = nn.Parameter(torch.ones(dim))
        self.norm1 = build_token_norm(norm_cfg, dim)
        self.attn = MODELS.build(dict(attn_cfg, dim=dim, num_heads=num_heads))
        self.norm2 = build_token_norm(norm_cfg, dim)
        first, hidden = ffn_widths(dim, mlp_ratio, ffn_type)
        self.mlp = Mlp(dim, hidden, act_layer=nn.GELU) if ffn_type == 'mlp' else SwiGLUPacked(dim, first)
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()

    def forward(self, x: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
        y = self.norm1(x)
        if self.window_size:
            window = (self.window_size, self.window_size)
            windows = partition(y, hw, window)  # (B, nW, s*s, C)
            y = self.attn(windows.flatten(0, 1), window).unflatten(0, windows.shape[:2])
            y = unpartition(y, hw, window)
        else:
            y = self.attn(y, hw)
        x = x + self.drop_path(y * self.gamma1 if hasattr(self, 'gamma1') else y)
        y = self.feed_forward(self.norm2(x), fused=not has_forward_hooks(self))
        return x + self.drop_path(y * self.gamma2 if hasattr(self, 'gamma2') else y)

    def feed_forward(self, z: torch.Tensor, fused: bool = False) -> torch.Tensor:
        """``mlp(z)`` on the normalised tokens z (B, N, C); ``fused`` (no forward hooks): timm's GELU ``Mlp``
        without dropout through the blocks' memory rule (:func:`~mmwf.models.layers.gelu_linear`)."""
        mlp = self.mlp
        if (fused and isinstance(mlp, Mlp) and isinstance(mlp.act, nn.GELU) and isinstance(mlp.norm, nn.Identity)
                and not mlp.drop1.p and not mlp.drop2.p):
            return gelu_linear(mlp.fc1(z), mlp.fc2, mlp.act.approximate, inplace=not torch.is_grad_enabled())
        return mlp(z)


@MODELS.register_module()
class DeiT(PlainBackbone):
    """DeiT backbone for dense prediction (and the ImageNet classifier when ``num_classes > 0``).

    Args:
        arch (str | dict): 't', 's', 'b' or a dict with ``embed_dims``, ``depth``, ``num_heads``, ``mlp_ratio``.
            Defaults to 't'.
        in_channels (int): image channels. Defaults to 3.
        patch_size (int): stem conv kernel and stride. Defaults to 16.
        pretrain_size (int): image size the position embedding was trained at. Defaults to 224 (a 14 x 14 grid).
        with_cls_token (bool, optional): keep the class token through the blocks (timm DeiT); must be False with
            windows and with operators that take none. Defaults to None: the operator's ``with_cls_token`` (True for
            softmax and the kernel attentions, False for MHLA and TTT), and False with window attention.
        window_size (int): window attention size, 0 for global attention everywhere. Defaults to 0.
        window_block_indexes (Sequence[int]): blocks that use window attention (ViTDet: all but 2, 5, 8, 11).
            Defaults to ().
        attn_cfg (dict): attention operator config (``type`` registered in MODELS): ``SoftmaxAttention``,
            ``ELUAttention``, ``ReLUAttention``, ``InLineAttention``, ``MHLAttention``, ``TTTAttention``; extra keys
            go to the operator. Defaults to ``dict(type='SoftmaxAttention')``.
        out_indices (int | Sequence[int]): blocks whose patch-token outputs are returned. Defaults to -1.
        frozen_stages (int): -1 freezes nothing; 0 the stem (patch embedding, position table, class token); i > 0
            the stem and blocks 0..i-1 (and ``norm`` when i == depth). Defaults to -1.
        final_norm (bool): apply ``norm`` to the last block's output. Defaults to True.
        drop_path_rate (float): stochastic depth, rising linearly. Defaults to 0.
        layer_scale (bool): per-channel branch scales ``gamma1`` / ``gamma2`` in every block (ViT-Adapter's plain
            ViT); a checkpoint without them loads with them at 1. Defaults to False.
        norm_cfg (dict): every norm: ``dict(type='LN')`` (DeiT) or ``dict(type='RMSNorm')`` (the modern block),
            optionally with ``eps`` (1e-6). Defaults to ``dict(type='LN')``.
        ffn_type (str): the blocks' feed-forward: ``'mlp'`` (GELU, DeiT) or ``'swiglu'`` (``layers/ffn.py``).
            Defaults to ``'mlp'``.
        with_cp (bool): activation checkpointing while training. Defaults to False.
        num_classes (int): > 0 adds the head for :meth:`forward_classifier` (class token, or the mean patch token
            for operators without one and with window attention). Defaults to 0.
        global_pool (str, optional): the classifier's pooling: ``'token'``, ``'avg'`` or ``''`` (none). Defaults to
            None: ``'token'`` where the model has a class token, else ``'avg'``.
        out_type (str): ``'featmap'`` (dense maps), ``'logits'`` (classifier logits, for mmpretrain) or ``'timm'``
            (timm's contract). Defaults to ``'featmap'``.
        init_cfg (dict | list[dict], optional): ``dict(type='Pretrained', checkpoint=PATH)`` loads a DeiT / timm
            checkpoint strictly; ``dict(type='SoftmaxTransfer', checkpoint=PATH, recipe=...)`` initialises a
            linear-attention DeiT from a softmax one (:func:`mmwf.models.transfer_softmax_weights`). Defaults to
            None.

    Input (B, 3, H, W) with H, W >= patch_size; outputs a tuple of (B, C, H/p, W/p) maps. :meth:`forward_features`
    gives timm's (B, [1 +] H/p * W/p, C) tokens, pooled by ``global_pool`` ``'token'`` (the class token; the default
    where the operator takes one) or ``'avg'`` (the mean patch token).
    """

    ARCH_SETTINGS = {
        't': dict(embed_dims=192, depth=12, num_heads=3, mlp_ratio=4),
        's': dict(embed_dims=384, depth=12, num_heads=6, mlp_ratio=4),
        'b': dict(embed_dims=768, depth=12, num_heads=12, mlp_ratio=4),
    }
    WEIGHTS_HINT = ('Official DeiT weights: deit_{tiny,small,base}_patch16_224-*.pth from the facebookresearch/deit '
                    'repository (timm deit_*_patch16_224 checkpoints load as well).')

    def __init__(self,
                 arch: str | dict = 't',
                 in_channels: int = 3,
                 patch_size: int = 16,
                 pretrain_size: int = 224,
                 with_cls_token: bool | None = None,
                 window_size: int = 0,
                 window_block_indexes: Sequence[int] = (),
                 attn_cfg: dict = dict(type='SoftmaxAttention'),
                 out_indices: int | Sequence[int] = -1,
                 frozen_stages: int = -1,
                 final_norm: bool = True,
                 drop_path_rate: float = 0.0,
                 layer_scale: bool = False,
                 norm_cfg: dict = dict(type='LN'),
                 ffn_type: str = 'mlp',
                 with_cp: bool = False,
                 num_classes: int = 0,
                 global_pool: str | None = None,
                 out_type: str = 'featmap',
                 init_cfg: dict | list | None = None) -> None:
        super().__init__(arch, in_channels, patch_size, out_indices, final_norm, with_cp, out_type, init_cfg,
                         norm_cfg)
        windowed = bool(window_size and window_block_indexes)
        if windowed and with_cls_token:
            raise ValueError('window attention has no class token: set with_cls_token=False')
        attn_cls = MODELS.get(attn_cfg['type'])
        if attn_cls is None:
            raise KeyError(f'unknown attention operator {attn_cfg["type"]!r} (attn_cfg); registered in mmwf: '
                           f'{", ".join(c.__name__ for c in OPERATORS.values())}')
        self.classify_by_cls_token = getattr(attn_cls, 'with_cls_token', True)  # the operator takes one
        if with_cls_token and not self.classify_by_cls_token:
            raise ValueError(f'{attn_cfg["type"]} has no class token: build DeiT with with_cls_token=False')
        if with_cls_token is None:
            with_cls_token = self.classify_by_cls_token and not windowed
        self.with_cls_token = with_cls_token
        self.pretrain_grid = pretrain_size // patch_size
        C = self.embed_dims
        if with_cls_token or (num_classes and self.classify_by_cls_token and not windowed):
            self.cls_token = nn.Parameter(torch.zeros(1, 1, C))
        self.num_prefix_tokens = int(hasattr(self, 'cls_token'))  # before the patch tokens in forward_features
        self.pos_embed = nn.Parameter(torch.zeros(1, 1 + self.pretrain_grid ** 2, C))
        dpr = torch.linspace(0, drop_path_rate, self.depth, device='cpu').tolist()
        self.blocks = nn.ModuleList(
            DeiTBlock(C, self.arch['num_heads'], self.arch['mlp_ratio'], attn_cfg,
                      window_size if i in window_block_indexes else 0, dpr[i], layer_scale, norm_cfg, ffn_type)
            for i in range(self.depth))
        self.init_head(num_classes, global_pool)
        self._init_timm()
        self.freeze_stages(frozen_stages)

    def _init_timm(self) -> None:
        nn.init.trunc_normal_(self.pos_embed, std=0.02)
        if hasattr(self, 'cls_token'):
            nn.init.normal_(self.cls_token, std=1e-6)
        self.init_linears()

    def stem(self) -> list[nn.Module | nn.Parameter]:
        return [self.patch_embed, self.pos_embed, *([self.cls_token] if hasattr(self, 'cls_token') else [])]

    def patch_pos_embed(self, hw: tuple[int, int]) -> torch.Tensor:
        """Position embedding of the patch tokens, (1, H*W, C), resampled bicubically (without antialiasing, as
        ViTDet and mmpretrain at run time) from the pretraining grid by timm's ``resample_abs_pos_embed``: the table
        itself on that grid, except in exported graphs, which resample for every size."""
        grid = (self.pretrain_grid, self.pretrain_grid)
        return resample_abs_pos_embed(self.pos_embed[:, 1:], hw, grid, num_prefix_tokens=0, antialias=False)

    def embed(self, x: torch.Tensor, classify: bool) -> tuple[torch.Tensor, tuple[int, int], int]:
        """Images -> tokens (B, [1 +] H*W, C) with position embedding; the class token leads when the blocks
        take one (``with_cls_token``; classifying, whenever the model has one)."""
        hw = self.grid(x)
        x = self.patch_embed(x).flatten(2).transpose(1, 2) + self.patch_pos_embed(hw)
        if not (self.num_prefix_tokens if classify else self.with_cls_token):
            return x, hw, 0
        cls = self.cls_token + self.pos_embed[:, :1]
        return torch.cat([cls.expand(x.shape[0], -1, -1), x], dim=1), hw, 1

    def pools(self) -> tuple[str, ...]:
        """``'token'`` first where the model has a class token, then ``'avg'``."""
        return ('token', 'avg') if self.num_prefix_tokens else ('avg',)

    def pool(self, x: torch.Tensor) -> torch.Tensor:
        """The class token (``'token'``) or the mean patch token (``'avg'``)."""
        return x[:, 0] if self.global_pool == 'token' else x[:, self.num_prefix_tokens:].mean(1)

    def checkpoint_filter_fn(self, state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The base filter, then layer-scale gammas a softmax DeiT checkpoint lacks set to 1, and a position table of
        another grid (a checkpoint trained at another size) resampled to ``pretrain_size``'s grid
        (:func:`mmwf.models.layers.resample_pos_embed`, as timm); each logged."""
        state_dict = super().checkpoint_filter_fn(state_dict)
        gammas = [k for k in self.state_dict() if re.fullmatch(r'blocks\.\d+\.gamma[12]', k) and k not in state_dict]
        if gammas:
            state_dict = dict(state_dict, **{k: torch.ones(self.embed_dims) for k in gammas})
            print_log(f'DeiT: {len(gammas)} layer-scale tensors (gamma1 / gamma2) are not in the checkpoint; they '
                      'start at 1, as ViT-Adapter\'s plain ViT starts them', logger='current')
        pos = state_dict.get('pos_embed')
        if (pos is not None and pos.dim() == 3 and pos.shape[-1] == self.embed_dims
                and pos.shape != self.pos_embed.shape):
            state_dict = dict(state_dict, pos_embed=resample_pos_embed(pos, self.pretrain_grid))
            print_log(f'DeiT: resampled pos_embed from {pos.shape[1] - 1} to {self.pretrain_grid ** 2} patch positions '
                      f'(a {self.pretrain_grid} x {self.pretrain_grid} grid, pretrain_size '
                      f'{self.pretrain_grid * self.patch_size})', logger='current')
        return state_dict

