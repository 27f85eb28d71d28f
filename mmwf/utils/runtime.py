"""Running a config on this machine: adaptation to the device, CPU distribution."""
from __future__ import annotations

import torch
from mmengine.config import Config
from mmengine.logging import print_log


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
        dropped = [key for key in ('loss_scale', 'dtype', 'use_fsdp') if wrapper.pop(key, None) is not None]
        print_log('no CUDA device: AmpOptimWrapper -> OptimWrapper (fp32' + (f', without {", ".join(dropped)})'
                                                                              if dropped else ')'), logger='current')
    if _replace_sync_bn(cfg.model):
        print_log('no CUDA device: SyncBN -> BN', logger='current')


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
    initialisation once a group exists). Under ``FlexibleRunner`` the same for its strategy's wrapper: DDP without
    device ids, FSDP on the CPU (``device_id='cpu'``: its default is the GPU of LOCAL_RANK)."""
    if cfg.get('launcher', 'none') == 'none' or torch.cuda.is_available():
        return
    strategy = cfg.get('strategy') if cfg.get('runner_type') == 'FlexibleRunner' else None
    if strategy is not None:
        if strategy.get('type') in ('DDPStrategy', 'FSDPStrategy', 'ResumableFSDPStrategy'):
            wrapper = strategy.setdefault('model_wrapper', {})
            if strategy['type'] != 'DDPStrategy':
                wrapper['device_id'] = 'cpu'
            else:
                wrapper.update(device_ids=None, broadcast_buffers=False)
    else:
        if cfg.get('model_wrapper_cfg') is None:
            cfg.model_wrapper_cfg = dict(type='MMDistributedDataParallel', broadcast_buffers=False,
                                         find_unused_parameters=cfg.get('find_unused_parameters', False))
        cfg.model_wrapper_cfg.device_ids = None
    import torch.distributed as dist

    from mmwf.engine.world import export_launcher_environment
    if not dist.is_initialized():
        export_launcher_environment(cfg.launcher)  # srun and mpirun set no RANK: mmengine's init_dist would
        dist.init_process_group(backend='gloo')
        print_log(f'no CUDA device: gloo process group, rank {dist.get_rank()} of {dist.get_world_size()}',
                  logger='current')


def launched_device(device: str) -> str:
    """The device of this process under a distributed launcher: the GPU of its ``LOCAL_RANK`` (``cuda:i``) where
    ``device`` is CUDA, else ``device`` itself."""
    import os
    return f'cuda:{int(os.environ.get("LOCAL_RANK", 0))}' if device.startswith('cuda') else device


def init_tool_distributed(launcher: str, device: str) -> tuple[int, int, str]:
    """For a tool started by a launcher (torchrun, srun or mpirun: ``--launcher pytorch``, ``slurm``, ``mpi``): set
    torch.distributed's variables from the launcher's (:func:`mmwf.engine.world.export_launcher_environment`), take
    this process's GPU (:func:`launched_device`) before joining the process group, as mmengine's ``init_dist`` does
    (NCCL puts a rank on the current device and refuses two ranks on one GPU), then join it (NCCL on CUDA, gloo on
    CPU); returns (rank, world size, device). Without a launcher: (0, 1, ``device``)."""
    if launcher == 'none':
        return 0, 1, device
    import torch.distributed as dist

    from mmwf.engine.world import export_launcher_environment
    export_launcher_environment(launcher)
    device = launched_device(device)
    if device.startswith('cuda'):
        torch.cuda.set_device(device)
    dist.init_process_group('nccl' if device.startswith('cuda') else 'gloo')
    return dist.get_rank(), dist.get_world_size(), device
