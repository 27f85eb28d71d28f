"""Effective receptive field (Luo et al., 2016; as RepLKNet and the WeightFormer paper's Figure 3 plot it): the
gradient of the centre output of a feature map with respect to the input pixels, averaged over images."""
from __future__ import annotations

import numpy as np
import torch
import torch.nn as nn


def feature_map(backbone: nn.Module, x: torch.Tensor, out_index: int = -1) -> torch.Tensor:
    """The backbone's output map (B, C, h, w); ``out_index`` picks one of several outputs."""
    out = backbone(x)
    return out[out_index] if isinstance(out, (tuple, list)) else out


def effective_receptive_field(backbone: nn.Module, images: torch.Tensor, out_index: int = -1,
                              progress: bool = False) -> np.ndarray:
    """Mean over images of sum_channels |d (sum_c ReLU(F[c, h/2, w/2])) / d x|: (H, W), images (N, 3, H, W). The
    centre's ReLU is RepLKNet's (``get_input_grad``): over a final LayerNorm's channels F sums to zero whatever x is,
    so without it the gradient is rounding noise. Its input gradient is taken whole (|.|), not its positive part."""
    total = torch.zeros(images.shape[-2:], dtype=torch.float64)
    for i, image in enumerate(images):
        x = image[None].clone().requires_grad_()
        feats = feature_map(backbone, x, out_index)
        centre = torch.relu(feats[:, :, feats.shape[2] // 2, feats.shape[3] // 2]).sum()
        (grad,) = torch.autograd.grad(centre, x)
        total += grad[0].abs().sum(0).double().cpu()
        if progress:
            print(f'erf: image {i + 1}/{len(images)}', flush=True)
    return (total / len(images)).numpy()


def area_ratio(erf: np.ndarray, threshold: float) -> float:
    """Smallest centred square holding ``threshold`` of the total contribution, as a fraction of the image
    area (RepLKNet's high-contribution area ratio; on log10(erf + 1) scaled to [0, 1], as they plot it)."""
    scores = np.log10(erf / erf.max() * 1e3 + 1) if erf.max() > 0 else erf
    H, W = scores.shape
    cy, cx, total = H // 2, W // 2, scores.sum()
    for r in range(max(H, W)):
        window = scores[max(cy - r, 0):cy + r + 1, max(cx - r, 0):cx + r + 1]
        if window.sum() >= threshold * total:
            return window.size / scores.size
    return 1.0


def outside_fraction(erf: np.ndarray, radius: int) -> float:
    """Share of the raw contribution outside the centred square of half-side ``radius`` pixels."""
    H, W = erf.shape
    cy, cx = H // 2, W // 2
    inside = erf[max(cy - radius, 0):cy + radius + 1, max(cx - radius, 0):cx + radius + 1].sum()
    return float(1 - inside / erf.sum())


def save_erf_png(maps: dict[str, np.ndarray], path: str) -> None:
    """One panel per map: log10 of the contribution, scaled to [0, 1] per panel (Figure 3's style)."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(maps), figsize=(4 * len(maps), 4), squeeze=False)
    for ax, (title, erf) in zip(axes[0], maps.items()):
        scores = np.log10(erf / max(erf.max(), 1e-30) * 1e3 + 1)
        ax.imshow(scores / max(scores.max(), 1e-30), cmap='RdYlGn', vmin=0, vmax=1)
        ax.set_title(title)
        ax.axis('off')
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
