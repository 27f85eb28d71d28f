"""tools/train.py, tools/test.py, tools/demo.py and tools/dist_train.sh on the generated demo data."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from mmengine.config import Config

from mmwf.datasets import check_dataset_paths
from mmwf.models.backbones import WeightFormer
from tests.engine.two_ranks import run_launch
from tests.tool_runner import run_python

ROOT = Path(__file__).resolve().parents[2]


def test_missing_dataset_says_where_to_get_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = Config.fromfile(str(ROOT / 'configs/cascade_wf_t_coco.py'))
    with pytest.raises(FileNotFoundError, match='data/coco/') as err:
        check_dataset_paths(cfg)
    assert 'cocodataset.org' in str(err.value) and 'generate_demo_data.py' in str(err.value)
    seg = Config.fromfile(str(ROOT / 'configs/upernet_wf_t_ade20k.py'))
    with pytest.raises(FileNotFoundError, match='ADEChallengeData2016'):
        check_dataset_paths(seg)


def test_missing_weights_say_where_to_get_them(tmp_path):
    model = WeightFormer('t', init_cfg=dict(type='Pretrained', checkpoint=str(tmp_path / 'weightformer_t.pth')))
    with pytest.raises(FileNotFoundError, match='RuizeHe/weightformer') as err:
        model.init_weights()
    assert 'init_cfg=None' in str(err.value)


def run(cmd, **kwargs):
    """``python CMD`` (:func:`tests.tool_runner.run_python`)."""
    return run_python(cmd, env=dict(os.environ, OMP_NUM_THREADS='1', PYTHON=sys.executable), **kwargs)


@pytest.mark.slow
@pytest.mark.xdist_group('demo-end-to-end')  # only the session's demo data is shared: a worker of its own
def test_demo_end_to_end_short_schedule(demo_data, tmp_path):
    common = ['tools/demo.py', '--data-root', str(demo_data), '--work-dir', str(tmp_path),
              '--max-iters', '3']
    # after 3 iterations every score is tiny: keep all detections so that COCO AP is computed (20 an image: a random
    # detector's 100 cost the CPU a second an image in the mask head)
    det = run(common + ['--tasks', 'det', '--cfg-options', 'model.test_cfg.rcnn.score_thr=0.0',
                        'model.test_cfg.rcnn.max_per_img=20'])
    assert det.returncode == 0, det.stdout[-3000:] + det.stderr[-3000:]
    # the demo's test run evaluates the validation images; its training does not first (the loop's validation: the
    # two-process and killed-resume tests)
    assert 'Iter(val)' not in (tmp_path / 'det/train.log').read_text()
    seg = run(common + ['--tasks', 'seg'])
    assert seg.returncode == 0, seg.stdout[-3000:] + seg.stderr[-3000:]
    det_metrics = json.loads((tmp_path / 'det/metrics.json').read_text())
    seg_metrics = json.loads((tmp_path / 'seg/metrics.json').read_text())
    assert {'coco/bbox_mAP', 'coco/bbox_mAP_50', 'coco/segm_mAP'} <= det_metrics.keys()
    assert 0 <= seg_metrics['mIoU'] <= 100
    assert 'demo results:' in det.stdout and 'mIoU' in seg.stdout
    import mmcv
    for task, out in (('det', det.stdout), ('seg', seg.stdout)):
        pictures = sorted((tmp_path / task / 'pictures').glob('*.png'))
        assert len(pictures) == 4 and all(str(p) in out for p in pictures)
        drawn = mmcv.imread(str(pictures[0]), channel_order='rgb')
        source = mmcv.imread(str(demo_data / ('coco/val' if task == 'det' else 'ade/images/validation') /
                                 (pictures[0].stem + '.jpg')), channel_order='rgb')
        assert drawn.shape == (source.shape[0], 2 * source.shape[1], 3)  # ground truth | prediction
        assert (drawn[:, :source.shape[1]].astype(int) - source).any()  # something is drawn on it


@pytest.mark.slow
def test_two_process_gloo_training(demo_data, tmp_path):
    root = demo_data / 'ade'
    res = run_launch(lambda out, port: [
        'bash', 'tools/dist_train.sh', 'configs/demo/upernet_wf_t_demo.py', '2', '--work-dir', str(out),
        '--cfg-options', 'env_cfg.dist_cfg.backend=gloo', 'train_cfg.max_iters=4', 'train_cfg.val_interval=4',
        'default_hooks.checkpoint.interval=4', f'train_dataloader.dataset.data_root={root}',
        f'val_dataloader.dataset.data_root={root}', 'train_dataloader.batch_size=2', 'auto_scale_lr.base_batch_size=2',
        '--auto-scale-lr'], tmp_path / 'work', dict(os.environ, OMP_NUM_THREADS='1', PYTHON=sys.executable))
    log = res.stdout + res.stderr
    assert res.returncode == 0, log[-4000:]
    assert 'world_size: 2' in log or 'Distributed launcher: pytorch' in log
    work = res.out
    assert (work / 'iter_2.pth').is_file()
    lr = Config.fromfile(str(ROOT / 'configs/demo/upernet_wf_t_demo.py')).optim_wrapper.optimizer.lr
    # 2 processes x 2 images against a reference batch of 2: the linear rule doubles the lr, and only once; the
    # reference's 4 steps of 2 images are 2 iterations of 4 (and so are the intervals)
    assert f'--auto-scale-lr (2 processes): optimizer lr {lr:g} -> {2 * lr:g} (x 2: global batch 4 / 2)' in log
    assert '--auto-scale-lr (2 processes): train_cfg.max_iters 4 -> 2 (x 0.5' in log
    assert "recipe scaled by the reference's 'linear' rule for 2 processes" in log
    groups = torch.load(work / 'iter_2.pth', weights_only=True)['optimizer']['param_groups']
    assert max(g['initial_lr'] for g in groups) == pytest.approx(2 * lr)  # layer decay: the head's group at 1
    assert torch.load(work / 'iter_2.pth', weights_only=True)['meta']['mmwf_setting'] == dict(
        world_size=2, per_gpu_batch=2, accumulative_counts=1, scaled_for=2, base_batch_size=2)
    # the checkpoint of two scaled processes does not resume on one, with the flag or without: its schedule, lr and
    # iteration were derived for two; the refusal names both settings and the fix, before any iteration
    for flag in (['--auto-scale-lr'], []):
        one = run(['tools/train.py', 'configs/demo/upernet_wf_t_demo.py', '--work-dir', str(work),
                   '--resume', *flag, '--cfg-options', 'train_cfg.max_iters=4', 'train_cfg.val_interval=4',
                   f'train_dataloader.dataset.data_root={root}', f'val_dataloader.dataset.data_root={root}',
                   'train_dataloader.batch_size=2', 'auto_scale_lr.base_batch_size=2'], timeout=600)
        assert one.returncode != 0 and not (work / 'iter_3.pth').exists(), one.stderr[-3000:]
        now = 'scaled by --auto-scale-lr for 1 processes' if flag else 'not scaled'
        assert ('the run trained with 2 processes x 2 images x 1 accumulated, scaled by --auto-scale-lr for 2 '
                f'processes; this start has 1 processes x 2 images x 1 accumulated, {now}') in one.stderr
        assert ('To resume, start it on 2 processes with train_dataloader.batch_size=2 and '
                'optim_wrapper.accumulative_counts=1 and --auto-scale-lr') in one.stderr


@pytest.mark.slow
def test_distillation_demo_loss_falls(demo_data, tmp_path):
    """DeiT-T ReLU student, Copy-initialised from the demo's softmax DeiT-T and distilled from it in UperNet."""
    res = run(['tools/demo.py', '--tasks', 'distill-seg', '--data-root', str(demo_data),
               '--work-dir', str(tmp_path), '--max-iters', '20', '--cfg-options', 'default_hooks.logger.interval=5',
               'train_dataloader.batch_size=2'])
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    line = next(r for r in res.stdout.splitlines() if r.startswith('distill-seg:'))
    first, last = (float(v) for v in line.split('loss_distill ')[1].split(' (')[0].split(' -> '))
    assert 0 < last < first
    log = (tmp_path / 'distill-seg' / 'train.log').read_text()
    assert 'transfer copy from ' in log and ': 48 copied, ' in log  # qkv and proj of 12 blocks (each tensor: DEBUG)


