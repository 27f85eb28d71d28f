"""Convert a facebookresearch/DiT or WeightFormer-release DiT checkpoint (``.pt``: a bare state dict, or
``model`` / ``ema`` / ``opt`` / ``args`` as their train.py writes it) into an mmwf checkpoint of a generation config
(``state_dict`` with ``denoiser.`` keys), checked strictly against the config's denoiser.

    python tools/model_converters/dit_to_mmwf.py DiT-XL-2-256x256.pt dit_xl_2.pth --config CONFIG
    python tools/model_converters/dit_to_mmwf.py 0400000.pt wf_dit_s_2.pth --config \
        configs/generation/wf_dit_s_2_in256.py --weights ema
"""
from __future__ import annotations

import argparse

import torch
from mmengine.config import Config
from mmengine.registry import init_default_scope

from mmwf.registry import MODELS
from mmwf.utils.checkpoint import (
    CheckpointError,
    atomic_save,
    load_weights_only,
    mismatch_lines,
    state_dict_mismatch,
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('src')
    parser.add_argument('dst')
    parser.add_argument('--config', required=True, help='the generation config the checkpoint is for')
    parser.add_argument('--weights', choices=('ema', 'model'), default='ema',
                        help='which weights of a training checkpoint (default: ema, what DiT samples with)')
    args = parser.parse_args()
    try:  # DiT's train.py pickles its arguments
        ckpt = load_weights_only(args.src, allowed=(argparse.Namespace,))
    except (FileNotFoundError, CheckpointError) as err:
        raise SystemExit(f'error: {err}') from None
    if isinstance(ckpt, dict) and args.weights in ckpt and isinstance(ckpt[args.weights], dict):
        state = ckpt[args.weights]
    elif isinstance(ckpt, dict) and all(isinstance(v, torch.Tensor) for v in ckpt.values()):
        state = ckpt
    else:
        raise SystemExit(f'{args.src} holds {sorted(ckpt) if isinstance(ckpt, dict) else type(ckpt).__name__}: '
                         f'neither a state dict nor a training checkpoint with {args.weights!r}')
    cfg = Config.fromfile(args.config)
    init_default_scope(cfg.get('default_scope', 'mmengine'))
    denoiser = MODELS.build(cfg.model.denoiser)
    problems = mismatch_lines(state_dict_mismatch(denoiser.state_dict(), state))
    if problems:
        raise SystemExit(f'{args.src} does not match the denoiser of {args.config} ({type(denoiser).__name__}):\n'
                         + '\n'.join(problems)
                         + '\nuse the config of the model it was trained as (arch, patch size, input size)')
    atomic_save(dict(state_dict={f'denoiser.{k}': v for k, v in state.items()},
                     meta=dict(converted_from=args.src, weights=args.weights)), args.dst)
    print(f'{len(state)} tensors of {args.src} ({args.weights}) written to {args.dst}')


if __name__ == '__main__':
    main()
