"""``StrictRunner``: mmengine's ``Runner`` with no silent partial loads, a resume that survives a damaged last
checkpoint, and the dataset checked against the model before the first batch.

mmengine's ``Runner.load_checkpoint`` loads with ``strict=False``: a checkpoint of another model skips every
mismatched key, and ``tools/test.py`` then reports the metric of a randomly initialised model. Here:

- ``load_from`` (test, fine-tuning) and resume are strict: any missing, unexpected or mis-shaped key fails before
  the first batch, with one error naming the file and the keys; ``partial_load=True`` in the config loads only the
  matching tensors on purpose (logged with the keys left out). On resume the optimizer state must fit the
  parameters too.
- ``resume=True`` without a path takes the newest checkpoint of the work dir that is complete (zip members and
  CRCs intact; ``last_checkpoint`` first), saying which damaged ones it skipped; with nothing to resume it says so
  and trains from scratch, as mmengine does. An explicit path never falls back.
- Before loading, the built datasets are checked (:func:`mmwf.datasets.check_classes`): train / val / test class
  lists, the heads' ``num_classes``; evaluating or resuming, the classes the checkpoint was trained on.
- A dataset whose annotation file is not valid JSON fails naming the file, line and column; every
  ``LoadAnnotations`` of the pipelines is followed by :class:`~mmwf.datasets.CheckAnnotations`.

Every mmwf config sets ``runner_type = 'StrictRunner'``, so mmdet's, mmseg's and mmpretrain's own tools run it too.
"""
from __future__ import annotations

import copy
import glob
import os
import os.path as osp
import re
import zipfile
from contextlib import contextmanager

import torch
from mmengine.dist import broadcast_object_list, is_main_process
from mmengine.model import is_model_wrapper
from mmengine.runner import BaseLoop, Runner

from mmwf.datasets.checks import (
    CheckAnnotations,
    annotation_file_error,
    check_classes,
    insert_annotation_checks,
    leaf_datasets,
)
from mmwf.registry import RUNNERS
from mmwf.utils.checkpoint import CheckpointError, CheckpointMismatchError, load_weights_only, mismatch_lines

PARTIAL_LOAD = 'partial_load'  # the config key of the opt-out
TEMPORARY = re.compile(r'^\..+\.[0-9a-f]{8}\.tmp$')  # what mmwf.utils.checkpoint.atomic_write writes first


def checkpoint_problem(path: str) -> str | None:
    """Why the checkpoint file ``path`` cannot be resumed from (missing, empty, a damaged zip archive or member),
    or None when it is complete. Zip archives (torch >= 1.6) are checked member by member against their CRCs
    without unpickling (a member written without a CRC, as ``torch.serialization.set_crc32_options(False)``
    writes, is checked by reading the file weights-only); other files are read weights-only. Addresses of other
    storage backends (``s3://``, ...) are not checked. An I/O error is raised, not reported as damage."""
    if '://' in path:
        return None
    if not osp.isfile(path):
        return 'the file does not exist'
    if osp.getsize(path) == 0:
        return 'the file is empty (0 bytes)'
    if zipfile.is_zipfile(path):
        try:
            with zipfile.ZipFile(path) as archive:
                bad = archive.testzip()
                unchecked = bad is not None and archive.getinfo(bad).CRC == 0
        except (zipfile.BadZipFile, EOFError, RuntimeError) as err:
            return f'the zip archive is damaged ({err})'
        if bad and not unchecked:
            return f'the zip archive member {bad} is damaged (CRC mismatch)'
        if not bad:
            return None
    try:
        load_weights_only(path)
    except CheckpointError as err:
        return err.what
    return None


def _number(path: str) -> int:
    found = re.search(r'(\d+)\.pth$', osp.basename(path))
    return int(found.group(1)) if found else -1


def newest_complete_checkpoint(work_dir: str) -> tuple[str | None, list[tuple[str, str]]]:
    """The newest complete checkpoint of ``work_dir``: ``iter_N.pth`` / ``epoch_N.pth`` and the one
    ``last_checkpoint`` names, from the highest N down (mmengine writes ``last_checkpoint`` after the file, so a
    run killed in between leaves a newer complete file than it names); and the (path, problem) of every newer one
    that is damaged."""
    candidates = glob.glob(osp.join(work_dir, 'iter_*.pth')) + glob.glob(osp.join(work_dir, 'epoch_*.pth'))
    last_file = osp.join(work_dir, 'last_checkpoint')
    if osp.isfile(last_file):
        with open(last_file) as f:
            last = f.read().strip()
        if last and all(osp.abspath(c) != osp.abspath(last) for c in candidates):
            candidates.append(last)
    skipped = []
    for path in sorted(candidates, key=_number, reverse=True):
        problem = checkpoint_problem(path)
        if problem is None:
            return path, skipped
        skipped.append((path, problem))
    return None, skipped


