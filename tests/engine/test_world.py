"""Runs on several processes: each family's per-rank seed as its reference draws it (two gloo processes), the
reference's batch / lr rule for another GPU count (tools/train.py --auto-scale-lr), the global-batch warning and
the TF32 switch."""
import json
import os
import subprocess
from pathlib import Path

import pytest
import torch
from mmengine.config import Config

from mmwf.engine.world import launcher_world_size, scale_to_world
from tests.engine.two_ranks import run_two_ranks
from tests.toy import make_runner

ROOT = Path(__file__).resolve().parents[2]

# (config, per-rank seed of rank r of W for seed s, TF32 in matmuls), each from its reference's code:
# DiT train.py:121 (and :12-13), the WeightFormer release main.py:120, detectron2 engine/defaults.py:244,
# Vim seg/train.py:124-129, ViT-Adapter detection/train.py:152-155
FAMILIES = {
    'configs/generation/wf_dit_s_2_in256.py': (lambda s, r, w: s * w + r, True),
    'configs/imagenet/weightformer_t_in1k.py': (lambda s, r, w: s + r, False),
    'configs/cascade_wf_t_coco.py': (lambda s, r, w: s + r, False),
    'configs/upernet_wf_t_ade20k.py': (lambda s, r, w: s, False),
    'configs/linear_attention/mask_rcnn_deit_b_relu_copy_coco.py': (lambda s, r, w: s, False),
}


@pytest.mark.slow
def test_each_family_draws_per_rank_as_its_reference_on_two_processes(tmp_path):
    """Two gloo processes, two DDP iterations per family: after the hooks each rank's torch stream is the one its
    reference seeds (seed 5), so the draws differ across ranks exactly where the reference's do; the parameters
    stay equal across ranks; TF32 is on during the run where the reference turns it on, and restored after."""
    res = run_two_ranks('tests.engine.world_size_run', tmp_path, *FAMILIES)
    assert res.returncode == 0, res.stderr[-4000:]
    ranks = [json.loads((res.out / f'rank{r}.json').read_text()) for r in (0, 1)]
    for config, (seed_rule, tf32) in FAMILIES.items():
        for rank, seen in enumerate(ranks):
            if seed_rule(5, rank, 2) != 5:  # seeded again with the rule's seed; else mmengine's stream of seed 5
                expected = torch.rand(3, generator=torch.Generator().manual_seed(seed_rule(5, rank, 2)))
                assert seen[config]['draws'] == pytest.approx(expected.tolist(), abs=0), (config, rank)
            assert seen[config]['tf32'] is tf32 and seen[config]['tf32_after'] is False, config
        assert (ranks[0][config]['draws'] != ranks[1][config]['draws']) == (seed_rule(5, 0, 2) != seed_rule(5, 1, 2))
        assert ranks[0][config]['params'] == ranks[1][config]['params'], config


def release_lrs(batch_per_gpu: int, world_size: int) -> dict[str, float]:
    """The WeightFormer release's lr rule (main.py:126-134, config.py:100-102): each x batch x world / 512."""
    return {k: v * batch_per_gpu * world_size / 512.0 for k, v in
            dict(base=5e-4, warmup=5e-7, min=5e-6).items()}


@pytest.mark.parametrize('world_size', [1, 4, 8, 16])
def test_linear_rule_scales_as_the_release(world_size):
    cfg = Config.fromfile(str(ROOT / 'configs/imagenet/weightformer_t_in1k.py'))
    changes = scale_to_world(cfg, world_size)
    expected = release_lrs(256, world_size)
    warmup, cosine = cfg.param_scheduler
    assert cfg.optim_wrapper.optimizer.lr == pytest.approx(expected['base'], rel=1e-12)
    assert cfg.optim_wrapper.optimizer.lr * warmup.start_factor == pytest.approx(expected['warmup'], rel=1e-12)
    assert cosine.eta_min == pytest.approx(expected['min'], rel=1e-12)
    assert cfg.auto_scale_lr.enable is False and cfg.auto_scale_lr.scaled_for == world_size
    assert any('eta_min' in line for line in changes)


