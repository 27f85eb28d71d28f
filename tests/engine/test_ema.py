"""FlexibleEMAHook under gradient accumulation: one EMA update per optimizer step, as DiT's ``update_ema`` after
each ``opt.step()``. The expected EMA is computed here in float64 from the toy model's weights after each iteration,
the optimizer steps found where those weights changed; ``begin_iter`` counts optimizer steps; a resume
mid-accumulation keeps the count; without accumulation the hook is mmengine's ``EMAHook``, bit for bit."""
import pytest
import torch
from mmengine.hooks import EMAHook, Hook

import mmwf  # noqa: F401  (registers the hooks)
from mmwf.engine.hooks.optimizer_step_scheduler import optimizer_stepped
from tests.tolerance import assert_same_computation
from tests.toy import ToyModel, make_runner

MOMENTUM = 0.3  # large, so that an EMA updated once per iteration is far from one updated once per step


class WeightsAfterIter(Hook):
    """The model's weights before training and after each iteration, and ``optimizer_stepped`` at each."""

    priority = 'LOWEST'

    def __init__(self):
        self.weights, self.stepped = [], []

    @staticmethod
    def _state(runner) -> dict[str, torch.Tensor]:
        return {k: v.detach().clone() for k, v in runner.model.state_dict().items()}

    def before_train(self, runner):
        self.weights.append(self._state(runner))

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None):
        self.weights.append(self._state(runner))
        self.stepped.append(optimizer_stepped(runner))

    def changed(self) -> list[int]:
        """The iterations (1-based, as the training counts them) after which the weights differ from before."""
        return [i for i in range(1, len(self.weights))
                if any(not torch.equal(self.weights[i][k], self.weights[i - 1][k]) for k in self.weights[i])]


def train(work_dir, iters: int, accumulate: int, ema: dict | None = None, **kwargs):
    """The toy run of ``iters`` iterations with ``accumulate`` iterations per optimizer step and an EMA hook;
    returns the runner's EMA hook and the weights it saw."""
    torch.manual_seed(0)
    seen = WeightsAfterIter()
    runner = make_runner(work_dir, iters, model=ToyModel(),
                         custom_hooks=[ema or dict(type='FlexibleEMAHook', momentum=MOMENTUM), seen],
                         optim_wrapper=dict(optimizer=dict(type='AdamW', lr=0.01), accumulative_counts=accumulate),
                         **kwargs)
    runner.train()
    return next(h for h in runner.hooks if isinstance(h, EMAHook)), seen


def dit_steps(iters: int, accumulate: int, first: int = 1) -> list[int]:
    """The iterations (1-based) that end an accumulation: every ``accumulate``-th and the run's last."""
    return [i for i in range(first, iters + 1) if i % accumulate == 0 or i == iters]


def ema_by_hand(updates: list[dict[str, torch.Tensor]], start: dict | None = None) -> dict[str, torch.Tensor]:
    """mmengine's ``ExponentialMovingAverage`` in float64: the first update (without ``start``) copies the weights,
    each later one is ``(1 - momentum) * ema + momentum * weights`` (DiT's decay * ema + (1 - decay) * weights)."""
    ema = None if start is None else {k: v.double() for k, v in start.items()}
    for weights in updates:
        ema = ({k: v.double() for k, v in weights.items()} if ema is None
               else {k: (1 - MOMENTUM) * ema[k] + MOMENTUM * weights[k].double() for k in ema})
    return ema


def assert_ema(hook: EMAHook, expected: dict[str, torch.Tensor], updates: int) -> None:
    """The hook's EMA weights equal ``expected`` within a few float32 roundings per update (``lerp_`` rounds its
    difference, product and sum; the error of earlier updates shrinks by 1 - momentum at each)."""
    actual = hook.ema_model.module.state_dict()
    assert actual.keys() == expected.keys()
    for key, value in expected.items():
        assert_same_computation(actual[key], value.float(), roundings=4 * max(updates, 1))


