"""Which checkpoint ``--resume`` takes: the current run's, and only a resume point.

A resume point is a checkpoint that holds the whole training state (:func:`resume_point_missing`): the model, the
optimizer, the message hub and, where the run has them, the parameter schedulers. mmengine's best checkpoints
(``save_best``: written without optimizer and schedulers), EMA-only and weights-only files are not; they load with
``load_from``. mmengine's ``CheckpointHook`` writes ``last_checkpoint`` (the path of the newest save) into the work
dir after each checkpoint, so it always names a checkpoint of the run that saved last, even when files of an
earlier run are left in the same folder. :func:`resume_checkpoint` resumes that file. Only when it is damaged,
missing or not a resume point (a run killed while saving) does it fall back, to the newest complete resume point of
the same run: one whose ``meta['run_id']`` equals the id that :class:`~mmwf.engine.hooks.SafeCheckpointHook`
recorded beside the checkpoints at that save.
"""
from __future__ import annotations

import glob
import os.path as osp
import re

from mmwf.utils.checkpoint import CheckpointError, checkpoint_problem, load_weights_only

from .hooks.runner_state import resume_point_missing
from .hooks.safe_checkpoint import RUN_FILE


def _number(path: str) -> int:
    found = re.search(r'(\d+)\.pth$', osp.basename(path))
    return int(found.group(1)) if found else -1


def _read(path: str) -> tuple[str | None, dict]:
    """The run id of a checkpoint and the checkpoint (memory-mapped)."""
    ckpt = load_weights_only(path, mmap=True)
    ckpt = ckpt if isinstance(ckpt, dict) else {}
    return (ckpt.get('meta') or {}).get('run_id'), ckpt


def resume_checkpoint(work_dir: str, *, schedulers: bool) -> tuple[str | None, list[str]]:
    """The checkpoint to resume in ``work_dir`` (None: nothing was saved, train from scratch) and the lines to log
    about what was skipped and which file was taken, and why. ``schedulers``: the run has parameter schedulers, so a
    resume point must hold theirs. A last checkpoint that is damaged or not a resume point, whose run left no other
    complete resume point, or whose run is not recorded, is a :class:`CheckpointError` listing what is there."""
    last_file = osp.join(work_dir, 'last_checkpoint')
    if not osp.isfile(last_file):
        return None, [f'resume: nothing to resume in {work_dir}: no last_checkpoint (no checkpoint was saved there). '
                      'Training from scratch.']
    with open(last_file) as f:
        named = f.read().strip()
    problem = checkpoint_problem(named) if osp.isfile(named) else None
    if osp.isfile(named) and problem is None:
        missing = resume_point_missing(_read(named)[1], schedulers)
        if not missing:
            return named, []
        why = f'it is not a resume point (it lacks the {", ".join(missing)} state)'
    else:
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
            continue
        run_id, ckpt = _read(path)
        if run_id != run:
            continue
        missing = resume_point_missing(ckpt, schedulers)
        if missing:
            notes.append(f'not resuming from {path}: it is not a resume point (it lacks the {", ".join(missing)} '
                         'state: a best, EMA or weights-only checkpoint; load_from=PATH starts from its weights)')
            continue
        notes.append(f'resuming from {path}: the newest complete resume point of the same run (model, optimizer, '
                     'message hub and schedulers)')
        return path, notes
    raise CheckpointError(f'cannot resume in {work_dir}: last_checkpoint names {named}, but {why}, and no other '
                          f'complete resume point of that run is left (checkpoints there: {listing}). Start a new '
                          'run (load_from=PATH starts from a checkpoint\'s weights), or resume a checkpoint of '
                          'another run explicitly: --resume PATH.', why)
