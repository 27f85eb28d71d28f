"""WeightFormer-DiT (the WeightFormer paper's section 5.4, Table 7): DiT with attention replaced by WeightFormer's
token mixing, in the release's layout and state-dict keys (``model/wfm_dit.py``), so that its checkpoints load.

Block i (15 of them) is dynamic when (i + 2) % 3 == 0 (i = 1, 4, 7, 10, 13): its first MLP linear is the Bilateral
dynamic linear (eq. 8) and its token mixer the Spatially Adaptive dynamic depthwise conv (eq. 11), the classifier's
layers; the other blocks use nn.Linear and a depthwise 3 x 3 conv. Unlike DiT's block, the residual stream itself
is normalised first (x = norm1(x)), as in the classifier.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn as nn

from mmwf.models.layers import (
    AdaptiveDynamicDWConv,
    BilateralDynamicLinear,
    StaticDWConv,
    StaticLinear,
    dynamic_block_ids,
    gelu_linear,
    has_forward_hooks,
    resolve_arch,
)
from mmwf.registry import MODELS

from .dit_utils import DiffusionTransformer, gated, modulate

# the release's DiT_{S,B}_{2,4,8}: 15 blocks
ARCHS = {'S': dict(hidden_size=384, depth=15), 'B': dict(hidden_size=768, depth=15)}


class WFDiTBlock(nn.Module):
    """x = norm1(x); x + gate1 * dwc(modulate(x)); x + gate2 * linear2(GELU_tanh(linear1(modulate(norm2(x))))).
    Tokens (B, N, D) on grid ``hw``, conditioning c (B, D)."""

    def __init__(self, hidden_size: int, mlp_ratio: float, dynamic: bool) -> None:
        super().__init__()
        hidden = int(hidden_size * mlp_ratio)
        self.norm1 = nn.LayerNorm(hidden_size, elementwise_affine=False, eps=1e-6)
        self.norm2 = nn.LayerNorm(hidden_size, elementwise_affine=False, eps=1e-6)
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(hidden_size, 6 * hidden_size))
        self.linear1 = (BilateralDynamicLinear(hidden_size, hidden) if dynamic else StaticLinear(hidden_size, hidden))
        self.dwc = AdaptiveDynamicDWConv(hidden_size) if dynamic else StaticDWConv(hidden_size)
        self.linear2 = nn.Linear(hidden, hidden_size)

    def forward(self, x: torch.Tensor, c: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
        shift1, scale1, gate1, shift2, scale2, gate2 = self.adaLN_modulation(c).chunk(6, dim=1)
        inplace = not torch.is_grad_enabled() and not has_forward_hooks(self)  # sampling: the blocks' memory rule
        x = self.norm1(x)
        x = gated(x, gate1, self.dwc(modulate(x, shift1, scale1), hw), inplace)
        h = self.linear1(modulate(self.norm2(x), shift2, scale2), hw)
        return gated(x, gate2, gelu_linear(h, self.linear2, 'tanh', inplace), inplace)


@MODELS.register_module()
class WeightFormerDiT(DiffusionTransformer):
    """WF-DiT-{S,B}/{2,4,8} (``arch``, ``patch_size``).

    Args:
        arch (str | dict): ``'S'``, ``'B'`` or a dict with ``hidden_size``, ``depth``. Defaults to ``'S'``.
        patch_size (int): 2, 4 or 8 in the paper. Defaults to 2.
        input_size (int): latent side (an even number of tokens a side: the Bilateral predictor pools 2 x 2).
            Defaults to 32.
        in_channels (int): latent channels. Defaults to 4.
        mlp_ratio (float): MLP width / D. Defaults to 4.
        dynamic_blocks (dict | Sequence[int]): see :func:`mmwf.models.layers.dynamic_block_ids`.
            Defaults to ``dict(every=3, offset=1)``, the release's (i + 2) % 3 == 0.
        class_dropout_prob (float): label dropout. Defaults to 0.1.
        num_classes (int): classes. Defaults to 1000.
        learn_sigma (bool): predict the variance too. Defaults to True.
        with_cp (bool): activation checkpointing of every block while training. Defaults to False.
        init_cfg (dict, optional): mmengine init config. Defaults to None.
    """

    def __init__(self, arch: str | dict = 'S', patch_size: int = 2, input_size: int = 32, in_channels: int = 4,
                 mlp_ratio: float = 4.0, dynamic_blocks: dict | Sequence[int] = dict(every=3, offset=1),
                 class_dropout_prob: float = 0.1, num_classes: int = 1000, learn_sigma: bool = True,
                 with_cp: bool = False, init_cfg: dict | None = None) -> None:
        cfg = resolve_arch(arch, ARCHS, 'WeightFormerDiT')
        super().__init__(input_size, patch_size, in_channels, cfg['hidden_size'], class_dropout_prob, num_classes,
                         learn_sigma, with_cp, init_cfg)
        self.dynamic_ids = dynamic_block_ids(dynamic_blocks, cfg['depth'])
        self.blocks = nn.ModuleList(WFDiTBlock(cfg['hidden_size'], mlp_ratio, i in self.dynamic_ids)
                                    for i in range(cfg['depth']))
        self.initialize_weights()  # after the dynamic layers' own trunc-normal init of w, b, w1, w2, as the release
