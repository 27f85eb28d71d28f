"""Tokens on a patch grid: the patch-embedding stem, token <-> map views, block partitions, position tables.

Tokens are (B, H*W, C) in raster order on an H x W grid (``hw``); maps are (B, C, H, W).
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from timm.layers import resample_abs_pos_embed


class PatchEmbed(nn.Module):
    """Non-overlapping patches -> tokens: ``proj`` Conv2d(in_channels, embed_dims, p, stride p), as timm's
    ``PatchEmbed`` (keys ``<name>.proj.*``: the backbones' ``patch_embed``, the denoisers' ``x_embedder``), without
    flattening: :meth:`forward` returns the map.

    Args:
        in_channels (int): image channels.
        embed_dims (int): token channels C.
        patch_size (int): patch side p.
    """

    def __init__(self, in_channels: int, embed_dims: int, patch_size: int) -> None:
        super().__init__()
        self.proj = nn.Conv2d(in_channels, embed_dims, patch_size, stride=patch_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Images (B, in_channels, H, W) -> map (B, C, H/p, W/p) (floor)."""
        return self.proj(x)


def tokens_to_map(x: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
    """(B, H*W, C) tokens -> (B, C, H, W) view in channels-last memory (no copy)."""
    return x.unflatten(1, hw).permute(0, 3, 1, 2)


def map_to_tokens(x: torch.Tensor) -> torch.Tensor:
    """(B, C, H, W) -> (B, H*W, C); free when ``x`` is channels-last."""
    return x.permute(0, 2, 3, 1).flatten(1, 2)


def pool_tokens(x: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
    """AvgPool2d(2) of the token grid (floor for odd sizes), back as tokens (B, N', C)."""
    return map_to_tokens(F.avg_pool2d(tokens_to_map(x, hw), 2))


def partition(x: torch.Tensor, hw: tuple[int, int], block: tuple[int, int],
              layout: tuple[int, int] | None = None) -> torch.Tensor:
    """Raster tokens (*, H*W, C) -> blocks (*, nh*nw, bh*bw, C) of ``block`` = (bh, bw) tokens in a ``layout`` of
    (nh, nw) blocks (default: as many as cover the grid); the grid is zero-padded at the bottom and right, blocks
    and the tokens in a block are row-major.

    ViTDet's window attention (fixed block size) and MHLA (fixed block layout) both use it."""
    (H, W), (bh, bw) = hw, block
    nh, nw = layout or ((H + bh - 1) // bh, (W + bw - 1) // bw)  # ceil; no negative floor division (ONNX)
    lead, C = x.shape[:-2], x.shape[-1]
    x = F.pad(x.reshape(*lead, H, W, C), (0, 0, 0, nw * bw - W, 0, nh * bh - H))
    x = x.reshape(*lead, nh, bh, nw, bw, C).transpose(-4, -3)
    return x.reshape(*lead, nh * nw, bh * bw, C)


def unpartition(x: torch.Tensor, hw: tuple[int, int], block: tuple[int, int],
                layout: tuple[int, int] | None = None) -> torch.Tensor:
    """Inverse of :func:`partition`: (*, nh*nw, bh*bw, C) -> raster tokens (*, H*W, C), padding removed."""
    (H, W), (bh, bw) = hw, block
    nh, nw = layout or ((H + bh - 1) // bh, (W + bw - 1) // bw)  # ceil; no negative floor division (ONNX)
    lead, C = x.shape[:-3], x.shape[-1]
    x = x.reshape(*lead, nh, nw, bh, bw, C).transpose(-4, -3).reshape(*lead, nh * bh, nw * bw, C)
    return x[..., :H, :W, :].reshape(*lead, H * W, C)


def resample_pos_embed(pos: torch.Tensor, grid: int) -> torch.Tensor:
    """A checkpoint's position table (1, 1 + g*g, C) -> (1, 1 + grid*grid, C): timm's ``resample_abs_pos_embed``
    (as its ``checkpoint_filter_fn``: the patch part bicubic with antialiasing, the class slot kept), once the table
    is checked to be a class slot plus a square grid (timm would take the floor of a non-square root)."""
    g = int(round((pos.shape[1] - 1) ** 0.5))
    if pos.dim() != 3 or g * g != pos.shape[1] - 1:
        raise ValueError(f'pos_embed of shape {tuple(pos.shape)} is not a class slot plus a square grid')
    return resample_abs_pos_embed(pos, (grid, grid), (g, g), num_prefix_tokens=1, antialias=True)
