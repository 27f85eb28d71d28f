"""Iteration schedules counted in optimizer steps, so that gradient accumulation keeps a reference's schedule."""
from __future__ import annotations

from mmengine.hooks import ParamSchedulerHook

from mmwf.registry import HOOKS


def optimizer_stepped(runner) -> bool:
    """Whether this iteration updated the parameters: mmengine's optimizer wrappers count the iterations of an
    accumulation (``should_update`` is True on the iteration that steps); every wrapper of a dict of them. Ask it
    after ``update_params`` (``after_train_iter``), whose ``backward`` counts the iteration: before, it answers for
    the previous one."""
    wrapper = runner.optim_wrapper
    wrappers = list(wrapper.values()) if hasattr(wrapper, 'values') else [wrapper]
    return all(w.should_update() for w in wrappers)


def _flat(schedulers) -> list:
    """The schedulers (or their configs) of a list, or of a dict of lists (one per optimizer), in order."""
    if schedulers is None:
        return []
    if isinstance(schedulers, dict) and 'type' not in schedulers:
        return [s for key in schedulers for s in _flat(schedulers[key])]
    return list(schedulers) if isinstance(schedulers, (list, tuple)) else [schedulers]


@HOOKS.register_module()
class OptimizerStepSchedulerHook(ParamSchedulerHook):
    """mmengine's ``ParamSchedulerHook`` whose iteration-based schedulers step once per optimizer step: with
    ``optim_wrapper.accumulative_counts = a`` after every a-th iteration (mmengine's step every iteration, so an
    accumulating run went through its warm-up and decays a times too fast). A schedule written in the reference's
    steps then holds with accumulation; without it this is mmengine's hook. Epoch-based schedulers, and those the
    config converts from epochs (``convert_to_iter_based``, counted in data iterations), step as in mmengine.

    Usage: ``default_hooks = dict(param_scheduler=dict(type='OptimizerStepSchedulerHook'))`` (every mmwf config)."""

    def before_train(self, runner) -> None:
        entries = _flat((getattr(runner, 'cfg', None) or {}).get('param_scheduler'))
        schedulers = _flat(runner.param_schedulers)
        # mmengine builds one scheduler per config entry, in order; without the config (a runner built from
        # arguments), every iteration scheduler counts optimizer steps
        converted = ([bool(e.get('convert_to_iter_based')) for e in entries] if len(entries) == len(schedulers)
                     else [False] * len(schedulers))
        self._per_data_iteration = {id(s) for s, c in zip(schedulers, converted) if c}

    def after_train_iter(self, runner, batch_idx: int, data_batch=None, outputs=None) -> None:
        stepped = optimizer_stepped(runner)
        for scheduler in _flat(runner.param_schedulers):
            if not scheduler.by_epoch and (stepped or id(scheduler) in self._per_data_iteration):
                scheduler.step()
