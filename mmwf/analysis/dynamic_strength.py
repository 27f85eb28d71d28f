"""Dynamic strength r = ||dW||_F / ||W0||_F of every dynamic layer (WeightFormer paper, Appendix A.1): how far the
predicted update moves a layer's static weight, per image."""
from __future__ import annotations

import statistics

import torch
import torch.nn as nn


def dynamic_layers(backbone: nn.Module) -> dict[str, nn.Module]:
    """Modules with a predicted weight update (DynamicLinear, DynamicDWConv and their strategies)."""
    return {name: m for name, m in backbone.named_modules() if hasattr(m, 'effective_delta')}


def dynamic_strength(backbone: nn.Module, images: torch.Tensor, batch_size: int = 4,
                     progress: bool = False) -> dict[str, list[float]]:
    """r per layer and image: ||update||_F / ||w||_F, the update being what the layer adds to its static
    weight ``w`` (dW / (||dW|| + 1) in the release). Images (N, 3, H, W)."""
    layers = dynamic_layers(backbone)
    if not layers:
        raise ValueError(f'{type(backbone).__name__} has no dynamic layers (a static baseline or a ViT?)')
    ratios: dict[str, list[float]] = {name: [] for name in layers}

    def hook(name: str):
        def record(module: nn.Module, args: tuple) -> None:
            update = module.effective_delta(*args)
            ratios[name].extend((update.flatten(1).norm(dim=1) / module.w.norm()).tolist())
        return record

    handles = [m.register_forward_pre_hook(hook(name)) for name, m in layers.items()]
    try:
        with torch.no_grad():
            for start in range(0, len(images), batch_size):
                backbone(images[start:start + batch_size])
                if progress:
                    print(f'dynamic strength: {min(start + batch_size, len(images))}/{len(images)} images',
                          flush=True)
    finally:
        for h in handles:
            h.remove()
    return ratios


def strength_table(ratios: dict[str, list[float]]) -> str:
    """Markdown: layer, mean r, std, min, max over images."""
    lines = ['| layer | mean r | std | min | max |', '|---|---|---|---|---|']
    for name, rs in ratios.items():
        std = statistics.stdev(rs) if len(rs) > 1 else 0.0
        lines.append(f'| {name} | {statistics.fmean(rs):.4f} | {std:.4f} | {min(rs):.4f} | {max(rs):.4f} |')
    return '\n'.join(lines)


def save_strength_png(ratios: dict[str, list[float]], path: str) -> None:
    """Mean r (with std) per dynamic layer, in network order."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    names = list(ratios)
    means = [statistics.fmean(ratios[n]) for n in names]
    stds = [statistics.stdev(ratios[n]) if len(ratios[n]) > 1 else 0.0 for n in names]
    fig, ax = plt.subplots(figsize=(max(6, 0.5 * len(names)), 4))
    ax.bar(range(len(names)), means, yerr=stds, color=['tab:blue' if 'linear' in n else 'tab:orange' for n in names])
    ax.set_xticks(range(len(names)), names, rotation=60, ha='right', fontsize=8)
    ax.set_yscale('log')
    ax.set_ylabel('r = ||dW||_F / ||W0||_F (log)')
    ax.set_title('r per dynamic layer (blue: linear, orange: DWConv)')
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
