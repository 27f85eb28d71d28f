"""Which checkpoint ``--resume`` takes: the current run's.

mmengine's ``CheckpointHook`` writes ``last_checkpoint`` (the path of the newest save) into the work dir after each
checkpoint, so it always names a checkpoint of the run that saved last, even when files of an earlier run are left
in the same folder. :func:`resume_checkpoint` resumes that file. Only when it is damaged or missing (a run killed
while saving) does it fall back, to the newest complete checkpoint of the same run: one whose ``meta['run_id']``
equals the id that :class:`~mmwf.engine.hooks.SafeCheckpointHook` recorded beside the checkpoints at that save.
"""
from __future__ import annotations

import glob
import os.path as osp
import re

from mmwf.utils.checkpoint import CheckpointError, checkpoint_problem, load_weights_only

from .hooks.safe_checkpoint import RUN_FILE


def _number(path: str) -> int:
    found = re.search(r'(\d+)\.pth$', osp.basename(path))
    return int(found.group(1)) if found else -1


def _run_of(path: str) -> str | None:
    ckpt = load_weights_only(path, mmap=True)
    return ((ckpt.get('meta') or {}) if isinstance(ckpt, dict) else {}).get('run_id')


def resume_checkpoint(work_dir: str) -> tuple[str | None, list[str]]:
    """The checkpoint to resume in ``work_dir`` (None: nothing was saved, train from scratch) and the lines to log
    about what was skipped. A damaged last checkpoint whose run left no other complete checkpoint, or whose run is
    not recorded, is a :class:`CheckpointError` listing what is there."""
    last_file = osp.join(work_dir, 'last_checkpoint')
    if not osp.isfile(last_file):
        return None, [f'resume: nothing to resume in {work_dir}: no last_checkpoint (no checkpoint was saved there). '
                      'Training from scratch.']
    with open(last_file) as f:
        named = f.read().strip()
    problem = checkpoint_problem(named) if osp.isfile(named) else None
    if osp.isfile(named) and problem is None:
        return named, []
    why = problem.what if problem else 'the file does not exist'
    notes = [f'cannot resume from {named}: {why}']
    folder = osp.dirname(named)
    run_file = osp.join(folder, RUN_FILE)
    others = sorted((p for p in glob.glob(osp.join(glob.escape(folder), '*.pth')) if p != named), key=_number,
                    reverse=True)
    listing = ', '.join(osp.basename(p) for p in others[:8]) or 'none'
    if not osp.isfile(run_file):
        raise CheckpointError(f'cannot resume in {work_dir}: last_checkpoint names {named}, but {why}, and no record '
                              f'says which other checkpoints belong to that run ({RUN_FILE} is missing; the run was '
                              f'not written with SafeCheckpointHook). Checkpoints there: {listing}. Resume one '
                              'explicitly: --resume PATH.', why)
    with open(run_file) as f:
        run = f.read().strip()
    for path in others:
        other_problem = checkpoint_problem(path)
        if other_problem is not None:
            notes.append(f'cannot resume from {path}: {other_problem.what}')
        elif _run_of(path) == run:
            notes.append(f'resuming from {path}, the newest complete checkpoint of the same run')
            return path, notes
    raise CheckpointError(f'cannot resume in {work_dir}: last_checkpoint names {named}, but {why}, and no other '
                          f'complete checkpoint of that run is left (checkpoints there: {listing}). Start a new run, '
                          'or resume a checkpoint of another run explicitly: --resume PATH.', why)
