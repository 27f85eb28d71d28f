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


# the reference's lr at each of its 6 steps, written out: a linear warm-up from 0.1 over steps 0-2 (mmengine's
# LinearLR reaches its end value at end - 1), then halved from step 4
REFERENCE_LRS = [0.01 * f for f in (0.1, 0.55, 1.0, 1.0, 0.5, 0.5)]


@pytest.mark.slow
@pytest.mark.parametrize('per_gpu, accumulated', [(2, 1), (1, 2), (1, 1)], ids=['same-batch', 'accumulating',
                                                                                'half-batch'])
def test_scaled_runs_on_two_processes_train_the_references_images_and_lr(tmp_path, per_gpu, accumulated):
    """Two gloo processes, the reference's 4 images a step reached by 2 x 2, by 2 x 1 x 2 accumulated, or not
    (2 x 1): every run sees the reference's 24 images; the first two in the reference's 6 optimizer steps at the
    reference's lr, step by step; the half batch in 12 steps at half the lr, its schedule stretched (warm-up over
    steps 0-4, halved from step 8)."""
    res = run_two_ranks('tests.engine.schedule_run', tmp_path, str(per_gpu), str(accumulated))
    assert res.returncode == 0, res.stderr[-4000:]
    seen = json.loads((res.out / 'schedule.json').read_text())
    assert seen['images'] == 6 * 4
    if per_gpu * accumulated == 1:  # a global batch of 2
        expected = [0.005 * f for f in (0.1, 0.325, 0.55, 0.775, 1.0, 1.0, 1.0, 1.0, 0.5, 0.5, 0.5, 0.5)]
    else:
        expected = REFERENCE_LRS
    assert seen['lrs'] == pytest.approx(expected, rel=1e-9), seen['changes']


def test_iteration_schedules_scale_to_the_references_images():
    """Cascade (ViTDet: 64 images a step, 184,375 steps) on 8 GPUs x 4: twice the iterations, the schedule's
    steps and intervals doubled, half the lr; on 4 GPUs x 4 x 4 accumulated: four times the iterations, the same
    184,375 optimizer steps and schedule, the reference's lr."""
    cfg = Config.fromfile(str(ROOT / 'configs/cascade_wf_t_coco.py'))
    cfg.train_dataloader.batch_size = 4
    scale_to_world(cfg, 8)
    assert (cfg.train_cfg.max_iters, cfg.train_cfg.val_interval) == (368_750, 368_750)
    assert (cfg.default_hooks.checkpoint.interval, cfg.default_hooks.logger.interval) == (10_000, 40)
    warmup, steps = cfg.param_scheduler
    assert (warmup.begin, warmup.end) == (0, 501) and steps.milestones == [327_778, 355_092]
    assert steps.end == 368_749 and cfg.optim_wrapper.optimizer.lr == pytest.approx(5e-5)
    cfg = Config.fromfile(str(ROOT / 'configs/cascade_wf_t_coco.py'))
    cfg.train_dataloader.batch_size, cfg.optim_wrapper.accumulative_counts = 4, 4
    changes = scale_to_world(cfg, 4)
    assert cfg.train_cfg.max_iters == 737_500 and '184375 optimizer steps of 64 images' in changes[1]
    assert cfg.param_scheduler[1].milestones == [163_889, 177_546] and cfg.param_scheduler[0].end == 251
    assert cfg.optim_wrapper.optimizer.lr == 1e-4 and cfg.default_hooks.param_scheduler.type == (
        'OptimizerStepSchedulerHook')


def test_epoch_based_loops_keep_their_epochs():
    cfg = Config.fromfile(str(ROOT / 'configs/imagenet/weightformer_t_in1k.py'))
    epochs = cfg.train_cfg.max_epochs
    scale_to_world(cfg, 4)
    assert cfg.train_cfg.max_epochs == epochs and 'max_iters' not in cfg.train_cfg


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


def test_an_accumulating_run_that_was_not_scaled_says_what_it_trains(tmp_path):
    """The reference's global batch by accumulation (4 x 2 of 8) but its iterations unscaled: the lr is right and
    no word was said before; now the run says its images and optimizer steps against the reference's."""
    log = run_log(tmp_path, auto_scale_lr=dict(enable=False, base_batch_size=8),
                  optim_wrapper=dict(optimizer=dict(type='AdamW', lr=0.01), accumulative_counts=2))
    assert ('1 iterations train 4 images in 0 optimizer steps, where the reference trains 8 in 1. '
            'tools/train.py --auto-scale-lr scales the iterations') in log and 'differs' not in log


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


def test_schedules_converted_from_epochs_keep_counting_iterations():
    """With 2 accumulated iterations, over 4 iterations: a scheduler written in iterations steps at the 2 optimizer
    steps, one the config converts from epochs (its length in data iterations, as mmengine converts it) at all 4,
    an epoch-based one at none."""
    from types import SimpleNamespace

    from mmwf.engine.hooks import OptimizerStepSchedulerHook

    class Counting:
        def __init__(self, by_epoch):
            self.by_epoch, self.steps = by_epoch, 0

        def step(self):
            self.steps += 1
    schedulers = [Counting(False), Counting(False), Counting(True)]
    wrapper = SimpleNamespace(should_update=lambda: iteration % 2 == 1)
    entries = [dict(type='LinearLR', by_epoch=False),
               dict(type='CosineAnnealingLR', by_epoch=True, convert_to_iter_based=True),
               dict(type='MultiStepLR', by_epoch=True)]
    runner = SimpleNamespace(optim_wrapper=wrapper, param_schedulers=schedulers,
                             cfg=Config(dict(param_scheduler=entries)))
    hook = OptimizerStepSchedulerHook()
    hook.before_train(runner)
    for iteration in range(4):
        hook.after_train_iter(runner, iteration)
    assert [s.steps for s in schedulers] == [2, 4, 0]
