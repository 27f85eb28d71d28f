"""Where a block's time goes, by engine: the token mixer (DeiT's attention operator, WeightFormer's dynamic
depthwise conv) against the channel mixer (DeiT's MLP, WeightFormer's MLP with its dynamic linears) of one block,
across sequence lengths, and the length at which the token mixer starts to cost more."""
from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn as nn

Mixer = Callable[[torch.Tensor], torch.Tensor]


def block_engines(name: str, hw: tuple[int, int]) -> tuple[nn.Module, Mixer, Mixer]:
    """(block, token mixer, channel mixer) of one block of the classifier ``name``
    (:func:`~.models.classifier_config`: ``deit_t_softmax``, ``deit_t_relu``, ``weightformer_t``, ...) on an ``hw``
    grid; for WeightFormer its first dynamic block. Each mixer maps the normalised tokens (B, H*W, C) its branch
    receives to the branch's output, residual excluded:
    ``x' = x + token(norm1(x))``, ``block(x) = x' + channel(norm2(x'))`` (a WeightFormer dynamic block normalises
    the stream first: ``x' = norm1(x) + token(norm1(x))``)."""
    from .models import build_backbone
    backbone = build_backbone(name)
    if type(backbone).__name__ == 'DeiT':
        block = backbone.blocks[0]
        return block, lambda x: block.attn(x, hw), block.mlp
    block = next(b for b in backbone.blocks if type(b.dwc).__name__ != 'StaticDWConv')
    return block, lambda x: block.dwc(x, hw), lambda z: block.channel_mixer(z, hw)


def crossover(lengths: list[int], token: list[float], channel: list[float]) -> float | None:
    """The sequence length from which on the token mixer's time exceeds the channel mixer's at every measured
    length: the log-ratio log(token / channel) interpolated linearly in log length across its last rise through 0;
    the first length if it is above everywhere; None if it is not above at the last length."""
    ratios = [math.log(t / c) for t, c in zip(token, channel)]
    if ratios[-1] <= 0:
        return None
    below = [i for i, r in enumerate(ratios) if r <= 0]
    if not below:
        return float(lengths[0])
    i = below[-1]
    f = -ratios[i] / (ratios[i + 1] - ratios[i])
    return math.exp(math.log(lengths[i]) + f * (math.log(lengths[i + 1]) - math.log(lengths[i])))
