"""Evaluate a model: COCO box / mask AP (pycocotools), mIoU (mmseg) or top-1 / top-5 (mmpretrain), as the config's
evaluator says, on a trained checkpoint or, without one, on the weights the config's init_cfg loads (e.g. released
ImageNet weights).

    python tools/test.py configs/cascade_wf_t_coco.py work_dirs/cascade_wf_t_coco/iter_184375.pth
    python tools/test.py configs/imagenet/weightformer_t_in1k.py \
        --cfg-options model.backbone.init_cfg.type=Pretrained \
        model.backbone.init_cfg.checkpoint=checkpoints/weightformer_t.safetensors
    bash tools/dist_test.sh CONFIG CHECKPOINT GPUS [args]
"""
import argparse
import json
import numbers
import os.path as osp

from tool_args import add_runner_args, load_tool_config

import mmwf  # noqa: F401  (registers modules, weights-only checkpoints)
from mmwf.utils import build_runner, check_stack


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description='Test a model with mmwf backbones')
    parser.add_argument('config', help='config file')
    parser.add_argument('checkpoint', nargs='?', help="checkpoint file (default: the config's init_cfg weights)")
    parser.add_argument('--out-json', help='also write the metrics to this JSON file')
    add_runner_args(parser)
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    check_stack(require_mmcv_ops=True)
    if args.checkpoint and not osp.isfile(args.checkpoint):
        raise FileNotFoundError(f'checkpoint not found: {args.checkpoint}')
    cfg = load_tool_config(args)
    cfg.load_from = args.checkpoint
    runner = build_runner(cfg, ('test',))
    if not args.checkpoint:  # the Runner initialises weights only for training
        getattr(runner.model, 'module', runner.model).init_weights()
    metrics = runner.test()
    if args.out_json and runner.rank == 0:
        with open(args.out_json, 'w') as f:
            json.dump({k: float(v) for k, v in metrics.items() if isinstance(v, numbers.Real)}, f, indent=1)


if __name__ == '__main__':
    main()
