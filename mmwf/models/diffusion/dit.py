"""DiT (Peebles & Xie, ICCV 2023): the softmax-attention baseline of Table 7, in facebookresearch/DiT's layout and
state-dict keys, so that its checkpoints load (tools/model_converters/dit_to_mmwf.py)."""
from __future__ import annotations

import torch
import torch.nn as nn
from timm.layers import Mlp

from mmwf.models.layers import SoftmaxAttention, gelu_linear, has_forward_hooks, resolve_arch
from mmwf.registry import MODELS

from .dit_utils import DiffusionTransformer, gated, modulate

# DiT's Table 1: width, depth, heads
ARCHS = {'S': dict(hidden_size=384, depth=12, num_heads=6), 'B': dict(hidden_size=768, depth=12, num_heads=12),
         'L': dict(hidden_size=1024, depth=24, num_heads=16), 'XL': dict(hidden_size=1152, depth=28, num_heads=16)}


class DiTBlock(nn.Module):
    """adaLN-Zero block: x + gate1 * attn(modulate(norm1(x))), then x + gate2 * mlp(modulate(norm2(x))); tokens
    (B, N, D), conditioning c (B, D)."""

    def __init__(self, hidden_size: int, num_heads: int, mlp_ratio: float = 4.0) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(hidden_size, elementwise_affine=False, eps=1e-6)
        self.attn = SoftmaxAttention(hidden_size, num_heads, qkv_bias=True)
        self.norm2 = nn.LayerNorm(hidden_size, elementwise_affine=False, eps=1e-6)
        self.mlp = Mlp(hidden_size, int(hidden_size * mlp_ratio), act_layer=lambda: nn.GELU(approximate='tanh'))
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(hidden_size, 6 * hidden_size))

    def forward(self, x: torch.Tensor, c: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
        shift1, scale1, gate1, shift2, scale2, gate2 = self.adaLN_modulation(c).chunk(6, dim=1)
        inplace = not torch.is_grad_enabled() and not has_forward_hooks(self)  # sampling: the blocks' memory rule
        x = gated(x, gate1, self.attn(modulate(self.norm1(x), shift1, scale1), hw), inplace)
        h = self.mlp.fc1(modulate(self.norm2(x), shift2, scale2))  # timm's Mlp (DiT's keys): fc1, GELU, fc2
        return gated(x, gate2, gelu_linear(h, self.mlp.fc2, 'tanh', inplace), inplace)


@MODELS.register_module()
class DiT(DiffusionTransformer):
    """DiT-{S,B,L,XL}/{2,4,8} (``arch``, ``patch_size``).

    Args:
        arch (str | dict): ``'S'``, ``'B'``, ``'L'``, ``'XL'`` or a dict with ``hidden_size``, ``depth``,
            ``num_heads``. Defaults to ``'S'``.
        patch_size (int): 2, 4 or 8 in the paper. Defaults to 2.
        input_size (int): latent side. Defaults to 32.
        in_channels (int): latent channels. Defaults to 4.
        mlp_ratio (float): MLP width / D. Defaults to 4.
        class_dropout_prob (float): label dropout. Defaults to 0.1.
        num_classes (int): classes. Defaults to 1000.
        learn_sigma (bool): predict the variance too. Defaults to True.
        with_cp (bool): activation checkpointing of every block while training. Defaults to False.
        init_cfg (dict, optional): mmengine init config. Defaults to None.
    """

    def __init__(self, arch: str | dict = 'S', patch_size: int = 2, input_size: int = 32, in_channels: int = 4,
                 mlp_ratio: float = 4.0, class_dropout_prob: float = 0.1, num_classes: int = 1000,
                 learn_sigma: bool = True, with_cp: bool = False, init_cfg: dict | None = None) -> None:
        cfg = resolve_arch(arch, ARCHS, 'DiT')
        super().__init__(input_size, patch_size, in_channels, cfg['hidden_size'], class_dropout_prob, num_classes,
                         learn_sigma, with_cp, init_cfg)
        self.blocks = nn.ModuleList(DiTBlock(cfg['hidden_size'], cfg['num_heads'], mlp_ratio)
                                    for _ in range(cfg['depth']))
        self.initialize_weights()
