"""Pieces shared by the class-conditional diffusion transformers (DiT, Peebles & Xie 2023, and WeightFormer-DiT, the
WeightFormer paper's section 5.4), in DiT's layout and state-dict keys: timestep and label embedders, adaLN
modulation, the fixed 2-D sin-cos position table, the final layer and the skeleton around the blocks.

Shapes: latents or images x (B, C, H, W) on a grid of (H / p) x (W / p) tokens of width D; timesteps t (B,);
labels y (B,) in [0, num_classes), ``num_classes`` being the dropped (unconditional) label.
"""
from __future__ import annotations

import math
from collections import deque

import torch
import torch.nn as nn
from mmengine.model import BaseModule

from mmwf.models.layers import PatchEmbed, run_blocks


def modulate(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """adaLN: x (B, N, D) * (1 + scale) + shift, scale / shift (B, D), in one pass over x."""
    return torch.addcmul(shift.unsqueeze(1), x, 1 + scale.unsqueeze(1))


def gated(x: torch.Tensor, gate: torch.Tensor, y: torch.Tensor, inplace: bool = False) -> torch.Tensor:
    """The gated residual x + gate * y, x and y (B, N, D), gate (B, D), in one pass (``inplace``: into y, a branch's
    fresh output no one else holds, at inference)."""
    return torch.addcmul(x, gate.unsqueeze(1), y, out=y) if inplace else torch.addcmul(x, gate.unsqueeze(1), y)


def timestep_embedding(t: torch.Tensor, dim: int, max_period: float = 10000.0) -> torch.Tensor:
    """GLIDE's sinusoidal embedding of (possibly fractional) timesteps t (B,) -> (B, dim): [cos(t f), sin(t f)],
    f_i = max_period^(-i / (dim / 2)); an odd ``dim`` ends with a zero."""
    half = dim // 2
    freqs = torch.exp(-math.log(max_period) * torch.arange(half, dtype=torch.float32, device=t.device) / half)
    args = t[:, None].float() * freqs[None]
    emb = torch.cat([torch.cos(args), torch.sin(args)], dim=-1)
    return torch.cat([emb, torch.zeros_like(emb[:, :1])], dim=-1) if dim % 2 else emb


def sincos_pos_embed_2d(dim: int, grid: int) -> torch.Tensor:
    """MAE's fixed 2-D sin-cos table (grid*grid, dim): the first half encodes the column (x), the second the row,
    each as [sin(pos w), cos(pos w)] with w_i = 10000^(-i / (dim / 4)), computed in float64."""
    if dim % 4:
        raise ValueError(f'the 2-D sin-cos position table needs a width divisible by 4, got {dim}')
    omega = 1.0 / 10000 ** (torch.arange(dim // 4, dtype=torch.float64) / (dim / 4))
    rows, cols = torch.meshgrid(torch.arange(grid, dtype=torch.float64), torch.arange(grid, dtype=torch.float64),
                                indexing='ij')

    def encode(pos: torch.Tensor) -> torch.Tensor:
        out = pos.reshape(-1, 1) * omega
        return torch.cat([torch.sin(out), torch.cos(out)], 1)
    return torch.cat([encode(cols), encode(rows)], 1).float()


class TimestepEmbedder(nn.Module):
    """t (B,) -> (B, D): the 256-wide sinusoidal embedding through Linear -> SiLU -> Linear (``mlp.0``, ``mlp.2``)."""

    def __init__(self, hidden_size: int, frequency_embedding_size: int = 256) -> None:
        super().__init__()
        self.frequency_embedding_size = frequency_embedding_size
        self.mlp = nn.Sequential(nn.Linear(frequency_embedding_size, hidden_size), nn.SiLU(),
                                 nn.Linear(hidden_size, hidden_size))

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        return self.mlp(timestep_embedding(t, self.frequency_embedding_size).to(self.mlp[0].weight.dtype))


class LabelEmbedder(nn.Module):
    """y (B,) -> (B, D) from ``embedding_table`` (num_classes + 1 rows when labels are dropped: the last is the
    unconditional label of classifier-free guidance); in training each label is dropped with ``dropout_prob``."""

    def __init__(self, num_classes: int, hidden_size: int, dropout_prob: float) -> None:
        super().__init__()
        self.num_classes, self.dropout_prob = num_classes, dropout_prob
        self.embedding_table = nn.Embedding(num_classes + int(dropout_prob > 0), hidden_size)

    def forward(self, labels: torch.Tensor, train: bool, force_drop_ids: torch.Tensor | None = None) -> torch.Tensor:
        if (train and self.dropout_prob > 0) or force_drop_ids is not None:
            drop = (torch.rand(labels.shape[0], device=labels.device) < self.dropout_prob
                    if force_drop_ids is None else force_drop_ids == 1)
            labels = torch.where(drop, self.num_classes, labels)
        return self.embedding_table(labels)


class FinalLayer(nn.Module):
    """Tokens (B, N, D) -> (B, N, p*p*C_out): non-affine LayerNorm, adaLN shift / scale, Linear."""

    def __init__(self, hidden_size: int, patch_size: int, out_channels: int) -> None:
        super().__init__()
        self.norm_final = nn.LayerNorm(hidden_size, elementwise_affine=False, eps=1e-6)
        self.linear = nn.Linear(hidden_size, patch_size * patch_size * out_channels)
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(hidden_size, 2 * hidden_size))

    def forward(self, x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        shift, scale = self.adaLN_modulation(c).chunk(2, dim=1)
        return self.linear(modulate(self.norm_final(x), shift, scale))


class DiffusionTransformer(BaseModule):
    """DiT's skeleton: patch embedding + fixed sin-cos positions, conditioning c = t_embed(t) + y_embed(y), the
    family's blocks (``self.blocks``, each called as ``block(x, c, hw)``), the final layer and unpatchify. With
    ``learn_sigma`` the output has 2C channels: the noise prediction, then the variance interpolation values.

    Args:
        input_size (int): side of the square latent / image. Defaults to 32 (256 px through the VAE).
        patch_size (int): p. Defaults to 2.
        in_channels (int): C. Defaults to 4 (VAE latents).
        hidden_size (int): D.
        class_dropout_prob (float): label dropout for classifier-free guidance. Defaults to 0.1.
        num_classes (int): classes. Defaults to 1000.
        learn_sigma (bool): predict the variance too. Defaults to True.
        with_cp (bool): activation checkpointing of every block while training (fast-DiT's gradient
            checkpointing): the same gradients, activation memory of one block plus the blocks' inputs. Defaults
            to False.
        init_cfg (dict, optional): mmengine init config. Defaults to None.
    """

    def __init__(self, input_size: int, patch_size: int, in_channels: int, hidden_size: int,
                 class_dropout_prob: float, num_classes: int, learn_sigma: bool, with_cp: bool = False,
                 init_cfg: dict | None = None) -> None:
        super().__init__(init_cfg=init_cfg)
        if input_size % patch_size:
            raise ValueError(f'input_size {input_size} is not a multiple of patch_size {patch_size}')
        self.input_size, self.patch_size, self.in_channels = input_size, patch_size, in_channels
        self.learn_sigma, self.num_classes, self.hidden_size = learn_sigma, num_classes, hidden_size
        self.with_cp = with_cp
        self.out_channels = in_channels * 2 if learn_sigma else in_channels
        self.x_embedder = PatchEmbed(in_channels, hidden_size, patch_size)
        self.t_embedder = TimestepEmbedder(hidden_size)
        self.y_embedder = LabelEmbedder(num_classes, hidden_size, class_dropout_prob)
        self.grid = input_size // patch_size
        self.pos_embed = nn.Parameter(torch.zeros(1, self.grid ** 2, hidden_size), requires_grad=False)
        self.final_layer = FinalLayer(hidden_size, patch_size, self.out_channels)

    def initialize_weights(self) -> None:
        """DiT's ``initialize_weights`` (the release's for WF-DiT is the same): xavier-uniform on every nn.Linear
        (zero bias), the sin-cos table, the patch conv as a Linear with a zero bias, normal(0.02) label table and
        timestep MLP weights, zero adaLN and output layers."""
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.xavier_uniform_(m.weight)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
        self.pos_embed.data.copy_(sincos_pos_embed_2d(self.hidden_size, self.grid).unsqueeze(0))
        w = self.x_embedder.proj.weight.data
        nn.init.xavier_uniform_(w.view(w.shape[0], -1))
        nn.init.zeros_(self.x_embedder.proj.bias)
        nn.init.normal_(self.y_embedder.embedding_table.weight, std=0.02)
        nn.init.normal_(self.t_embedder.mlp[0].weight, std=0.02)
        nn.init.normal_(self.t_embedder.mlp[2].weight, std=0.02)
        for block in self.blocks:
            nn.init.zeros_(block.adaLN_modulation[-1].weight)
            nn.init.zeros_(block.adaLN_modulation[-1].bias)
        for m in (self.final_layer.adaLN_modulation[-1], self.final_layer.linear):
            nn.init.zeros_(m.weight)
            nn.init.zeros_(m.bias)

    def unpatchify(self, x: torch.Tensor) -> torch.Tensor:
        """(B, N, p*p*C_out) -> (B, C_out, H, W)."""
        p, c, g = self.patch_size, self.out_channels, self.grid
        x = x.reshape(x.shape[0], g, g, p, p, c)
        return torch.einsum('nhwpqc->nchpwq', x).reshape(x.shape[0], c, g * p, g * p)

    def forward(self, x: torch.Tensor, t: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """x (B, C, H, W), t (B,), y (B,) -> (B, C_out, H, W)."""
        if x.shape[-2:] != (self.input_size, self.input_size):
            raise ValueError(f'{type(self).__name__} was built for {self.input_size} x {self.input_size} inputs, got '
                             f'{tuple(x.shape[-2:])}: set input_size')
        tokens = self.x_embedder(x).flatten(2).transpose(1, 2) + self.pos_embed
        c = self.t_embedder(t) + self.y_embedder(y, self.training)
        _, tokens = deque(run_blocks(self.blocks, tokens, c, (self.grid, self.grid), with_cp=self.with_cp),
                          maxlen=1)[0]  # the last output, none kept
        return self.unpatchify(self.final_layer(tokens, c))

    def forward_with_cfg(self, x: torch.Tensor, t: torch.Tensor, y: torch.Tensor, cfg_scale: float,
                         guided_channels: int = 3) -> torch.Tensor:
        """Classifier-free guidance: x is [x_half; x_half] with y [labels; num_classes]; the noise prediction of both
        halves becomes uncond + cfg_scale * (cond - uncond) on the first ``guided_channels`` channels (3, as DiT's
        and the release's sample.py do "for exact reproducibility"; ``in_channels`` is the standard form); the rest
        (the last latent channel, the variance values) is the model's."""
        half = x[: len(x) // 2]
        out = self.forward(torch.cat([half, half]), t, y)
        eps, rest = out[:, :guided_channels], out[:, guided_channels:]
        cond, uncond = eps.chunk(2)
        guided = uncond + cfg_scale * (cond - uncond)
        return torch.cat([torch.cat([guided, guided]), rest], dim=1)
