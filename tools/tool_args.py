"""Command-line options shared by tools/train.py and tools/test.py."""
import argparse
import os

from mmengine.config import Config, DictAction

from mmwf.configs import check_image_size_option, follow_image_size, record_followed
from mmwf.engine.world import LAUNCHERS


def add_runner_args(parser: argparse.ArgumentParser) -> None:
    """The options tools/train.py and tools/test.py share."""
    parser.add_argument('--work-dir', help='where logs (and checkpoints) go (default ./work_dirs/<config>)')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction, help='override config keys: k=v')
    parser.add_argument('--launcher', choices=LAUNCHERS, default='none')
    parser.add_argument('--local_rank', '--local-rank', type=int, default=0)


def load_tool_config(args: argparse.Namespace) -> Config:
    """The config as tools/train.py and tools/test.py use it: overrides merged, launcher set, work_dir
    defaulting to ./work_dirs/<config name>, a changed image_size followed (:func:`mmwf.configs.follow_image_size`;
    what it did is kept on the config for :func:`mmwf.engine.launch.build_runner` to log); LOCAL_RANK exported for
    the launcher."""
    os.environ.setdefault('LOCAL_RANK', str(args.local_rank))
    cfg = Config.fromfile(args.config)
    check_image_size_option(cfg, args.cfg_options, args.config)
    if args.cfg_options:
        cfg.merge_from_dict(args.cfg_options)
    # a changed image_size (here or in a child config) reaches its crops, pads and scales; logged by build_runner
    record_followed(cfg, follow_image_size(cfg))
    cfg.launcher = args.launcher
    cfg.work_dir = args.work_dir or cfg.get('work_dir') or os.path.join(
        './work_dirs', os.path.splitext(os.path.basename(args.config))[0])
    return cfg
