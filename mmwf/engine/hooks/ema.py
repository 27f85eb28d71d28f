"""The EMA of mmengine's ``EMAHook`` under every runner: ``Runner`` and ``FlexibleRunner`` with DDP or FSDP.

mmengine's hook assumes ``Runner``: under ``FlexibleRunner`` it is asked to load a checkpoint before it has built
its EMA copy (the runner loads before ``before_run``), its swap into the saved state dict looks the keys up without
the ``module.`` prefix that ``DDPStrategy`` keeps and on ranks that FSDP gives an empty state dict (whole
checkpoints are gathered on rank 0), and under FSDP the live parameters are shards. :class:`FlexibleEMAHook` keeps
mmengine's EMA (the same averaged model, momentum and checkpoint keys) and reads and writes the parameters whole:
under FSDP inside ``summon_full_params`` (an all-gather per update; the EMA copy is whole on every process).

The EMA follows the optimizer, as DiT's ``update_ema`` after each ``opt.step()``: with gradient accumulation
(``optim_wrapper.accumulative_counts = a``) the weights change on every a-th iteration only, and mmengine's hook,
which updates on every iteration, would average each set of weights a times (a horizon a times shorter).
"""
from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator

from mmengine.hooks import EMAHook
from mmengine.model import is_model_wrapper

from mmwf.registry import HOOKS, MODELS

from .optimizer_step_scheduler import optimizer_stepped
from .runner_state import accumulative_counts, fsdp_model, is_resuming


def optimizer_steps(runner, iterations: int) -> int:
    """The optimizer steps of the first ``iterations`` iterations of the run: mmengine's wrapper steps on every a-th
    iteration and on the run's last one (``OptimWrapper.should_update``), also after a resume mid-accumulation."""
    a = accumulative_counts(runner)
    return iterations // a + int(iterations % a != 0 and iterations == runner.max_iters)


@HOOKS.register_module()
class FlexibleEMAHook(EMAHook):
    """mmengine's ``EMAHook`` (the same arguments) for ``Runner`` and ``FlexibleRunner`` with any of its DDP / FSDP
    strategies (module docstring), updated once per optimizer step.

    The EMA is updated only on the iterations where the optimizer stepped, so the averaged model's ``steps`` counts
    optimizer steps. ``begin_iter`` and the averaged model's ``interval`` count optimizer steps too, as mmwf's
    iteration schedules do (:class:`OptimizerStepSchedulerHook`): a recipe keeps its EMA under accumulation.
    ``begin_epoch`` counts epochs. Without accumulation a step is an iteration: this is mmengine's ``EMAHook``.
    A resume mid-accumulation keeps the count: the checkpoint holds ``steps`` and the wrapper steps where it would.
    """

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._pending: dict | None = None

    @contextlib.contextmanager
    def _whole(self, runner, writeback: bool) -> Iterator[None]:
        """The source model's parameters whole for the block (FSDP: gathered, and written back if asked)."""
        fsdp = fsdp_model(runner)
        if fsdp is None:
            yield
            return
        with type(fsdp).summon_full_params(fsdp, writeback=writeback, rank0_only=False):
            yield

    def before_run(self, runner) -> None:
        self._runner = runner
        model = runner.model.module if is_model_wrapper(runner.model) else runner.model
        self.src_model = model
        with self._whole(runner, writeback=False):
            self.ema_model = MODELS.build(self.ema_cfg, default_args=dict(model=model))
        if self._pending is not None:  # a checkpoint loaded before this hook built its copy (FlexibleRunner)
            self._apply_loaded(self._pending)
            self._pending = None

    def before_train(self, runner) -> None:
        if self.enabled_by_epoch:
            super().before_train(runner)
            return
        total = optimizer_steps(runner, runner.max_iters)
        if self.begin_iter > total:
            raise ValueError(f'FlexibleEMAHook: begin_iter={self.begin_iter} counts optimizer steps, and this run '
                             f'takes {total} ({runner.max_iters} iterations of {accumulative_counts(runner)})')

    def after_train_iter(self, runner, batch_idx: int, data_batch=None, outputs=None) -> None:
        if not optimizer_stepped(runner):  # the weights are those of the last update
            return
        with self._whole(runner, writeback=False):
            super().after_train_iter(runner, batch_idx, data_batch, outputs)

    def _ema_started(self, runner) -> bool:
        """Whether the EMA runs at this optimizer step: from step ``begin_iter`` (1-based, as mmengine counts
        ``runner.iter + 1``) or epoch ``begin_epoch``."""
        if self.enabled_by_epoch:
            return super()._ema_started(runner)
        return optimizer_steps(runner, runner.iter + 1) >= self.begin_iter

    def _swap_ema_parameters(self) -> None:
        with self._whole(self._runner, writeback=True):
            super()._swap_ema_parameters()

    def _swap_ema_state_dict(self, checkpoint: dict) -> None:
        """Swap the EMA weights with the model's in a saved state dict, whichever prefix the runner's state dict
        has; a rank that saves no state dict (FSDP gathers whole checkpoints on rank 0) swaps nothing."""
        model_state, ema_state = checkpoint['state_dict'], checkpoint['ema_state_dict']
        if not model_state:
            return
        for key in ema_state:
            if not key.startswith('module.'):
                continue
            own = key if key in model_state else key[len('module.'):]
            ema_state[key], model_state[own] = model_state[own], ema_state[key]

    def after_load_checkpoint(self, runner, checkpoint: dict) -> None:
        if hasattr(self, 'ema_model'):
            super().after_load_checkpoint(runner, checkpoint)
            return
        # FlexibleRunner loads before before_run: the model's own weights go back into the state dict now (the
        # strategy loads it after this hook), the EMA copy is filled once it exists
        resuming = 'ema_state_dict' in checkpoint and is_resuming(runner)
        if resuming:
            self._swap_ema_state_dict(checkpoint)
        self._pending = dict(resuming=resuming, state=checkpoint['ema_state_dict'] if resuming
                             else copy.deepcopy(checkpoint['state_dict']))

    def _apply_loaded(self, pending: dict) -> None:
        if pending['resuming']:
            self.ema_model.load_state_dict(pending['state'], strict=self.strict_load)
        else:
            from mmengine.runner.checkpoint import load_state_dict
            load_state_dict(self.ema_model.module, pending['state'], strict=self.strict_load)
