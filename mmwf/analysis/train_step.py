"""A training step of a classifier (the ImageNet recipe: cross-entropy, AdamW, mixed precision) or of a dense
backbone with its SimpleFeaturePyramid (the Cascade configs' backbone + neck), built from torch, timm and mmengine
alone, for timing on any device (``tools/analysis/benchmark.py train``)."""
from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from mmwf.analysis.protocol import EAGER_FP32, Protocol
from mmwf.analysis.timing import training_step

PARTS = ('classifier', 'backbone+pyramid')


def train_step(name: str, part: str, batch: int, size: int, device: str, amp: bool,
               network: nn.Module | None = None,
               protocol: Protocol = EAGER_FP32) -> tuple[Callable[[], torch.Tensor], nn.Module]:
    """One training step of model ``name`` (a name of :func:`mmwf.analysis.models.classifier_config`) as ``part``:
    forward, loss, backward, AdamW step, on a fixed random batch (batch, 3, size, size), returning the loss; and the
    model it trains (:func:`~mmwf.analysis.timing.training_step`; ``amp``: fp16 with a dynamic loss scale on CUDA,
    bf16 on the CPU). ``network``: a classifier (images -> logits) from elsewhere (a reference's) trained instead
    of ``name``'s. ``protocol``: bf16 autocast instead of ``amp``, and the compile mode of the network (the
    classifier, or the backbone and the pyramid each, as the dense configs compile them)."""
    from mmwf.analysis.models import backbone_config, classifier_config, with_kernels
    from mmwf.models.necks import SimpleFeaturePyramid
    from mmwf.registry import MODELS
    if part not in PARTS:
        raise ValueError(f'part must be one of {PARTS}, got {part!r}')
    if amp and protocol.dtype == 'bf16':
        raise ValueError('amp (fp16 with a loss scale) and the protocol\'s bf16 autocast exclude each other')
    if network is not None:
        if part != 'classifier':
            raise ValueError(f'a given network trains as a classifier, not as {part!r}')
        model = network
        forward = protocol.prepare(model)
    elif part == 'classifier':
        model = with_kernels(MODELS.build(dict(classifier_config(name), out_type='timm')), name)
        forward = protocol.prepare(model)
    else:
        cfg = backbone_config(name)
        backbone = with_kernels(MODELS.build(dict(cfg, out_indices=(-1,), final_norm=False)), name)
        neck = SimpleFeaturePyramid(backbone.embed_dims)
        model = nn.ModuleList([backbone, neck])
        compiled_backbone, compiled_neck = protocol.prepare(backbone), protocol.prepare(neck)

        def forward(x):
            return compiled_neck(compiled_backbone(x))
    model = model.to(device).train()
    x = torch.randn(batch, 3, size, size, device=device)
    target = torch.randint(0, 1000, (batch,), device=device)

    def loss() -> torch.Tensor:
        out = forward(x)
        return F.cross_entropy(out, target) if part == 'classifier' else sum(o.float().square().mean() for o in out)
    if protocol.dtype == 'bf16':
        dtype = torch.bfloat16
    else:
        dtype = (torch.float16 if device.startswith('cuda') else torch.bfloat16) if amp else None
    return training_step(model.parameters(), loss, device, dtype), model