# optimizer state entries of a parameter's own shape (Adam / AdamW / NAdam / RAdam / Adamax, SGD, RMSprop,
# Adagrad, Adadelta, ASGD, Rprop, Lion); factored or quantized states (Adafactor, 8-bit) are not compared
ELEMENTWISE_STATE = ('exp_avg', 'exp_avg_sq', 'max_exp_avg_sq', 'exp_inf', 'momentum_buffer', 'square_avg',
                     'grad_avg', 'sum', 'acc_delta', 'ax', 'prev', 'step_size')


def optimizer_state_mismatch(optimizer: torch.optim.Optimizer, saved: dict, names: dict[int, str]) -> list[str]:
    """Lines naming how a saved optimizer state does not fit ``optimizer`` (group count, parameters per group,
    shapes of the element-wise state entries); empty when it fits. ``names`` maps ``id(parameter)`` to its name."""
    groups, saved_groups = optimizer.param_groups, saved.get('param_groups', [])
    if len(groups) != len(saved_groups):
        return [f'{len(saved_groups)} parameter groups in the checkpoint vs {len(groups)} here (the trainable '
                'parameters or paramwise_cfg differ)']
    lines = [f'group {i}: {len(s["params"])} parameters in the checkpoint vs {len(g["params"])} here'
             for i, (g, s) in enumerate(zip(groups, saved_groups)) if len(g['params']) != len(s['params'])]
    if lines:
        return lines
    state = saved.get('state', {})
    shapes = []
    for group, saved_group in zip(groups, saved_groups):
        for param, pid in zip(group['params'], saved_group['params']):
            for key, value in state.get(pid, {}).items():
                if key in ELEMENTWISE_STATE and isinstance(value, torch.Tensor) and value.shape != param.shape:
                    shapes.append(f'{names.get(id(param), "?")} ({key}): checkpoint {tuple(value.shape)} vs '
                                  f'parameter {tuple(param.shape)}')
    return [f'state shape mismatches ({len(shapes)}): {", ".join(shapes[:8])}{" ..." if len(shapes) > 8 else ""}'
            ] if shapes else []


def parse_load_errors(message: str) -> tuple[list[str], list[str], list[str]]:
    """(missing, unexpected, mis-shaped) keys from the error of mmengine's ``load_state_dict(strict=True)``,
    which runs the modules' own load hooks (position tables resampled, keys renamed, old BatchNorm versions)."""
    missing, unexpected, shapes = [], [], []
    for line in message.splitlines():
        if line.startswith('missing keys in source state_dict: '):
            missing = line.split(': ', 1)[1].split(', ')
        elif line.startswith('unexpected key in source state_dict: '):
            unexpected = line.split(': ', 1)[1].split(', ')
        found = re.match(r'size mismatch for (.+?): copying a param with shape torch\.Size\(\[(.*?)\]\) from '
                         r'checkpoint, the shape in current model is torch\.Size\(\[(.*?)\]\)', line)
        if found:
            key, ckpt, own = found.groups()
            shapes.append(f'{key}: checkpoint ({ckpt}{"," if ckpt.count(",") == 0 and ckpt else ""}) vs model '
                          f'({own}{"," if own.count(",") == 0 and own else ""})')
    return sorted(missing), sorted(unexpected), sorted(shapes)


@contextmanager
def named_annotation_errors(cfg: object):
    """Turn a JSON error raised while building from ``cfg`` into one naming the annotation file, line and column."""
    try:
        yield
    except (ValueError, UnicodeDecodeError) as err:  # json.JSONDecodeError is a ValueError
        named = annotation_file_error(cfg) if isinstance(cfg, (dict, list)) else None
        if named is None:
            raise
        raise named from err


def configure_annotation_checks(dataset: object, ignore_index: int | None = None) -> None:
    """Give the :class:`CheckAnnotations` steps of a built dataset's pipelines the dataset's class count (and the
    heads' ignore index): before the loader's workers start, which copy the pipeline as it is then."""
    classes = (getattr(dataset, 'metainfo', None) or {}).get('classes')
    for leaf in leaf_datasets(dataset):
        for step in getattr(getattr(leaf, 'pipeline', None), 'transforms', []):
            if isinstance(step, CheckAnnotations) and classes:
                step.num_classes = len(classes)
                if ignore_index is not None:
                    step.ignore_index = ignore_index


