"""Train a detector or segmentor from an mmdet / mmseg config with mmwf's modules.

    python tools/train.py configs/cascade_wf_t_coco.py [--work-dir DIR] [--resume [CKPT]] [--cfg-options k=v]
    bash tools/dist_train.sh CONFIG GPUS [args]     # torch.distributed, several nodes via NNODES / NODE_RANK
"""
import argparse

from tool_args import add_runner_args, load_tool_config

import mmwf  # noqa: F401  (registers modules)
from mmwf.engine import resume_checkpoint
from mmwf.engine.launch import build_runner, check_launcher, named_annotation_errors, restored_state
from mmwf.engine.work_dir import owned_work_dir
from mmwf.engine.world import launched_process, scale_to_world
from mmwf.utils import check_stack, close_distributed


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description='Train a model with mmwf backbones')
    parser.add_argument('config', help='config file')
    parser.add_argument('--resume', nargs='?', const='auto',
                        help="resume from CKPT, or the run's last checkpoint (past a damaged one, within the run)")
    parser.add_argument('--auto-scale-lr', action='store_true',
                        help="apply the reference's rule for this number of processes (auto_scale_lr.rule: 'linear' "
                             "scales the lr and minimum lr with the global batch, 'global_batch' sets the per-GPU "
                             "batch), and scale an iteration-based run's iterations and schedule to the reference's "
                             "images")
    add_runner_args(parser)
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    check_stack(require_mmcv_ops=True)
    cfg = load_tool_config(args)
    notes, scaled = [], []
    if args.resume == 'auto':
        path, notes = resume_checkpoint(cfg.work_dir, schedulers=cfg.get('param_scheduler') is not None)
        cfg.resume, cfg.load_from = path is not None, path
    elif args.resume:
        cfg.resume, cfg.load_from = True, args.resume
    check_launcher(cfg)  # a refused start leaves no lock in the work folder
    process = launched_process(args.launcher)  # before the process group exists: srun and mpirun set no RANK
    if args.auto_scale_lr:
        scaled = [f'--auto-scale-lr ({process.world_size} processes): {line}'
                  for line in scale_to_world(cfg, process.world_size)]
    try:
        with owned_work_dir(cfg.work_dir, process.rank) as taken, named_annotation_errors(cfg):
            runner = build_runner(cfg, ('train', 'val'))
            for line in [*notes, *taken]:
                runner.logger.warning(line)
            for line in scaled:
                runner.logger.info(line)
            with restored_state(runner):
                runner.train()
    finally:
        close_distributed()


if __name__ == '__main__':
    main()
