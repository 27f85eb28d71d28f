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

from mmwf.engine.world import (
    export_launcher_environment,
    launched_process,
    run_setting,
    scale_scheduler,
    scale_to_world,
    setting_mismatch,
)
from mmwf.utils.tf32_settings import cudnn_tf32, matmul_tf32
from tests.engine.launchers import stand_in_scontrol
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
    assert steps.end == 368_750 and cfg.optim_wrapper.optimizer.lr == pytest.approx(5e-5)  # MultiStep: end x 2
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


LAUNCHED = {  # what each launcher sets, by its own names, for rank 5 of 16, local rank 1
    'pytorch': dict(RANK='5', WORLD_SIZE='16', LOCAL_RANK='1'),
    'slurm': dict(SLURM_PROCID='5', SLURM_NTASKS='16', SLURM_LOCALID='1', SLURM_NODELIST='node[1-2]'),
    'mpi': dict(OMPI_COMM_WORLD_RANK='5', OMPI_COMM_WORLD_SIZE='16', OMPI_COMM_WORLD_LOCAL_RANK='1'),
}
DIST_VARIABLES = ('RANK', 'WORLD_SIZE', 'LOCAL_RANK', 'MASTER_ADDR', 'MASTER_PORT')


@pytest.fixture
def bare_environment(monkeypatch):
    """No launcher variables; whatever the code under test sets is undone after the test (monkeypatch restores only
    the names it has recorded: set, then deleted)."""
    for name in {*DIST_VARIABLES, *(k for v in LAUNCHED.values() for k in v)}:
        monkeypatch.setenv(name, '')
        monkeypatch.delenv(name)
    return monkeypatch


@pytest.mark.parametrize('launcher', sorted(LAUNCHED))
def test_the_process_is_read_from_its_launchers_variables(bare_environment, launcher):
    for name, value in LAUNCHED[launcher].items():
        bare_environment.setenv(name, value)
    assert launched_process(launcher) == (5, 16, 1) and launched_process('none') == (0, 1, 0)
    missing = next(iter(LAUNCHED[launcher]))
    bare_environment.delenv(missing)
    with pytest.raises(RuntimeError, match=f'--launcher {launcher}: {missing} is not set; start the tool with'):
        launched_process(launcher)


def test_slurm_and_mpi_set_what_torch_distributed_reads(bare_environment, tmp_path):
    """As mmengine's init_dist: Slurm's first node (scontrol) and port 29500, unless MASTER_ADDR / MASTER_PORT are
    given; Open MPI needs MASTER_ADDR, and is told so."""
    for name, value in LAUNCHED['slurm'].items():
        bare_environment.setenv(name, value)
    bare_environment.setenv('PATH', f'{stand_in_scontrol(tmp_path)}:{os.environ["PATH"]}')
    export_launcher_environment('slurm')
    assert {k: os.environ[k] for k in DIST_VARIABLES} == dict(RANK='5', WORLD_SIZE='16', LOCAL_RANK='1',
                                                            MASTER_ADDR='127.0.0.1', MASTER_PORT='29500')
    bare_environment.setenv('MASTER_ADDR', 'head')
    bare_environment.setenv('MASTER_PORT', '1234')
    export_launcher_environment('slurm')
    assert (os.environ['MASTER_ADDR'], os.environ['MASTER_PORT']) == ('head', '1234')
    for name in DIST_VARIABLES:
        bare_environment.delenv(name)
    for name, value in LAUNCHED['mpi'].items():
        bare_environment.setenv(name, value)
    with pytest.raises(RuntimeError, match=r'--launcher mpi: MASTER_ADDR is not set; .* \(mpirun -x MASTER_ADDR=HOST'):
        export_launcher_environment('mpi')
    bare_environment.setenv('MASTER_ADDR', '10.1.2.3')
    export_launcher_environment('mpi')
    assert [os.environ[k] for k in DIST_VARIABLES] == ['5', '16', '1', '10.1.2.3', '29500']


def test_slurm_without_scontrol_names_the_fix(bare_environment, tmp_path):
    for name, value in LAUNCHED['slurm'].items():
        bare_environment.setenv(name, value)
    bare_environment.setenv('PATH', str(tmp_path))  # no scontrol
    with pytest.raises(RuntimeError, match=r'scontrol show hostnames node\[1-2\]` failed .* set MASTER_ADDR'):
        export_launcher_environment('slurm')


def reference_lrs(schedulers: list[dict], steps: int, lr: float = 1.0) -> list[float]:
    """The lr of each of ``steps`` optimizer steps under mmengine's own schedulers built from ``schedulers``."""
    from mmengine.optim.scheduler import _ParamScheduler  # noqa: F401  (registers the schedulers)
    from mmengine.registry import PARAM_SCHEDULERS
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=lr)
    built = [PARAM_SCHEDULERS.build(dict(s, optimizer=optimizer)) for s in schedulers]
    lrs = []
    for _ in range(steps):
        lrs.append(optimizer.param_groups[0]['lr'])
        optimizer.step()
        for scheduler in built:
            scheduler.step()
    return lrs


