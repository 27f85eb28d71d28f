"""End-to-end demo on synthetic data: generate it (if absent), train and test the Cascade Mask R-CNN
WeightFormer-T demo and the UperNet WeightFormer-T demo from scratch, print box / mask AP and mIoU.

    python tools/demo.py                      # what `make demo` runs (about 10 minutes on 2 CPU cores)
    python tools/demo.py --tasks seg --max-iters 20 --work-dir /tmp/demo
    python tools/demo.py --tasks distill-seg  # DeiT-T ReLU student distilled from softmax DeiT-T in UperNet
    python tools/demo.py --tasks cls distill-cls  # ImageNet-style classification: WeightFormer-T; DeiT-T ReLU student
    python tools/demo.py --tasks gen          # class-conditional generation: WF-DiT and DiT in pixel space, 16 x 16

The ``distill-*`` tasks also print ``loss_distill`` at the first and the last logged iteration. Every task draws the
ground truth and the prediction of the first four validation images (``tools/test.py --show-dir``) into
``WORK_DIR/TASK/pictures/`` and prints their paths. ``gen`` trains the WF-DiT demo and its DiT baseline the same
way, samples ``--samples-per-class`` images per class from each (EMA weights), and prints the share that a small
CNN classifier, trained on the real images with their colour channels shuffled (so that it reads shapes, not
colours), assigns to the conditioning class, with its 95 % interval (and its share on real validation images), and
the Fréchet distance of samples and training images in that classifier's features (not FID; only with at least twice
as many samples as features); ``WORK_DIR/gen/samples.png`` shows 8 samples per class of each model.
"""
from __future__ import annotations

import argparse
import json
import os
import os.path as osp
import shutil
import subprocess
import sys
import time

from mmwf.utils.fork_server import ForkServer

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
TASKS = {
    'det': ('configs/demo/cascade_wf_t_demo.py', ('coco/bbox_mAP', 'coco/bbox_mAP_50', 'coco/segm_mAP',
                                                  'coco/segm_mAP_50')),
    'seg': ('configs/demo/upernet_wf_t_demo.py', ('mIoU', 'aAcc')),
    'distill-seg': ('configs/demo/upernet_deit_relu_distill_demo.py', ('mIoU', 'aAcc')),
    'distill-det': ('configs/demo/cascade_deit_ttt_distill_demo.py', ('coco/bbox_mAP', 'coco/bbox_mAP_50')),
    'cls': ('configs/demo/weightformer_t_cls_demo.py', ('accuracy/top1',)),
    'distill-cls': ('configs/demo/deit_relu_distill_cls_demo.py', ('accuracy/top1',)),
    'gen': ('configs/demo/wf_dit_gen_demo.py', ()),  # and its DiT baseline, GENERATORS
}
GENERATORS = {'WF-DiT': 'configs/demo/wf_dit_gen_demo.py', 'DiT': 'configs/demo/dit_gen_demo.py'}
DATA = {'det': 'coco/', 'seg': 'ade', 'cls': 'cls', 'gen': 'gen'}  # demo data folder of each task kind
DEFAULT_TASKS = ('det', 'seg')
PICTURES = 4  # validation images drawn per task
SERVER: ForkServer | None = None  # the demo's fork server, started at its first run


def distill_losses(work_dir: str) -> tuple[float, float]:
    """``loss_distill`` at the first and the last logged training iteration (mmengine's scalars.json)."""
    runs = sorted(d for d in os.listdir(work_dir) if osp.isfile(osp.join(work_dir, d, 'vis_data', 'scalars.json')))
    with open(osp.join(work_dir, runs[-1], 'vis_data', 'scalars.json')) as f:
        values = [r['loss_distill'] for r in map(json.loads, f) if 'loss_distill' in r]
    return values[0], values[-1]


def run(args: list[str], log: str) -> None:
    """Run a tool with this interpreter, its output to ``log``: forked from one interpreter that imported mmwf for
    the demo's runs (:mod:`mmwf.utils.fork_server`; about 5 s saved a run), else fresh. Fail with the log's tail."""
    global SERVER
    if SERVER is None:
        SERVER = ForkServer(os.environ, ROOT)
    env = dict(os.environ)
    if SERVER.serves(args, env):
        proc = SERVER.run(args, ROOT, env, None, output=log)
    else:
        with open(log, 'w') as f:
            proc = subprocess.run([sys.executable, *args], cwd=ROOT, stdout=f, stderr=subprocess.STDOUT)
    if proc.returncode:
        with open(log) as f:
            tail = ''.join(f.readlines()[-30:])
        raise SystemExit(f'{" ".join(args)} failed (log: {log}):\n{tail}')


