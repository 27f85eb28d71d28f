"""Training-step and sampling-step time and peak memory of WeightFormer-DiT against DiT, side by side (interleaved
rounds, ratios taken round by round): S/2 and B/2 at 32 x 32 latents (256 px) and 64 x 64 (512 px), where
WeightFormer's linear cost in the tokens should show. A training step is DiT's: the hybrid loss on a batch of
latents, backward, AdamW (``train-cp``: with every block's activations recomputed in the backward pass, the configs'
``with_cp``); a sampling step is one denoiser call and ancestral update of the 250-step sampler. Memory: CUDA's peak
allocation above the start of the step, or on CPU the peak resident set of a fresh process.

    python tools/analysis/generation_benchmark.py --device cuda --batch 32
    python tools/analysis/generation_benchmark.py --archs S/2 --sizes 32 --batch 4 --rounds 3   # CPU
    python tools/analysis/generation_benchmark.py --modes train train-cp     # what activation checkpointing saves
"""
from __future__ import annotations

import argparse
import os.path as osp
import statistics
from collections.abc import Callable

import torch

from mmwf.analysis.timing import interleaved_times, last_line_of, step_memory
from mmwf.registry import MODELS

FAMILIES = {'WF-DiT': 'WeightFormerDiT', 'DiT': 'DiT'}


def make_step(family: str, arch: str, size: int, batch: int, mode: str, device: str) -> Callable[[], None]:
    """One training (``'train'``, ``'train-cp'``) or sampling step of ``family``-``arch`` (e.g. ``'S/2'``) on
    (batch, 4, size, size) latents."""
    name, patch = arch.split('/')
    model = MODELS.build(dict(type='LatentDiffusion', denoiser=dict(
        type=FAMILIES[family], arch=name, patch_size=int(patch), input_size=size,
        with_cp=mode == 'train-cp'))).to(device)
    g = torch.Generator(device).manual_seed(0)
    x = torch.randn(batch, 4, size, size, device=device, generator=g)
    labels = torch.randint(0, 1000, (batch,), device=device, generator=g)
    if mode.startswith('train'):
        model.train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0)

        def step() -> None:
            loss = sum(model(x, labels, mode='loss').values())
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        return step
    model.eval()
    sampler, t = model.sampler, torch.full((batch,), 100, device=device)
    mapped = sampler.timestep_map.to(device)[t]

    @torch.no_grad()
    def step() -> None:
        sampler.p_sample(model.denoiser(x, mapped, labels), x, t, torch.randn_like(x))
    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--archs', nargs='+', default=['S/2', 'B/2'])
    parser.add_argument('--sizes', nargs='+', type=int, default=[32, 64], help='latent sides (x 8 px)')
    parser.add_argument('--modes', nargs='+', default=['train', 'sample'], choices=['train', 'train-cp', 'sample'])
    parser.add_argument('--batch', type=int, default=8)
    parser.add_argument('--rounds', type=int, default=5)
    parser.add_argument('--no-memory', action='store_true')
    parser.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu')
    parser.add_argument('--threads', type=int, default=None)
    parser.add_argument('--memory-probe', nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.memory_probe:
        family, arch, size, batch, mode = args.memory_probe
        print(step_memory(make_step(family, arch, int(size), int(batch), mode, args.device), args.device))
        return

    def memory(family: str, arch: str, size: int, mode: str) -> str:
        if args.no_memory:
            return '-'
        if args.device.startswith('cuda'):
            return f'{step_memory(make_step(family, arch, size, args.batch, mode, args.device), args.device):.0f}'
        probe = ['--memory-probe', family, arch, str(size), str(args.batch), mode]
        return f'{float(last_line_of(osp.abspath(__file__), probe, torch.get_num_threads())):.0f}'

    print(f'device {args.device}, torch {torch.__version__}, threads {torch.get_num_threads()}, batch {args.batch}, '
          f'{args.rounds} rounds, median seconds per step; speed-up = DiT s / WF-DiT s, round by round')
    print('| arch | latent | step | WF-DiT s | DiT s | speed-up | WF-DiT MB | DiT MB |')
    print('|---|---|---|---|---|---|---|---|')
    for arch in args.archs:
        for size in args.sizes:
            for mode in args.modes:
                times = interleaved_times([make_step(f, arch, size, args.batch, mode, args.device) for f in FAMILIES],
                                          args.rounds, args.device)
                speedup = statistics.median(d / w for w, d in zip(*times))
                mem = [memory(f, arch, size, mode) for f in FAMILIES]
                print(f'| {arch} | {size}x{size} | {mode} | {statistics.median(times[0]):.3f} | '
                      f'{statistics.median(times[1]):.3f} | {speedup:.2f}x | {mem[0]} | {mem[1]} |', flush=True)


if __name__ == '__main__':
    main()
