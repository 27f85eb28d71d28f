"""Checkpoints of an mmwf run that load weights-only and are written atomically, under any mmengine runner."""
from __future__ import annotations

import os
import uuid

from mmengine.dist import is_main_process
from mmengine.hooks import CheckpointHook, Hook

from mmwf.registry import HOOKS
from mmwf.utils.checkpoint import (
    ATOMIC_BACKEND,
    atomic_write,
    plain_checkpoint,
    register_atomic_backend,
    restore_checkpoint,
)

from .runner_state import is_resuming

RUN_FILE = '.mmwf_run'  # beside the checkpoints: the run id of the newest save


def checkpoint_folder(runner) -> str:
    """Where the runner's ``CheckpointHook`` writes (its ``out_dir``, else the work dir)."""
    hook = next((h for h in runner.hooks if isinstance(h, CheckpointHook)), None)
    return str(getattr(hook, 'out_dir', None) or runner.work_dir)


@HOOKS.register_module()
class SafeCheckpointHook(Hook):
    """Checkpoints that ``torch.load(weights_only=True)`` reads with torch's default allow-list, records of which run
    wrote them, and atomic writes.

    - Before each save, the message hub's ``HistoryBuffer`` objects and numpy values become plain data
      (:func:`mmwf.utils.checkpoint.plain_checkpoint`); on load they become buffers again. Every mmengine runner
      (``Runner``, ``FlexibleRunner``) then resumes weights-only without widening torch's allow-list.
    - ``meta['run_id']`` names the run (kept across resumes; a new ``load_from`` run gets a new one), and the
      checkpoint folder's ``.mmwf_run`` holds the id of the newest save: ``tools/train.py --resume`` falls back past
      a damaged last checkpoint only to checkpoints of the same run (:func:`mmwf.engine.resume_checkpoint`).
    - When the run starts, it makes the atomic local backend known to mmengine under a new name
      (``mmwf_atomic_local``; mmengine's ``local`` stays as it is) and gives it to the run's ``CheckpointHook`` when
      that writes to local files (``backend_args`` not set); it warns where ``max_keep_ckpts=1`` could leave nothing
      to resume.
    """

    priority = 'VERY_LOW'  # after every hook that adds to a checkpoint

    def __init__(self) -> None:
        self.run_id = uuid.uuid4().hex

    def before_run(self, runner) -> None:
        register_atomic_backend()
        hook = next((h for h in runner.hooks if isinstance(h, CheckpointHook)), None)
        if hook is None:
            return
        if hook.backend_args is None and hook.file_client_args is None and '://' not in str(hook.out_dir or ''):
            hook.backend_args = dict(backend=ATOMIC_BACKEND)
        if hook.max_keep_ckpts == 1:
            runner.logger.warning('default_hooks.checkpoint.max_keep_ckpts=1: mmengine deletes the kept checkpoint '
                                  'before it writes the next, so a run killed while saving has nothing to resume; '
                                  'keep 2 or more')

    def before_save_checkpoint(self, runner, checkpoint: dict) -> None:
        checkpoint.setdefault('meta', {})['run_id'] = self.run_id
        plain_checkpoint(checkpoint)
        folder = checkpoint_folder(runner)
        if is_main_process() and '://' not in folder:
            atomic_write(os.path.join(folder, RUN_FILE), lambda f: f.write(self.run_id + '\n'), 'w')

    def after_load_checkpoint(self, runner, checkpoint: dict) -> None:
        restore_checkpoint(checkpoint)
        run_id = (checkpoint.get('meta') or {}).get('run_id')
        if run_id and is_resuming(runner):
            self.run_id = run_id