def generation_demo(args) -> str:
    """Train both generators, then sample and measure them (the ``gen`` task); its summary line."""
    import torch
    from mmengine.config import Config, DictAction
    from mmengine.registry import init_default_scope

    from mmwf.analysis.generation_measures import classifier_measures, load_class_folder, save_grid, train_classifier
    from mmwf.registry import MODELS
    from mmwf.utils.checkpoint import load_state_dict_file, load_strict
    work_dir, root = osp.join(args.work_dir, 'gen'), osp.join(args.data_root, 'gen')
    os.makedirs(work_dir, exist_ok=True)
    start, checkpoints = time.time(), {}
    for name, config in GENERATORS.items():
        out = osp.join(work_dir, name.lower())
        options = [f'train_dataloader.dataset.root={osp.join(root, "train")}', *args.cfg_options]
        if args.max_iters:
            options += [f'train_cfg.max_iters={args.max_iters}', f'default_hooks.checkpoint.interval={args.max_iters}']
        print(f'[gen] training {config} (log: {out}/train.log)', flush=True)
        os.makedirs(out, exist_ok=True)
        run(['tools/train.py', config, '--work-dir', out, '--cfg-options', *options], osp.join(out, 'train.log'))
        with open(osp.join(out, 'last_checkpoint')) as f:
            checkpoints[name] = f.read().strip()
    train_time = time.time() - start
    size = Config.fromfile(osp.join(ROOT, GENERATORS['WF-DiT'])).model.denoiser.input_size
    train_images, train_labels = load_class_folder(osp.join(root, 'train'), size)
    real, real_labels = load_class_folder(osp.join(root, 'val'), size)
    classes = sorted(os.listdir(osp.join(root, 'train')))
    print(f'[gen] training the demo classifier on {len(train_images)} real images', flush=True)
    classifier = train_classifier(train_images, train_labels, len(classes),
                                  **({'steps': args.max_iters} if args.max_iters else {}))
    labels = torch.arange(len(classes)).repeat_interleave(args.samples_per_class)
    rows, titles, parts = [], [], []
    init_default_scope('mmengine')
    for name, config in GENERATORS.items():
        cfg = Config.fromfile(osp.join(ROOT, config))
        cfg.merge_from_dict({k: DictAction._parse_iterable(v) for k, v in (o.split('=', 1) for o in args.cfg_options)})
        model = MODELS.build(cfg.model)
        load_strict(model, load_state_dict_file(checkpoints[name]), checkpoints[name])  # its state_dict: EMA weights
        model.eval()
        samples = torch.cat([s['fake_img'][None] for s in model.predict(labels)])
        m = classifier_measures(classifier, samples, labels, real, real_labels, train_images)
        low, high = m['samples_interval']
        distance = ('' if m['frechet'] is None else
                    f', Fréchet distance to the training images in the classifier\'s features {m["frechet"]:.2f}')
        parts.append(f'{name} samples {m["samples_correct"]:.3f} of their class (95 % {low:.3f}-{high:.3f}, '
                     f'{len(samples)} samples){distance}')
        real_share = m['real_correct']
        rows += [samples[labels == c][:8] for c in range(len(classes))]
        titles += [f'{name} {c}' for c in classes]
    picture = osp.join(work_dir, 'samples.png')
    save_grid(rows, picture, titles)
    total = (time.time() - start) / 60
    print(f'[gen] samples (8 per class, rows: model and class): {picture}', flush=True)
    return (f'gen: {"; ".join(parts)}; real images {real_share:.3f} (train both {train_time / 60:.1f} min, '
            f'with sampling {total:.1f} min)')


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--tasks', nargs='+', default=list(DEFAULT_TASKS), choices=list(TASKS))
    parser.add_argument('--work-dir', default=osp.join(ROOT, 'work_dirs', 'demo'))
    parser.add_argument('--data-root', default=osp.join(ROOT, 'data', 'demo'))
    parser.add_argument('--max-iters', type=int, help='shorter schedule (for tests): every training, the generation '
                        "demo's judging classifier too")
    parser.add_argument('--samples-per-class', type=int, default=50, help='gen: samples of each class and model')
    parser.add_argument('--cfg-options', nargs='+', default=[], help='extra k=v overrides for every task')
    parser.add_argument('--num-images', type=int, nargs=2, default=(160, 40), metavar=('TRAIN', 'VAL'),
                        help='demo data size when it has to be generated')
    args = parser.parse_args()

    from mmengine.config import Config

    from mmwf.datasets import generate
    from mmwf.datasets.synthetic import GENERATION_LAYOUT, stale_generation_folder
    from mmwf.demo import write_softmax_stand_in
    from mmwf.utils import check_stack
    check_stack(require_mmcv_ops=True)

    softmax = osp.join(args.data_root, 'checkpoints', 'deit_t_softmax.pth')
    expected = [osp.join(args.data_root, 'coco', 'annotations', 'instances_train.json'),
                osp.join(args.data_root, 'cls', 'val', 'triangle'), osp.join(args.data_root, 'gen', 'val', 'triangle')]
    if stale_generation_folder(args.data_root):
        print(f'{args.data_root}/gen holds an earlier layout of the generation demo\'s data (now: '
              f'{GENERATION_LAYOUT}): writing it again', flush=True)
        shutil.rmtree(osp.join(args.data_root, 'gen'))
    if not all(osp.exists(f) for f in expected):
        print(f'generating demo data in {args.data_root}', flush=True)
        generate(args.data_root, train=args.num_images[0], val=args.num_images[1])
    if not osp.exists(softmax):
        write_softmax_stand_in(softmax)
    os.makedirs(args.work_dir, exist_ok=True)
    summary = []
    for task in args.tasks:
        if task == 'gen':
            summary.append(generation_demo(args))
            continue
        config, keys = TASKS[task]
        work_dir = osp.join(args.work_dir, task)
        root = osp.join(args.data_root, DATA[task.split('-')[-1]])
        options = [f'train_dataloader.dataset.data_root={root}', f'val_dataloader.dataset.data_root={root}',
                   f'test_dataloader.dataset.data_root={root}']
        if task.startswith('distill'):
            options += [f'model.student.backbone.init_cfg.checkpoint={softmax}',
                        f'model.teacher.init_cfg.checkpoint={softmax}']
        if task.endswith('det'):
            options += [f'val_evaluator.ann_file={root}annotations/instances_val.json',
                        f'test_evaluator.ann_file={root}annotations/instances_val.json']
        if args.max_iters:
            options += [f'train_cfg.max_iters={args.max_iters}', f'default_hooks.checkpoint.interval={args.max_iters}']
        options += args.cfg_options
        # the test run below evaluates the validation images: the training's own validation at its end would repeat it
        given = dict(option.split('=', 1) for option in options)
        last = int(given.get('train_cfg.max_iters') or Config.fromfile(osp.join(ROOT, config)).train_cfg.max_iters)
        options.append(f'train_cfg.val_begin={last + 1}')
        start = time.time()
        print(f'[{task}] training {config} (log: {work_dir}/train.log)', flush=True)
        os.makedirs(work_dir, exist_ok=True)
        run(['tools/train.py', config, '--work-dir', work_dir, '--cfg-options', *options],
            osp.join(work_dir, 'train.log'))
        train_time = time.time() - start
        with open(osp.join(work_dir, 'last_checkpoint')) as f:
            checkpoint = f.read().strip()
        metrics_file = osp.join(work_dir, 'metrics.json')
        print(f'[{task}] testing {checkpoint}', flush=True)
        pictures = osp.join(work_dir, 'pictures')
        run(['tools/test.py', config, checkpoint, '--work-dir', work_dir, '--out-json', metrics_file,
             '--show-dir', pictures, '--show-max', str(PICTURES), '--cfg-options', *options],
            osp.join(work_dir, 'test.log'))
        with open(metrics_file) as f:
            metrics = json.load(f)
        values = ', '.join(f'{k.split("/")[-1]} {metrics[k]:.3f}' for k in keys if k in metrics)
        if task.startswith('distill'):
            first, last = distill_losses(work_dir)
            values += f', loss_distill {first:.4f} -> {last:.4f}'
        total = (time.time() - start) / 60
        summary.append(f'{task}: {values} (train {train_time / 60:.1f} min, train + test {total:.1f} min)')
        print(f'[{task}] {summary[-1]}', flush=True)
        print(f'[{task}] pictures (ground truth | prediction): '
              + ', '.join(osp.join(pictures, f) for f in sorted(os.listdir(pictures))), flush=True)
    print('\n'.join(['demo results:', *summary]))


if __name__ == '__main__':
    main()
