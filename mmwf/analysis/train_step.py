"""A training step of a classifier (the ImageNet recipe: cross-entropy, AdamW, mixed precision) or of a dense
backbone with its SimpleFeaturePyramid (the Cascade configs' backbone + neck), built from torch, timm and mmengine
alone, for timing on any device (``tools/analysis/train_step_benchmark.py``)."""
from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

PARTS = ('classifier', 'backbone+pyramid')


def train_step(name: str, part: str, batch: int, size: int, device: str, amp: bool,
               network: nn.Module | None = None) -> tuple[Callable[[], torch.Tensor], nn.Module]:
    """One training step of model ``name`` (a name of :func:`mmwf.analysis.models.classifier_config`) as ``part``:
    forward, loss, backward, AdamW step, on a fixed random batch (batch, 3, size, size), returning the loss; and the
    model it trains. With ``amp`` on CUDA the step scales the loss dynamically (fp16, as AmpOptimWrapper), and its
    GradScaler is the step's attribute ``scaler``: a scale that keeps falling means every step is skipped for
    non-finite gradients. ``network``: a classifier (images -> logits) from elsewhere (a reference's) trained instead
    of ``name``'s."""
    from mmwf.analysis.models import backbone_config, classifier_config
    from mmwf.models.necks import SimpleFeaturePyramid
    from mmwf.registry import MODELS
    if part not in PARTS:
        raise ValueError(f'part must be one of {PARTS}, got {part!r}')
    if network is not None:
        if part != 'classifier':
            raise ValueError(f'a given network trains as a classifier, not as {part!r}')
        model = forward = network
    elif part == 'classifier':
        backbone = MODELS.build(classifier_config(name))
        model = backbone
        forward = backbone.forward_classifier
    else:
        cfg = backbone_config(name)
        backbone = MODELS.build(dict(cfg, out_indices=(-1,), final_norm=False))
        neck = SimpleFeaturePyramid(backbone.embed_dims)
        model = nn.ModuleList([backbone, neck])

        def forward(x):
            return neck(backbone(x))
    model = model.to(device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    scaler = torch.amp.GradScaler(device, enabled=amp and device.startswith('cuda'))
    x = torch.randn(batch, 3, size, size, device=device)
    target = torch.randint(0, 1000, (batch,), device=device)

    def step() -> torch.Tensor:
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device.split(':')[0], dtype=torch.float16 if device.startswith('cuda') else torch.bfloat16,
                            enabled=amp):
            out = forward(x)
            loss = (F.cross_entropy(out, target) if part == 'classifier'
                    else sum(o.float().square().mean() for o in out))
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        return loss.detach()
    step.scaler = scaler
    return step, model
