"""Running a config: dataset checks, adaptation to the device, CPU distribution, the runner."""
from __future__ import annotations

import os

import torch
from mmengine.config import Config
from mmengine.logging import print_log

from mmwf.datasets.checks import dataset_configs

DATASET_HELP = {
    'CocoDataset': ('COCO 2017 (train2017/, val2017/, annotations/instances_{train,val}2017.json) from '
                    'cocodataset.org, placed under data/coco/'),
    'ADE20KDataset': ('ADE20K (ADEChallengeData2016: images/ and annotations/ with training/ and validation/) '
                      'from the MIT Scene Parsing Benchmark, placed under data/ade/'),
    'ImageNet': ('ImageNet-1K (ILSVRC2012: train/ and val/, one folder per class, val images sorted into their '
                 'class folders) from image-net.org, placed under data/imagenet/'),
    'CustomDataset': 'an image folder with one sub-folder per class',
}
DEMO_HELP = ('To try mmwf without it, generate the synthetic demo data and use a demo config: '
             '`python tools/generate_demo_data.py` then e.g. `python tools/train.py '
             'configs/demo/cascade_wf_t_demo.py` (or simply `make demo`).')


def check_dataset_paths(cfg: Config, splits: tuple[str, ...] = ('train', 'val', 'test')) -> None:
    """Raise FileNotFoundError naming the missing dataset folder or file, where to get the data, and the
    demo data, before the runner starts."""
    for split in splits:
        loader = cfg.get(f'{split}_dataloader')
        if not loader:
            continue
        for ds in dataset_configs(loader):
            root = ds.get('data_root', '')
            prefix = ds.get('data_prefix') or {}
            paths = [ds.get('ann_file', ''), ds.get('split', '')] + list(
                prefix.values() if isinstance(prefix, dict) else [prefix])
            missing = [os.path.join(root, p) for p in paths if p and not os.path.exists(os.path.join(root, p))]
            if root and not os.path.isdir(root):
                missing = [root]
            if missing:
                help_text = DATASET_HELP.get(ds.get('type'), f"the {ds.get('type')} dataset")
                raise FileNotFoundError(
                    f'{split} data not found: {", ".join(missing)} (cwd {os.getcwd()}).\n'
                    f'Get {help_text}, or point the config at it with '
                    f'--cfg-options {split}_dataloader.dataset.data_root=PATH.\n{DEMO_HELP}')


def _replace_sync_bn(node: object) -> int:
    count = 0
    if isinstance(node, dict):
        if node.get('type') == 'SyncBN':
            node['type'] = 'BN'
            count += 1
        for value in node.values():
            count += _replace_sync_bn(value)
    elif isinstance(node, (list, tuple)):
        count += sum(_replace_sync_bn(v) for v in node)
    return count


def adapt_to_device(cfg: Config) -> None:
    """Without CUDA: mixed precision (AmpOptimWrapper) becomes plain fp32 and SyncBN becomes BN, so a GPU
    config runs unchanged on CPU; each change is logged."""
    if torch.cuda.is_available():
        return
    wrapper = cfg.get('optim_wrapper', {})
    if wrapper.get('type') == 'AmpOptimWrapper':
        wrapper['type'] = 'OptimWrapper'
        wrapper.pop('loss_scale', None)
        print_log('no CUDA device: AmpOptimWrapper -> OptimWrapper (fp32)', logger='current')
    if _replace_sync_bn(cfg.model):
        print_log('no CUDA device: SyncBN -> BN', logger='current')


def build_runner(cfg: Config, splits: tuple[str, ...]):
    """Check the data of ``splits``, adapt the config to the device, start CPU distribution if asked, and build the
    config's runner (:class:`~mmwf.engine.StrictRunner` unless the config names another ``runner_type``)."""
    from mmengine.registry import RUNNERS

    check_dataset_paths(cfg, splits)
    adapt_to_device(cfg)
    init_cpu_distributed(cfg)
    cfg.setdefault('runner_type', 'StrictRunner')
    return RUNNERS.build(cfg)


def close_distributed() -> None:
    """Destroy the process group, if one was started, before the interpreter exits: gloo's threads would
    otherwise outlive it, and a run that finished aborts at exit ("terminate called without an active
    exception", a non-zero exit status)."""
    import torch.distributed as dist
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def init_cpu_distributed(cfg: Config) -> None:
    """With a distributed launcher but no CUDA, start the process group here with gloo, and wrap the model
    in DDP without device ids: mmengine's own initialisation calls ``torch.cuda.set_device`` and its DDP
    wrapper passes ``device_ids=[LOCAL_RANK]``, both of which fail on CPU (the Runner skips its own
    initialisation once a group exists)."""
    if cfg.get('launcher', 'none') == 'none' or torch.cuda.is_available():
        return
    if cfg.get('model_wrapper_cfg') is None:
        cfg.model_wrapper_cfg = dict(type='MMDistributedDataParallel', broadcast_buffers=False,
                                     find_unused_parameters=cfg.get('find_unused_parameters', False))
    cfg.model_wrapper_cfg.device_ids = None
    import torch.distributed as dist
    if not dist.is_initialized():
        dist.init_process_group(backend='gloo')
        print_log(f'no CUDA device: gloo process group, rank {dist.get_rank()} of {dist.get_world_size()}',
                  logger='current')