# One scheduler of each kind mmwf scales, over a reference of 24 steps (begin 0 unless said)
SCHEDULES = {
    'LinearLR': [dict(type='LinearLR', start_factor=0.1, by_epoch=False, begin=0, end=7)],
    'PolyLR': [dict(type='PolyLR', power=2.0, eta_min=0.01, by_epoch=False, begin=0, end=24)],
    'ConstantLR': [dict(type='ConstantLR', factor=0.5, by_epoch=False, begin=2, end=9)],
    'ExponentialLR': [dict(type='ExponentialLR', gamma=0.8, by_epoch=False, begin=0, end=12)],
    'CosineAnnealingLR': [dict(type='CosineAnnealingLR', eta_min=0.05, by_epoch=False, begin=0, end=24)],
    'CosineAnnealingLR T_max': [dict(type='CosineAnnealingLR', T_max=10, by_epoch=False, begin=3, end=24)],
    'MultiStepLR': [dict(type='MultiStepLR', milestones=[5, 13], gamma=0.3, by_epoch=False, begin=0, end=24)],
    'StepLR': [dict(type='StepLR', step_size=5, gamma=0.5, by_epoch=False, begin=0, end=24)],
    'warm-up + cosine': [dict(type='LinearLR', start_factor=0.01, by_epoch=False, begin=0, end=5),
                         dict(type='CosineAnnealingLR', eta_min=0.0, by_epoch=False, begin=5, end=24)],
}


@pytest.mark.parametrize('factor', [2, 3, 8])
@pytest.mark.parametrize('kind', sorted(SCHEDULES))
def test_each_scheduler_keeps_the_references_lr_after_each_reference_step(kind, factor):
    """``factor`` optimizer steps a reference step (a smaller global batch): after k reference steps' images, the
    scaled schedule's lr is the reference's after k steps, for every k; mmengine computes both."""
    reference = reference_lrs(SCHEDULES[kind], 24)
    scaled = [dict(s) for s in SCHEDULES[kind]]
    for scheduler in scaled:
        scale_scheduler(scheduler, factor)
    ours = reference_lrs(scaled, 24 * factor)
    assert [ours[k * factor] for k in range(24)] == pytest.approx(reference, rel=1e-9, abs=1e-12)


def test_one_cycle_and_restarts_scale_their_own_positions():
    one_cycle = dict(type='OneCycleLR', eta_max=0.1, total_steps=100, by_epoch=False)
    assert scale_scheduler(one_cycle, 4)[0] == ['total_steps 100 -> 400'] and one_cycle['total_steps'] == 400
    restart = dict(type='CosineRestartLR', periods=[10, 20], restart_weights=[1, 0.5], eta_min=0, by_epoch=False,
                   begin=0, end=30)
    scale_scheduler(restart, 2)
    assert restart['periods'] == [20, 40] and restart['end'] == 60
    assert 'not a scheduler mmwf knows' in scale_scheduler(dict(type='MyLR', begin=0, end=5), 2)[1]


@pytest.mark.parametrize('gpus, end', [(1, 3993), (4, 999), (32, 126)])
def test_mask_rcnn_baselines_warm_up_sees_the_references_images(gpus, end):
    """mmdet's 1x schedule (12 epochs, batch 16: 2 a GPU x 8): its 500-step linear warm-up counts optimizer steps
    while the loop counts epochs. On 1, 4 and 32 GPUs the warm-up ends after the reference's 499 x 16 images (the
    last warm-up step, end - 1, times 16 / the global batch); the epochs stay. On 32 GPUs a step is four reference
    steps: the end is rounded to a whole step, so the lr may differ by the warm-up's rise over half a step."""
    cfg = Config.fromfile(str(ROOT / 'configs/linear_attention/mask_rcnn_deit_b_relu_copy_coco.py'))
    epochs, warmup = cfg.train_cfg.max_epochs, cfg.param_scheduler[0].copy()  # as written, before the scaling
    assert (warmup.type, warmup.begin, warmup.end, warmup.by_epoch) == ('LinearLR', 0, 500, False)
    reference = reference_lrs([warmup], 600)
    changes = scale_to_world(cfg, gpus)
    assert cfg.train_cfg.max_epochs == epochs and cfg.param_scheduler[0].end == end
    assert f'param_scheduler[0] (LinearLR) end 500 -> {end}' in changes
    ratio = 16 / (2 * gpus)  # optimizer steps a reference step
    ours = reference_lrs([cfg.param_scheduler[0]], int(600 * ratio))
    exact_last = (warmup.end - 1) * ratio  # where the warm-up's last step would fall, unrounded
    tolerance = (1 - warmup.start_factor) * abs(end - 1 - exact_last) / exact_last + 1e-12
    for k in range(600):  # after k reference steps' images, where that is a whole number of our steps
        if (k * ratio).is_integer():
            assert ours[int(k * ratio)] == pytest.approx(reference[k], abs=tolerance), k
    assert abs(end - 1 - exact_last) <= (0 if ratio >= 1 else 0.5)  # exact for whole steps, else half a step


