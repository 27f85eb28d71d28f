"""Evaluate a model: COCO box / mask AP (pycocotools), mIoU (mmseg) or top-1 / top-5 (mmpretrain), as the config's
evaluator says, on a trained checkpoint or, without one, on the weights the config's init_cfg loads (e.g. released
ImageNet weights).

    python tools/test.py configs/cascade_wf_t_coco.py work_dirs/cascade_wf_t_coco/iter_184375.pth
    python tools/test.py configs/imagenet/weightformer_t_in1k.py \
        --cfg-options model.backbone.init_cfg.type=Pretrained \
        model.backbone.init_cfg.checkpoint=checkpoints/weightformer_t.safetensors
    python tools/test.py configs/demo/upernet_wf_t_demo.py CHECKPOINT --show-dir pictures/ --show-max 8
    bash tools/dist_test.sh CONFIG CHECKPOINT GPUS [args]

``--show-dir`` draws ground truth and prediction of each test image (boxes and masks, colour maps, classes) with
the config's visualizer into that folder, one ``<image name>.png`` per image (``ShowPredictionsHook``).
"""
import argparse
import json
import numbers
import os.path as osp

from tool_args import add_runner_args, load_tool_config

import mmwf  # noqa: F401  (registers modules)
from mmwf.engine.launch import build_runner, named_annotation_errors, restored_state
from mmwf.utils import check_stack, close_distributed
from mmwf.utils.checkpoint import atomic_write


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description='Test a model with mmwf backbones')
    parser.add_argument('config', help='config file')
    parser.add_argument('checkpoint', nargs='?', help="checkpoint file (default: the config's init_cfg weights)")
    parser.add_argument('--out-json', help='also write the metrics to this JSON file')
    parser.add_argument('--show-dir', help='draw ground truth and prediction of the test images into this folder')
    parser.add_argument('--show-max', type=int, help='with --show-dir: only the first N images (default: all)')
    add_runner_args(parser)
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    check_stack(require_mmcv_ops=True)
    if args.checkpoint and not osp.isfile(args.checkpoint):
        raise FileNotFoundError(f'checkpoint not found: {args.checkpoint}')
    cfg = load_tool_config(args)
    cfg.load_from = args.checkpoint
    if args.show_max is not None and not args.show_dir:
        raise SystemExit('--show-max limits the pictures of --show-dir: give --show-dir too')
    if args.show_dir:
        cfg.custom_hooks = [*cfg.get('custom_hooks', []), dict(
            type='ShowPredictionsHook', out_dir=osp.abspath(args.show_dir), max_images=args.show_max)]
    try:
        with named_annotation_errors(cfg):
            runner = build_runner(cfg, ('test',))
            if not args.checkpoint:  # the Runner initialises weights only for training
                getattr(runner.model, 'module', runner.model).init_weights()
            with restored_state(runner):
                metrics = runner.test()
    finally:
        close_distributed()
    if args.out_json and runner.rank == 0:
        scores = {k: float(v) for k, v in metrics.items() if isinstance(v, numbers.Real)}
        atomic_write(args.out_json, lambda f: json.dump(scores, f, indent=1), mode='w')


if __name__ == '__main__':
    main()
