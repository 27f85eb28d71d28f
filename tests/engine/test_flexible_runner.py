"""mmwf's runner pieces under mmengine's FlexibleRunner (the runner of FSDP / DeepSpeed strategies) with a DDP and
an FSDP strategy on two gloo processes: the same errors for the same bad inputs as under Runner (FSDP's checked
against the whole tensors, not the shards), the same weights and EMA weights as mmengine's Runner and EMAHook, and a
resume that continues exactly."""
import json

import pytest

from tests.engine.two_ranks import run_two_ranks
from tests.toy import ToyModel, make_runner


def runner_outcome(run) -> str:
    try:
        run()
    except Exception as err:
        return f'{type(err).__name__}: {err}'
    return 'ok'


@pytest.mark.slow
@pytest.mark.parametrize('strategy', ['DDPStrategy', 'ResumableFSDPStrategy'])
def test_flexible_runner_keeps_the_checks(strategy, tmp_path):
    res = run_two_ranks('tests.engine.flexible_runner_run', tmp_path, strategy)
    assert res.returncode == 0, res.stderr[-4000:]
    ranks = [json.loads((res.out / f'rank{r}.json').read_text()) for r in (0, 1)]
    seen, runs = ranks[0], ranks[0].pop('weights')
    assert ranks[1] == seen
    assert seen['train'] == 'ok' and seen['resume'] == 'ok' and seen['resumed iter'] == 4
    # 4 iterations, EMA momentum 0.5: the same weights and EMA as mmengine's Runner, DDP and EMAHook; resumed at
    # iteration 3, the same again (AdamW's moments restored)
    assert runs['reference'].keys() == runs['run'].keys() == runs['resumed'].keys() == {
        f'{part} linear.{p}' for part in ('state_dict', 'ema_state_dict') for p in ('weight', 'bias')}
    assert runs['reference']['state_dict linear.bias'] != runs['reference']['ema_state_dict linear.bias']
    for run in ('run', 'resumed'):
        for key, value in runs['reference'].items():
            assert runs[run][key] == pytest.approx(value, rel=1e-6, abs=1e-7), (run, key)
    # the same bad inputs under mmengine's Runner, in this process
    checkpoint = res.out / 'run' / 'iter_3.pth'
    other = runner_outcome(make_runner(tmp_path / 'r1', 4, model=ToyModel(3), load_from=str(checkpoint)).train)
    layout = runner_outcome(make_runner(tmp_path / 'r2', 4, load_from=str(checkpoint), resume=True, optim_wrapper=dict(
        optimizer=dict(type='AdamW', lr=0.01), paramwise_cfg=dict(bias_lr_mult=2.0))).train)
    assert other.startswith('CheckpointMismatchError: checkpoint')
    assert 'linear.weight: checkpoint (1, 4) vs model (3, 4)' in other
    assert layout.startswith('CheckpointMismatchError: cannot resume from')
    assert seen['other model'] == other
    assert seen['other optimizer layout'] == layout