def test_positions_of_every_hook_and_loop_scale_or_are_named():
    cfg = Config(dict(
        train_dataloader=dict(batch_size=2), optim_wrapper=dict(optimizer=dict(lr=1.0), accumulative_counts=2),
        auto_scale_lr=dict(base_batch_size=8),
        train_cfg=dict(type='IterBasedTrainLoop', max_iters=100, val_interval=10, val_begin=20),
        default_hooks=dict(logger=dict(type='LoggerHook', interval=5),
                           checkpoint=dict(type='CheckpointHook', by_epoch=False, interval=50, save_begin=10),
                           param_scheduler=dict(type='OptimizerStepSchedulerHook')),
        custom_hooks=[dict(type='FlexibleEMAHook', begin_iter=40, interval=3), dict(type='MyHook', interval=7)],
        param_scheduler=[dict(type='OneCycleLR', eta_max=1.0, total_steps=100, by_epoch=False),
                         dict(type='MultiStepLR', milestones=[3], by_epoch=True, begin=0, end=10)]))
    changes = scale_to_world(cfg, 1)  # 2 images an iteration, 4 an optimizer step, against the reference's 8
    assert (cfg.train_cfg.max_iters, cfg.train_cfg.val_interval, cfg.train_cfg.val_begin) == (400, 40, 80)
    assert cfg.default_hooks.logger.interval == 20
    assert (cfg.default_hooks.checkpoint.interval, cfg.default_hooks.checkpoint.save_begin) == (200, 40)
    assert (cfg.custom_hooks[0].begin_iter, cfg.custom_hooks[0].interval) == (80, 6)  # optimizer steps
    assert cfg.param_scheduler[0].total_steps == 200 and cfg.param_scheduler[1].milestones == [3]  # epochs stay
    assert any(line.startswith('custom_hooks[1] (MyHook) interval=7: not scaled') for line in changes)


def test_a_schedule_counting_iterations_under_accumulation_is_refused():
    cfg = Config.fromfile(str(ROOT / 'configs/demo/upernet_wf_t_demo.py'))
    cfg.optim_wrapper.accumulative_counts = 2
    cfg.default_hooks.param_scheduler = dict(type='ParamSchedulerHook')
    with pytest.raises(ValueError, match="ParamSchedulerHook: .* end the schedule 2 times too early. Set "
                                         r"default_hooks.param_scheduler=dict\(type='OptimizerStepSchedulerHook'\)"):
        scale_to_world(cfg, 1)


def test_a_resume_under_another_setting_is_refused_by_name():
    scaled = dict(base_batch_size=16, scaled_for=2)
    two = run_setting(2, 4, 1, scaled)
    assert setting_mismatch(two, run_setting(2, 4, 1, scaled)) is None
    problem = setting_mismatch(two, run_setting(4, 4, 1, dict(scaled, scaled_for=4)))
    assert problem.startswith('the run trained with 2 processes x 4 images x 1 accumulated, scaled by '
                              '--auto-scale-lr for 2 processes; this start has 4 processes x 4 images')
    assert 'start it on 2 processes with train_dataloader.batch_size=4 and optim_wrapper.accumulative_counts=1 ' \
           'and --auto-scale-lr' in problem
    # the same world without the flag: the recipe is not the one trained
    assert 'this start has 2 processes x 4 images x 1 accumulated, not scaled' in setting_mismatch(
        two, run_setting(2, 4, 1, dict(base_batch_size=16)))
    assert 'accumulative_counts=1' in setting_mismatch(two, run_setting(2, 4, 2, scaled))
    # the reference's own setting: the flag changed nothing, with it or without
    assert setting_mismatch(run_setting(2, 8, 1, scaled), run_setting(2, 8, 1, dict(base_batch_size=16))) is None


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
    """In this process (the legacy flags read); after either of torch's APIs: tests/engine/test_tf32_hook.py."""
    from mmwf.engine.hooks import TF32Hook
    before = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)

    class Runner:
        logger = None

    hook = TF32Hook(matmul=not before[0], cudnn=not before[1])
    hook.before_run(Runner())
    assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == (not before[0], not before[1])
    assert (matmul_tf32(), cudnn_tf32()) == (not before[0], not before[1])
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
        assert matmul_tf32() is not before[0]
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
