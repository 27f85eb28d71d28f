"""Sample a generation config's model (the EMA weights that its checkpoints hold) and write the samples as PNGs and
as one ADM-format ``.npz`` (``arr_0``: uint8 N x H x W x 3, and ``labels``) for ADM's evaluator
(openai/guided-diffusion, evaluations/evaluator.py). Labels as the config's test set draws them.

Sample i's label and noise depend on i alone, so the set is the same for any number of processes and batch size.
Several processes (``torchrun ... --launcher pytorch``) take every W-th index each, as
DiT's sample_ddp.py; each PNG is written whole (renamed into place), and a run started again skips the PNGs that
exist. The folder's ``sampling.json`` records what the samples depend on (the model config with its sampling
settings and seed, the checkpoint's content, the labels' dataset, the number of samples): a run on a folder of
samples drawn otherwise, or of PNGs without that record, is an error listing the differences. The ``.npz`` is
assembled from the PNGs one image at a time (memory: one image).

    python tools/generation/sample.py configs/generation/wf_dit_s_2_in256.py work_dirs/wf_dit_s_2/iter_400000.pth \
        --num-samples 50000 --out work_dirs/wf_dit_s_2/samples --device cuda
    torchrun --nproc_per_node 8 tools/generation/sample.py CONFIG CHECKPOINT --out DIR --launcher pytorch
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import os.path as osp
import zipfile

import numpy as np
import torch
import torch.distributed as dist
from mmengine.config import Config, DictAction
from mmengine.registry import init_default_scope
from PIL import Image

from mmwf.engine.world import LAUNCHERS
from mmwf.registry import DATASETS, MODELS
from mmwf.utils import init_tool_distributed
from mmwf.utils.arrays import read_image
from mmwf.utils.checkpoint import atomic_write, load_state_dict_file, load_strict


def png_path(out: str, index: int) -> str:
    return osp.join(out, f'{index:06d}.png')


def write_png(path: str, image: np.ndarray) -> None:
    """The PNG whole or not at all: written beside it, then renamed."""
    tmp = osp.join(osp.dirname(path), f'.{osp.basename(path)}.{os.getpid()}.tmp')
    Image.fromarray(image).save(tmp, format='PNG')
    os.replace(tmp, path)


RECORD = 'sampling.json'
LABELS_CONFIG = 'configs/generation/wf_dit_s_2_in256.py'  # a config whose test_dataloader draws the labels


def file_digest(path: str) -> str:
    """sha256 of a file's content."""
    digest = hashlib.sha256()
    with open(path, 'rb') as f:
        for chunk in iter(lambda: f.read(1 << 24), b''):
            digest.update(chunk)
    return digest.hexdigest()


def sampling_record(cfg: Config, checkpoint: str, num_samples: int) -> dict:
    """What the samples depend on, as plain data: not the batch size, the number of processes or the device."""
    return json.loads(json.dumps(dict(model=cfg.model.to_dict(), labels=cfg.test_dataloader.dataset.to_dict(),
                                      num_samples=num_samples, checkpoint_sha256=file_digest(checkpoint)),
                                 default=str))


def differences(recorded: object, current: object, key: str = '') -> list[str]:
    """``'key: recorded -> current'`` for every leaf where two plain-data records differ."""
    if isinstance(recorded, dict) and isinstance(current, dict):
        return [line for k in sorted(set(recorded) | set(current), key=str)
                for line in differences(recorded.get(k), current.get(k), f'{key}.{k}' if key else str(k))]
    return [] if recorded == current else [f'{key}: {recorded!r} -> {current!r}']


def check_out_folder(out: str, record: dict) -> bool:
    """Whether ``out`` already holds this run's record; a folder of samples drawn otherwise, or of PNGs without a
    record, is a SystemExit listing the differences."""
    path = osp.join(out, RECORD)
    if osp.isfile(path):
        with open(path) as f:
            changed = differences(json.load(f), record)
        if changed:
            raise SystemExit('\n'.join([
                f'error: {out} holds samples drawn with other settings ({RECORD}); adding to them would mix two '
                'sample sets:', *[f'  {line}' for line in changed[:12]],
                'Sample into a new --out, or remove that folder to draw it again.']))
        return True
    if any(name.endswith('.png') for name in os.listdir(out)):
        raise SystemExit(f'error: {out} holds PNGs but no {RECORD} saying what drew them; sample into a new --out, '
                         'or remove them.')
    return False


