"""Train a detector or segmentor from an mmdet / mmseg config with mmwf's modules.

    python tools/train.py configs/cascade_wf_t_coco.py [--work-dir DIR] [--resume [CKPT]] [--cfg-options k=v]
    bash tools/dist_train.sh CONFIG GPUS [args]     # torch.distributed, several nodes via NNODES / NODE_RANK
"""
import argparse
import os

from mmengine.config import DictAction
from mmengine.registry import RUNNERS
from mmengine.runner import Runner

import mmwf  # noqa: F401  (registers modules, weights-only checkpoints)
from mmwf.utils import adapt_to_device, check_dataset_paths, check_stack, init_cpu_distributed, load_tool_config


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description='Train a model with mmwf backbones')
    parser.add_argument('config', help='config file')
    parser.add_argument('--work-dir', help='where logs and checkpoints go (default ./work_dirs/<config>)')
    parser.add_argument('--resume', nargs='?', const='auto', help='resume from CKPT, or the latest one')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction, help='override config keys: k=v')
    parser.add_argument('--launcher', choices=['none', 'pytorch', 'slurm', 'mpi'], default='none')
    parser.add_argument('--local_rank', '--local-rank', type=int, default=0)
    args = parser.parse_args()
    os.environ.setdefault('LOCAL_RANK', str(args.local_rank))
    return args


def main() -> None:
    args = parse_args()
    check_stack(require_mmcv_ops=True)
    cfg = load_tool_config(args.config, args.cfg_options, args.launcher, args.work_dir)
    if args.resume == 'auto':
        cfg.resume, cfg.load_from = True, None
    elif args.resume:
        cfg.resume, cfg.load_from = True, args.resume
    check_dataset_paths(cfg, ('train', 'val'))
    adapt_to_device(cfg)
    init_cpu_distributed(cfg)
    runner = Runner.from_cfg(cfg) if 'runner_type' not in cfg else RUNNERS.build(cfg)
    runner.train()


if __name__ == '__main__':
    main()