def lr_by_iter(work_dir: Path) -> dict[int, float]:
    """{iteration: lr} from the scalars.json files of every run in ``work_dir`` (logger interval 1)."""
    out = {}
    for scalars in sorted(work_dir.glob('*/vis_data/scalars.json')):
        for line in scalars.read_text().splitlines():
            row = json.loads(line)
            if 'lr' in row and 'iter' in row:
                out[row['iter']] = row['lr']
    return out


@pytest.mark.slow
@pytest.mark.xdist_group('resume-after-kill')  # only the session's demo data is shared: a worker of its own
def test_killed_training_resumes_from_its_last_checkpoint(demo_data, tmp_path):
    """SIGKILL a demo training after its first checkpoint; --resume continues from that iteration to the end with
    the optimizer and the lr schedule restored: the lr of every iteration, before the kill and after the resume, is
    the config's schedule written out (a linear warm-up times a linear decay, each over the config's iterations)."""
    import signal
    import time
    root = demo_data / 'ade'
    cmd = ['tools/train.py', 'configs/demo/upernet_wf_t_demo.py', '--cfg-options',
           'train_cfg.max_iters=6', 'train_cfg.val_interval=6', 'default_hooks.checkpoint.interval=2',
           'default_hooks.logger.interval=1', f'train_dataloader.dataset.data_root={root}',
           f'val_dataloader.dataset.data_root={root}', 'train_dataloader.batch_size=2']
    work = tmp_path / 'killed'
    env = dict(os.environ, OMP_NUM_THREADS='1')
    proc = subprocess.Popen([sys.executable, *cmd, '--work-dir', str(work)], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    def written() -> bool:  # mmengine opens last_checkpoint, then writes the path into it
        return (work / 'last_checkpoint').exists() and bool((work / 'last_checkpoint').read_text().strip())
    while not written() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, 'the run ended before it could be killed'
    resumed_from = int(Path((work / 'last_checkpoint').read_text().strip()).stem.split('_')[1])
    assert 2 <= resumed_from < 6

    resumed = run(cmd + ['--work-dir', str(work), '--resume'], timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f'resumed epoch: 0, iter: {resumed_from}' in (resumed.stdout + resumed.stderr)
    final = torch.load(work / 'iter_6.pth', weights_only=True)
    assert final['meta']['iter'] == 6
    steps = {int(s['step']) for s in final['optimizer']['state'].values()}
    assert steps == {6}  # AdamW's step count went on from the checkpoint's, not from 0
    cfg = Config.fromfile(str(ROOT / 'configs/demo/upernet_wf_t_demo.py'))
    warm, poly = cfg.param_scheduler
    assert (warm.type, poly.type, poly.power, poly.eta_min) == ('LinearLR', 'PolyLR', 1.0, 0.0)

    def lr(t: int) -> float:  # iteration t + 1 trains with the value after t steps; mmengine's schedulers reach
        # their end value after end - begin - 1 steps
        warm_steps, poly_steps = warm.end - warm.begin - 1, poly.end - poly.begin - 1
        return (cfg.optim_wrapper.optimizer.lr * (warm.start_factor + (1 - warm.start_factor) * min(t, warm_steps) /
                                                  warm_steps) * (1 - t / poly_steps))
    got = lr_by_iter(work)
    assert set(range(1, 7)) <= got.keys()
    for it in range(1, 7):
        assert got[it] == pytest.approx(lr(it - 1), rel=1e-9), it


@pytest.mark.slow
def test_generation_demo_short_schedule(demo_data, tmp_path):
    """tools/demo.py --tasks gen: WF-DiT and DiT trained by tools/train.py in pixel space, sampled (EMA weights) and
    measured with the demo's classifier; a picture of the samples."""
    res = run(['tools/demo.py', '--tasks', 'gen', '--data-root', str(demo_data), '--work-dir',
               str(tmp_path), '--max-iters', '3', '--samples-per-class', '3', '--cfg-options',
               'model.sampling_steps=4', 'train_dataloader.batch_size=4'])
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    line = next(r for r in res.stdout.splitlines() if r.startswith('gen:'))
    found = re.findall(r'samples (\d\.\d+) of their class \(95 % (\d\.\d+)-(\d\.\d+), 9 samples\)', line)
    assert len(found) == 2 and 'real images' in line
    assert all(0 <= float(low) <= float(share) <= float(high) <= 1 for share, low, high in found)
    assert 'Fréchet' not in line  # 9 samples do not support a distance in 64 features
    assert (tmp_path / 'gen' / 'samples.png').read_bytes()[:4] == b'\x89PNG'


@pytest.mark.slow
@pytest.mark.xdist_group('classification-demos')  # only the session's demo data is shared: a worker of its own
def test_classification_demos_short_schedule(demo_data, tmp_path):
    """tools/demo.py --tasks cls distill-cls: WeightFormer-T and a distilled DeiT-T ReLU student on the ImageNet-style
    folder, trained and tested by tools/train.py / tools/test.py through mmpretrain."""
    res = run(['tools/demo.py', '--tasks', 'cls', 'distill-cls', '--data-root', str(demo_data),
               '--work-dir', str(tmp_path), '--max-iters', '4', '--cfg-options', 'default_hooks.logger.interval=1',
               'train_dataloader.batch_size=4'])
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    for task in ('cls', 'distill-cls'):
        metrics = json.loads((tmp_path / task / 'metrics.json').read_text())
        assert 0 <= metrics['accuracy/top1'] <= 100
    assert 'loss_distill' in next(r for r in res.stdout.splitlines() if r.startswith('distill-cls:'))


@pytest.mark.slow
def test_test_tool_refuses_a_checkpoint_of_another_model(demo_data, tmp_path):
    """A segmentor's checkpoint given to a classifier config: mmengine alone would load nothing, say nothing and
    report the metric of a random model. tools/test.py stops before the first batch, naming file and keys."""
    from mmengine.registry import MODELS, init_default_scope
    cfg = Config.fromfile(str(ROOT / 'configs/demo/upernet_wf_t_demo.py'))
    init_default_scope(cfg.default_scope)
    torch.save({'state_dict': MODELS.build(cfg.model).state_dict(), 'meta': {}}, tmp_path / 'seg.pth')
    res = run(['tools/test.py', 'configs/demo/weightformer_t_cls_demo.py', str(tmp_path / 'seg.pth'),
               '--work-dir', str(tmp_path / 'work'), '--cfg-options',
               f'test_dataloader.dataset.data_root={demo_data / "cls"}'])
    assert res.returncode != 0
    assert "CheckpointMismatchError: checkpoint '" + str(tmp_path / 'seg.pth') in res.stderr
    assert 'unexpected keys (93, under auxiliary_head.*, decode_head.*, neck.*)' in res.stderr
    assert 'accuracy/top1' not in res.stdout + res.stderr