def test_linear_rule_counts_accumulated_iterations():
    """4 GPUs x 256 x 2 accumulated iterations is the reference's 2048: nothing changes."""
    cfg = Config.fromfile(str(ROOT / 'configs/imagenet/weightformer_t_in1k.py'))
    cfg.optim_wrapper.accumulative_counts = 2
    lr, eta_min = cfg.optim_wrapper.optimizer.lr, cfg.param_scheduler[1].eta_min
    scale_to_world(cfg, 4)
    assert cfg.optim_wrapper.optimizer.lr == lr and cfg.param_scheduler[1].eta_min == eta_min


def test_linear_rule_scales_the_lr_schedules_alone():
    """A weight-decay and a momentum schedule keep their eta_min (the reference scales the lr and its minimum)."""
    cfg = Config.fromfile(str(ROOT / 'configs/imagenet/weightformer_t_in1k.py'))
    cosine = dict(cfg.param_scheduler[1])
    cfg.param_scheduler += [dict(cosine, type='CosineAnnealingParamScheduler', param_name='weight_decay', eta_min=0.01),
                            dict(cosine, type='CosineAnnealingMomentum', eta_min=0.85),
                            dict(cosine, type='CosineAnnealingParamScheduler', param_name='lr', eta_min=1e-6)]
    changes = scale_to_world(cfg, 4)  # 4 x 256 of the reference's 2048: x 0.5
    assert [s.eta_min for s in cfg.param_scheduler[2:]] == [0.01, 0.85, 5e-7]
    assert cfg.param_scheduler[1].eta_min == pytest.approx(cosine['eta_min'] / 2)
    scaled = [line.split(' (')[0] for line in changes if 'eta_min' in line]
    assert scaled == ['param_scheduler[1]', 'param_scheduler[4]']


@pytest.mark.parametrize('world_size, per_gpu', [(1, 256), (2, 128), (8, 32), (32, 8), (64, 4)])
def test_global_batch_rule_keeps_dits_256(world_size, per_gpu):
    cfg = Config.fromfile(str(ROOT / 'configs/generation/dit_b_2_in256.py'))
    lr = cfg.optim_wrapper.optimizer.lr
    scale_to_world(cfg, world_size)
    assert cfg.train_dataloader.batch_size == per_gpu == 256 // world_size  # DiT train.py:174
    assert cfg.optim_wrapper.optimizer.lr == lr == 1e-4  # DiT train.py:155


def test_global_batch_rule_refuses_a_world_size_that_does_not_divide_it():
    cfg = Config.fromfile(str(ROOT / 'configs/generation/dit_b_2_in256.py'))
    with pytest.raises(ValueError, match='global batch 256 cannot be split over 3 processes'):
        scale_to_world(cfg, 3)


def test_scaling_needs_the_reference_batch():
    cfg = Config(dict(train_dataloader=dict(batch_size=2), optim_wrapper=dict(optimizer=dict(lr=1.0))))
    with pytest.raises(ValueError, match='no auto_scale_lr.base_batch_size'):
        scale_to_world(cfg, 2)


def test_world_size_comes_from_the_launchers_environment(monkeypatch):
    monkeypatch.setenv('WORLD_SIZE', '16')
    monkeypatch.setenv('SLURM_NTASKS', '32')
    assert (launcher_world_size('none'), launcher_world_size('pytorch'), launcher_world_size('slurm')) == (1, 16, 32)
    monkeypatch.delenv('WORLD_SIZE')
    with pytest.raises(RuntimeError, match='WORLD_SIZE is not set'):
        launcher_world_size('pytorch')


def run_log(tmp_path, **kwargs) -> str:
    runner = make_runner(tmp_path, 1, hooks=dict(world_size=dict(type='WorldSizeHook')), **kwargs)
    runner.train()
    return next(tmp_path.rglob('*.log')).read_text()