@pytest.mark.parametrize('iters, accumulate', [(8, 4), (8, 3), (5, 1)])
def test_ema_updates_once_per_optimizer_step(iters, accumulate, tmp_path):
    hook, seen = train(tmp_path, iters, accumulate)
    steps = dit_steps(iters, accumulate)
    # the wrapper steps where DiT's rule says (8 of 3: the last, short accumulation steps too), and the helper the
    # hook relies on, asked after update_params, says so on those iterations only
    assert seen.changed() == steps
    assert [i for i, s in enumerate(seen.stepped, 1) if s] == steps
    assert int(hook.ema_model.steps) == len(steps)
    assert_ema(hook, ema_by_hand([seen.weights[i] for i in steps]), len(steps))
    # the last checkpoint holds the same count and, as its state_dict, the same EMA weights
    checkpoint = torch.load(tmp_path / f'iter_{iters}.pth', weights_only=True)
    assert int(checkpoint['ema_state_dict']['steps']) == len(steps)
    for key, value in hook.ema_model.module.state_dict().items():
        assert torch.equal(checkpoint['state_dict'][key], value), key


def test_the_expectation_tells_an_ema_per_iteration(tmp_path):
    """mmengine's EMAHook under accumulation 4 updates on all 8 iterations: the expectation above rejects it."""
    hook, seen = train(tmp_path, 8, 4, ema=dict(type='EMAHook', momentum=MOMENTUM))
    assert int(hook.ema_model.steps) == 8
    with pytest.raises(AssertionError):
        assert_ema(hook, ema_by_hand([seen.weights[i] for i in dit_steps(8, 4)]), 2)


def test_without_accumulation_it_is_mmengines_ema(tmp_path):
    ours, _ = train(tmp_path / 'flexible', 5, 1)
    theirs, _ = train(tmp_path / 'mmengine', 5, 1, ema=dict(type='EMAHook', momentum=MOMENTUM))
    assert int(ours.ema_model.steps) == int(theirs.ema_model.steps) == 5
    expected = theirs.ema_model.state_dict()
    for key, value in ours.ema_model.state_dict().items():
        assert torch.equal(value, expected[key]), key


def test_begin_iter_counts_optimizer_steps(tmp_path):
    # 12 iterations of 4: steps at iterations 4, 8, 12; the EMA starts at step 2 (mmengine's count would start it
    # at iteration 2, so at step 1)
    hook, seen = train(tmp_path, 12, 4, ema=dict(type='FlexibleEMAHook', momentum=MOMENTUM, begin_iter=2))
    assert int(hook.ema_model.steps) == 2
    assert_ema(hook, ema_by_hand([seen.weights[8], seen.weights[12]]), 2)
    with pytest.raises(ValueError, match='begin_iter=3 counts optimizer steps, and this run takes 2'):
        train(tmp_path / 'late', 8, 4, ema=dict(type='FlexibleEMAHook', momentum=MOMENTUM, begin_iter=3))


def test_resume_mid_accumulation_keeps_the_count(tmp_path):
    """Checkpoints at iterations 3 and 6 of 8 (accumulation 4) are mid-accumulation. Resumed at 6, the wrapper
    steps at 8 again (the gradients of 5 and 6 are lost, as mmengine warns) and the EMA goes on from its saved
    count: 2 optimizer steps, as without the resume."""
    _, first = train(tmp_path / 'run', 8, 4)
    saved = torch.load(tmp_path / 'run' / 'iter_6.pth', weights_only=True)
    # saved after step 1 (iteration 4): one update, a copy of those weights, in the checkpoint's state_dict
    assert int(saved['ema_state_dict']['steps']) == 1
    assert int(torch.load(tmp_path / 'run' / 'iter_3.pth', weights_only=True)['ema_state_dict']['steps']) == 0
    for key, value in first.weights[4].items():
        assert torch.equal(saved['state_dict'][key], value), key
    hook, seen = train(tmp_path / 'resumed', 8, 4, load_from=str(tmp_path / 'run' / 'iter_6.pth'), resume=True)
    assert seen.changed() == [2]  # of the 2 iterations left, the second (iteration 8) steps
    assert int(hook.ema_model.steps) == 2
    assert_ema(hook, ema_by_hand([seen.weights[2]], start={k: saved['state_dict'][k] for k in first.weights[4]}), 2)