def _hints(own: set[str], state: set[str]) -> list[str]:
    """What a mismatched checkpoint probably is, and what to do with it."""
    if any(k.startswith('student.') for k in state) and not any(k.startswith('student.') for k in own):
        return ['It is a distiller checkpoint: write its student as a checkpoint of its own with '
                '`python tools/model_converters/extract_student.py SRC DST`.']
    if state and sum(f'backbone.{k}' in own for k in state) >= len(state) / 2:
        return ["It is a backbone checkpoint: give it to the backbone instead, "
                "model.backbone.init_cfg=dict(type='Pretrained', checkpoint=PATH)."]
    return []


@RUNNERS.register_module()
class StrictRunner(Runner):
    """mmengine's ``Runner``, loading strictly and checking the data before the first batch (module docstring).

    Config keys beyond mmengine's: ``partial_load`` (bool): load only the matching tensors of ``load_from`` /
    resume instead of failing (fine-tuning with another head); the keys left out are logged. Defaults to False.
    """

    _resuming: str | None = None
    _data_checked = False

    @classmethod
    def from_cfg(cls, cfg) -> StrictRunner:
        """mmengine's, with :class:`~mmwf.datasets.CheckAnnotations` after every ``LoadAnnotations`` of the
        pipelines (logged)."""
        cfg = copy.deepcopy(cfg)
        added = insert_annotation_checks(cfg)
        runner = super().from_cfg(cfg)
        if added:
            runner.logger.info(f'CheckAnnotations added after {added} LoadAnnotations steps')
        return runner

    @staticmethod
    def build_dataloader(dataloader, seed=None, diff_rank_seed=False):
        """mmengine's, with an annotation file that is not valid JSON named (path, line, column), and the
        dataset's class count given to its :class:`CheckAnnotations` steps before any worker starts."""
        with named_annotation_errors(dataloader):
            loader = Runner.build_dataloader(dataloader, seed=seed, diff_rank_seed=diff_rank_seed)
        configure_annotation_checks(loader.dataset)
        return loader

    def build_evaluator(self, evaluator):
        """mmengine's, with an annotation file that is not valid JSON named (COCO metrics read one)."""
        with named_annotation_errors(evaluator):
            return super().build_evaluator(evaluator)

    def _loops(self) -> dict[str, BaseLoop]:
        return {split: loop for split, loop in (('train', self._train_loop), ('val', self._val_loop),
                                                ('test', self._test_loop)) if isinstance(loop, BaseLoop)}

    def check_data(self) -> None:
        """Check the built datasets (train and val when training, test when testing) against each other and the
        model (:func:`mmwf.datasets.check_classes`), and give their :class:`CheckAnnotations` steps the decode
        head's ignore index (255, mmseg's default, until then). The test set meets the train classes through the
        checkpoint's record of them (:meth:`load_checkpoint`)."""
        model = self.model.module if is_model_wrapper(self.model) else self.model
        splits = {split: loop.dataloader.dataset for split, loop in self._loops().items()}
        check_classes(splits, model)
        ignore = next((m.ignore_index for name, m in model.named_modules()
                       if name.endswith('decode_head') and isinstance(getattr(m, 'ignore_index', None), int)), None)
        for dataset in splits.values():  # loaders whose workers start later (evaluation) see the head's
            configure_annotation_checks(dataset, ignore)

    def load_or_resume(self) -> None:
        """Check the data, then load or resume strictly; auto-resume falls back past damaged checkpoints (chosen
        by the first process, the same for all)."""
        if self._has_loaded:
            return
        if not self._data_checked:
            self.check_data()
            self._data_checked = True
        if 'train' in self._loops():
            self.before_training()
        if self._resume and self._load_from is None:
            choice = [newest_complete_checkpoint(self.work_dir) if is_main_process() else None]
            broadcast_object_list(choice)
            path, skipped = choice[0]
            for bad, problem in skipped:
                self.logger.warning(f'cannot resume from {bad}: {problem}; trying the checkpoint before it')
            if path is None:
                found = f' ({len(skipped)} damaged checkpoints skipped)' if skipped else ''
                self.logger.warning(f'resume: nothing to resume in {self.work_dir}: no complete checkpoint{found}. '
                                    'Training from scratch.')
                return
            self.logger.info(f'resuming from {path}, the newest complete checkpoint in {self.work_dir}')
            self.resume(path)
        elif self._resume:
            self.resume(self._load_from)
        elif self._load_from is not None:
            self.load_checkpoint(self._load_from)
        else:
            return
        self._has_loaded = True

    def before_training(self) -> None:
        """Remove what a save killed before its rename left behind, and warn where a kill could leave nothing to
        resume (mmengine deletes the oldest kept checkpoint before writing the next)."""
        if is_main_process():
            for stale in glob.glob(osp.join(self.work_dir, '.*.tmp')):
                if TEMPORARY.match(osp.basename(stale)):
                    os.remove(stale)
                    self.logger.warning(f'removed {stale}, a checkpoint whose save was killed before it completed')
        keep = ((self.cfg.get('default_hooks') or {}).get('checkpoint') or {}).get('max_keep_ckpts', -1)
        if keep == 1:
            self.logger.warning('default_hooks.checkpoint.max_keep_ckpts=1: mmengine deletes the kept checkpoint '
                                'before it writes the next, so a run killed while saving has nothing to resume; '
                                'keep 2 or more')

    def resume(self, filename: str, resume_optimizer: bool = True, resume_param_scheduler: bool = True,
               map_location='default') -> None:
        """mmengine's resume, strict for the model (:meth:`load_checkpoint`) and the optimizer state."""
        if self.optim_wrapper is not None:
            self.optim_wrapper = self.build_optim_wrapper(self.optim_wrapper)
        self._resuming = filename if resume_optimizer else None
        try:
            super().resume(filename, resume_optimizer, resume_param_scheduler, map_location)
        finally:
            self._resuming = None

    def load_checkpoint(self, filename: str, map_location='cpu', strict: bool = False,
                        revise_keys: list = [(r'^module.', '')]) -> dict:  # noqa: B006  (mmengine's signature)
        """Load ``filename`` into the model as mmengine does (the modules' load hooks, state-dict versions), but
        strictly: a missing, unexpected or mis-shaped key stops the run (``strict`` is ignored; the config's
        ``partial_load=True`` loads the matching tensors instead, logged). Resuming, the optimizer state must fit;
        evaluating or resuming, the datasets must have the classes the checkpoint was trained on."""
        from mmengine.runner.checkpoint import _load_checkpoint, _load_checkpoint_to_model
        checkpoint = _load_checkpoint(filename, map_location=map_location)
        if not isinstance(checkpoint, dict):
            raise CheckpointError(f'cannot read checkpoint {filename!r}: it is not a state dict (found '
                                  f'{type(checkpoint).__name__}).')
        self.call_hook('after_load_checkpoint', checkpoint=checkpoint)
        model = self.model.module if is_model_wrapper(self.model) else self.model
        partial = bool(self.cfg.get(PARTIAL_LOAD, False))
        if partial:
            self.logger.warning(f'{PARTIAL_LOAD}=True: loading only the tensors of {filename} that match the model; '
                                'mmengine lists the others')
        try:
            _load_checkpoint_to_model(model, checkpoint, strict=not partial, logger='current',
                                      revise_keys=revise_keys)
        except RuntimeError as err:
            keys = list(checkpoint.get('state_dict', checkpoint))
            for pattern, replacement in revise_keys:
                keys = [re.sub(pattern, replacement, k) for k in keys]
            problems = mismatch_lines(*parse_load_errors(str(err))) or [str(err)]
            raise CheckpointMismatchError('\n'.join([
                f'checkpoint {filename!r} does not match the model of this config ({type(model).__name__}); the run '
                'stops before the first batch.', *problems, *_hints(set(model.state_dict()), set(keys)),
                'Use the checkpoint this config trained. To load only the matching tensors on purpose (fine-tuning '
                f'with another head), set {PARTIAL_LOAD}=True (--cfg-options {PARTIAL_LOAD}=True).'])) from None
        if self._resuming and 'optimizer' in checkpoint and self.optim_wrapper is not None:
            names = {id(p): n for n, p in model.named_parameters()}
            wrappers = getattr(self.optim_wrapper, 'optim_wrappers', None) or {'': self.optim_wrapper}
            saved = checkpoint['optimizer']
            for key, wrapper in wrappers.items():
                mismatch = optimizer_state_mismatch(wrapper.optimizer, saved[key] if key else saved, names)
                if mismatch:
                    raise CheckpointMismatchError('\n'.join([
                        f'cannot resume from {filename!r}: its optimizer state{f" ({key})" if key else ""} does not '
                        'fit the parameters of this config.', *mismatch,
                        'Resume with the config the checkpoint was trained with, or start a new run from its '
                        'weights with load_from=PATH (no --resume).']))
        trained = ((checkpoint.get('meta') or {}).get('dataset_meta') or {}).get('classes')
        if trained and (self._resuming or 'train' not in self._loops()):
            check_classes({s: loop.dataloader.dataset for s, loop in self._loops().items()}, model,
                          (filename, list(trained)))
        self._has_loaded = True
        self.logger.info(f'Load checkpoint from {filename}')
        return checkpoint