def test_a_global_batch_other_than_the_references_is_reported(tmp_path):
    log = run_log(tmp_path / 'plain', auto_scale_lr=dict(enable=False, base_batch_size=8))
    assert 'global batch 4 (1 processes x 4 x 1 accumulated) differs from the reference\'s 8' in log
    log = run_log(tmp_path / 'scaled', auto_scale_lr=dict(enable=False, base_batch_size=8, scaled_for=1))
    assert "recipe scaled by the reference's 'linear' rule" in log and 'differs' not in log
    log = run_log(tmp_path / 'mmengine', auto_scale_lr=dict(enable=True, base_batch_size=8))
    assert "mmengine's auto_scale_lr scaled the lr alone by 0.5" in log


def test_rank_offsets_are_not_applied_twice(tmp_path):
    runner = make_runner(tmp_path, 1, hooks=dict(world_size=dict(type='WorldSizeHook')), cfg=dict(
        randomness=dict(seed=0, diff_rank_seed=True)))
    with pytest.raises(ValueError, match='remove diff_rank_seed'):
        runner.train()


def test_tf32_is_set_for_the_run_and_restored():
    from mmwf.engine.hooks import TF32Hook
    before = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)

    class Runner:
        logger = None

    hook = TF32Hook(matmul=not before[0], cudnn=not before[1])
    hook.before_run(Runner())
    assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == (not before[0], not before[1])
    hook.after_run(Runner())
    assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == before


def test_tf32_is_restored_when_the_run_stops_on_an_error():
    """mmengine skips ``after_run`` after an error; the tools' ``restored_state`` puts the flags back."""
    from mmwf.engine.hooks import TF32Hook
    from mmwf.engine.launch import restored_state
    before = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)

    class Runner:
        logger = None
        hooks = [TF32Hook(matmul=not before[0], cudnn=not before[1])]

    runner = Runner()
    with pytest.raises(RuntimeError, match='out of memory'), restored_state(runner):
        runner.hooks[0].before_run(runner)
        assert torch.backends.cuda.matmul.allow_tf32 is not before[0]
        raise RuntimeError('out of memory')
    assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == before


def test_slurm_scripts_start_one_task_per_gpu(tmp_path):
    """tools/slurm_{train,test}.sh through a stand-in srun that records its arguments."""
    srun = tmp_path / 'bin' / 'srun'
    srun.parent.mkdir()
    srun.write_text(f'#!/usr/bin/env bash\nprintf "%s\\n" "$@" > {tmp_path}/args\n')
    srun.chmod(0o755)
    env = dict(os.environ, PATH=f'{srun.parent}:{os.environ["PATH"]}', GPUS='16', GPUS_PER_NODE='8')
    subprocess.run(['bash', 'tools/slurm_train.sh', 'gpu', 'wf', 'configs/cascade_wf_t_coco.py', 'work',
                    '--auto-scale-lr'], cwd=ROOT, env=env, check=True)
    args = (tmp_path / 'args').read_text().splitlines()
    assert args[:8] == ['-p', 'gpu', '--job-name=wf', '--gres=gpu:8', '--ntasks=16', '--ntasks-per-node=8',
                        '--cpus-per-task=5', '--kill-on-bad-exit=1']
    assert args[-5:] == [str(ROOT / 'tools/train.py'), 'configs/cascade_wf_t_coco.py', '--work-dir=work',
                         '--launcher=slurm', '--auto-scale-lr']
    subprocess.run(['bash', 'tools/slurm_test.sh', 'gpu', 'wf', 'configs/cascade_wf_t_coco.py', 'w.pth'], cwd=ROOT,
                   env=env, check=True)
    assert (tmp_path / 'args').read_text().splitlines()[-4:] == [
        str(ROOT / 'tools/test.py'), 'configs/cascade_wf_t_coco.py', 'w.pth', '--launcher=slurm']
