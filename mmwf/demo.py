"""What only the demos need (not imported by ``import mmwf``)."""
from __future__ import annotations

import torch

from mmwf.models.backbones import DeiT
from mmwf.utils.checkpoint import atomic_save


def write_softmax_stand_in(path: str, seed: int = 0) -> None:
    """Write a seeded, randomly initialised softmax DeiT-T (timm's keys, class token, final norm) to ``path``: the
    stand-in for the ImageNet checkpoint in the transfer / distillation demos (``data/demo/checkpoints``)."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        atomic_save(DeiT('t').state_dict(), path)
