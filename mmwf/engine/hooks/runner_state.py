"""What the checkpoint and dataset hooks read from a runner. mmengine's ``Runner`` and ``FlexibleRunner`` keep it in
the same attributes; reading them here keeps every such access in one place."""
from __future__ import annotations

from mmengine.runner import BaseLoop


def is_resuming(runner) -> bool:
    """Whether the runner's checkpoint load is a resume (``resume=True``) rather than ``load_from``."""
    return bool(runner._resume)


def built_datasets(runner) -> dict[str, object]:
    """The datasets of the loops the runner has built (``'train'``, ``'val'``, ``'test'``): those of the run."""
    loops = (('train', runner._train_loop), ('val', runner._val_loop), ('test', runner._test_loop))
    return {split: loop.dataloader.dataset for split, loop in loops if isinstance(loop, BaseLoop)}
