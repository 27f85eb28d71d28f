"""Evaluate a checkpoint: COCO box / mask AP (pycocotools) or mIoU (mmseg), as the config's evaluator says.

    python tools/test.py configs/cascade_wf_t_coco.py work_dirs/cascade_wf_t_coco/iter_184375.pth
    bash tools/dist_test.sh CONFIG CHECKPOINT GPUS [args]
"""
import argparse
import json
import numbers
import os
import os.path as osp

from mmengine.config import DictAction
from mmengine.registry import RUNNERS
from mmengine.runner import Runner

import mmwf  # noqa: F401  (registers modules, weights-only checkpoints)
from mmwf.utils import adapt_to_device, check_dataset_paths, check_stack, init_cpu_distributed, load_tool_config


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description='Test a model with mmwf backbones')
    parser.add_argument('config', help='config file')
    parser.add_argument('checkpoint', help='checkpoint file')
    parser.add_argument('--work-dir', help='where logs go (default ./work_dirs/<config>)')
    parser.add_argument('--out-json', help='also write the metrics to this JSON file')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction, help='override config keys: k=v')
    parser.add_argument('--launcher', choices=['none', 'pytorch', 'slurm', 'mpi'], default='none')
    parser.add_argument('--local_rank', '--local-rank', type=int, default=0)
    args = parser.parse_args()
    os.environ.setdefault('LOCAL_RANK', str(args.local_rank))
    return args


def main() -> None:
    args = parse_args()
    check_stack(require_mmcv_ops=True)
    if not osp.isfile(args.checkpoint):
        raise FileNotFoundError(f'checkpoint not found: {args.checkpoint}')
    cfg = load_tool_config(args.config, args.cfg_options, args.launcher, args.work_dir)
    cfg.load_from = args.checkpoint
    check_dataset_paths(cfg, ('test',))
    adapt_to_device(cfg)
    init_cpu_distributed(cfg)
    runner = Runner.from_cfg(cfg) if 'runner_type' not in cfg else RUNNERS.build(cfg)
    metrics = runner.test()
    if args.out_json and runner.rank == 0:
        with open(args.out_json, 'w') as f:
            json.dump({k: float(v) for k, v in metrics.items() if isinstance(v, numbers.Real)}, f, indent=1)


if __name__ == '__main__':
    main()