def write_npz(path: str, out: str, labels: np.ndarray) -> None:
    """``arr_0`` (N x H x W x 3 uint8, from the PNGs 0..N-1 one at a time) and ``labels``, as ``np.savez`` lays them
    out (an uncompressed zip of ``.npy`` files)."""
    first = np.asarray(read_image(png_path(out, 0)))
    shape = (len(labels), *first.shape)

    def write(f) -> None:
        with zipfile.ZipFile(f, 'w', zipfile.ZIP_STORED, allowZip64=True) as archive:
            with archive.open('arr_0.npy', 'w', force_zip64=True) as member:
                np.lib.format.write_array_header_2_0(member, dict(descr='|u1', fortran_order=False, shape=shape))
                for i in range(len(labels)):
                    image = np.asarray(read_image(png_path(out, i)))
                    if image.shape != first.shape:
                        raise ValueError(f'{png_path(out, i)} is {image.shape}, the others {first.shape}: remove it '
                                         f'and sample again')
                    member.write(np.ascontiguousarray(image, dtype=np.uint8).tobytes())
            with archive.open('labels.npy', 'w') as member:
                np.lib.format.write_array(member, np.asarray(labels))

    atomic_write(path, write)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('config')
    parser.add_argument('checkpoint', help='an mmwf checkpoint of the config (tools/model_converters/dit_to_mmwf.py '
                        'converts DiT / WeightFormer-release .pt files)')
    parser.add_argument('--out', required=True, help='folder for the PNGs and samples_N.npz')
    parser.add_argument('--num-samples', type=int, default=50000)
    parser.add_argument('--batch-size', type=int, default=32, help='samples per forward pass of each process')
    parser.add_argument('--cfg-scale', type=float, help='classifier-free guidance (default: the config\'s)')
    parser.add_argument('--no-png', action='store_true', help='remove the PNGs once the .npz is written')
    parser.add_argument('--tf32', action=argparse.BooleanOptionalAction, default=True,
                        help='TF32 matmuls on Ampere and later GPUs (DiT sample_ddp.py --tf32, on by default)')
    parser.add_argument('--launcher', choices=LAUNCHERS, default='none')
    parser.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction, default={})
    args = parser.parse_args()

    rank, world_size, args.device = init_tool_distributed(args.launcher, args.device)
    torch.backends.cuda.matmul.allow_tf32 = args.tf32
    cfg = Config.fromfile(args.config)
    cfg.merge_from_dict(args.cfg_options)
    if cfg.get('test_dataloader') is None or cfg.get('model', {}).get('type') != 'LatentDiffusion':
        missing = 'test_dataloader (whose dataset draws the labels of the samples)' if cfg.get('model', {}).get(
            'type') == 'LatentDiffusion' else f'a LatentDiffusion model (it has {cfg.get("model", {}).get("type")})'
        raise SystemExit(f'error: {args.config} lacks {missing}; sample a generation config such as '
                         f'{LABELS_CONFIG}')
    if not osp.isfile(args.checkpoint):
        raise SystemExit(f'error: checkpoint {args.checkpoint!r} not found')
    os.makedirs(args.out, exist_ok=True)
    if not os.access(args.out, os.W_OK):
        raise SystemExit(f'error: --out {args.out} is not writable')
    init_default_scope(cfg.get('default_scope', 'mmengine'))
    if args.cfg_scale is not None:
        cfg.model.cfg_scale = args.cfg_scale
    record = sampling_record(cfg, args.checkpoint, args.num_samples)
    recorded = check_out_folder(args.out, record)
    if world_size > 1:
        dist.barrier()  # every rank has seen the folder as it was before rank 0 records this run
    if rank == 0 and not recorded:
        atomic_write(osp.join(args.out, RECORD), lambda f: json.dump(record, f, indent=1), mode='w')
    model = MODELS.build(cfg.model)
    load_strict(model, load_state_dict_file(args.checkpoint), args.checkpoint)
    model.to(args.device).eval()
    labels = DATASETS.build(dict(cfg.test_dataloader.dataset, num_samples=args.num_samples)).labels
    todo = [i for i in range(rank, len(labels), world_size) if not osp.isfile(png_path(args.out, i))]
    done = len(range(rank, len(labels), world_size)) - len(todo)
    if done:
        print(f'rank {rank}: {done} samples found in {args.out}, {len(todo)} to draw', flush=True)
    for start in range(0, len(todo), args.batch_size):
        indices = torch.as_tensor(todo[start:start + args.batch_size])
        batch = torch.as_tensor(labels[indices.numpy()], device=args.device)
        for sample in model.predict(batch, indices):
            write_png(png_path(args.out, sample['index']), sample['fake_img'].permute(1, 2, 0).cpu().numpy())
        print(f'rank {rank}: {done + start + len(indices)} / {done + len(todo)} samples', flush=True)
    if world_size > 1:
        dist.barrier()
    path = osp.join(args.out, f'samples_{len(labels)}.npz')
    if rank == 0:
        write_npz(path, args.out, labels)
        if args.no_png:
            for i in range(len(labels)):
                os.remove(png_path(args.out, i))
        print(f'wrote {path}' + ('' if args.no_png else f' and {len(labels)} PNGs in {args.out}'), flush=True)
    if world_size > 1:
        dist.barrier()
        dist.destroy_process_group()


if __name__ == '__main__':
    main()
