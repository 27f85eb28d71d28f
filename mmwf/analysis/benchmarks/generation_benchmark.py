"""``benchmark.py generation``: training-step and sampling-step time and peak memory of WeightFormer-DiT against DiT,
side by side (interleaved rounds, ratios taken round by round): S/2 and B/2 at 32 x 32 latents (256 px) and 64 x 64
(512 px), where WeightFormer's linear cost in the tokens should show. A training step is DiT's: the hybrid loss on a
batch of latents, backward, AdamW (``train-cp``: with every block's activations recomputed in the backward pass, the
configs' ``with_cp``); a sampling step is one denoiser call and ancestral update of the 250-step sampler. Memory:
CUDA's peak allocation above the start of the step, or on CPU the peak resident set of a fresh process.

The references' own networks join the comparison from files the user gives (nothing of theirs is copied here):
``--dit-models`` facebookresearch/DiT's ``models.py`` and ``--release-dit`` the WeightFormer release's
``model/wfm_dit.py``; each runs as the denoiser of the same loss and sampler (their ``DiT_models[...]``
constructors, the same forward(x, t, y)).

"""
from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable

import torch
import torch.nn as nn

from mmwf.analysis.timing import (
    interleaved_times,
    last_line_of,
    module_from_file,
    step_memory,
    step_profile,
    training_step,
)
from mmwf.registry import MODELS

FAMILIES = {'WF-DiT': 'WeightFormerDiT', 'DiT': 'DiT'}
REFERENCES = {'DiT (facebookresearch)': 'dit_models', 'WF-DiT (release)': 'release_dit'}


def reference_denoiser(path: str, arch: str, size: int) -> nn.Module:
    """``DiT_models['DiT-<arch>'](input_size=size)`` of the reference file at ``path``, with the attributes our
    diffusion reads."""
    module = module_from_file(path, "facebookresearch/DiT's models.py or the release's model/wfm_dit.py")
    net = module.DiT_models[f'DiT-{arch}'](input_size=size, num_classes=1000)
    net.num_classes = 1000
    return net


AMP_DTYPES = {'bf16': torch.bfloat16, 'fp16': torch.float16}


def precision(amp: str | None) -> str:
    return f'{amp} autocast' if amp else 'fp32'


def make_step(family: str, arch: str, size: int, batch: int, mode: str, device: str,
              reference: str | None = None, amp: str | None = None) -> Callable[[], None]:
    """One training (``'train'``, ``'train-cp'``) or sampling step of ``family``-``arch`` (e.g. ``'S/2'``) on
    (batch, 4, size, size) latents; ``reference``: the file of a reference family's network; ``amp``: ``'bf16'`` or
    ``'fp16'`` autocast (as the configs' ``*_bf16`` / ``*_fp16`` AmpOptimWrapper; fp16 with a dynamic loss scale),
    else fp32."""
    name, patch = arch.split('/')
    model = MODELS.build(dict(type='LatentDiffusion', denoiser=dict(
        type=FAMILIES.get(family, 'DiT'), arch=name, patch_size=int(patch), input_size=size,
        with_cp=mode == 'train-cp')))
    if reference is not None:
        if mode == 'train-cp':
            raise ValueError(f'{family} has no activation checkpointing: use --modes train sample')
        model.denoiser = reference_denoiser(reference, arch, size)
    model = model.to(device)
    g = torch.Generator(device).manual_seed(0)
    x = torch.randn(batch, 4, size, size, device=device, generator=g)
    labels = torch.randint(0, 1000, (batch,), device=device, generator=g)

    if mode.startswith('train'):
        model.train()
        return training_step(model.parameters(), lambda: sum(model(x, labels, mode='loss').values()), device,
                             AMP_DTYPES.get(amp), weight_decay=0)  # DiT's AdamW: lr 1e-4, no weight decay
    model.eval()
    sampler, t = model.sampler, torch.full((batch,), 100, device=device)
    mapped = sampler.timestep_map.to(device)[t]

    @torch.no_grad()
    def step() -> None:
        with torch.autocast(device.split(':')[0], dtype=AMP_DTYPES.get(amp, torch.float32), enabled=amp is not None):
            out = model.denoiser(x, mapped, labels)
        sampler.p_sample(out.float(), x, t, torch.randn_like(x))
    return step


def add_arguments(parser) -> None:
    parser.add_argument('--archs', nargs='+', default=['S/2', 'B/2'])
    parser.add_argument('--sizes', nargs='+', type=int, default=[32, 64], help='latent sides (x 8 px)')
    parser.add_argument('--modes', nargs='+', default=['train', 'sample'], choices=['train', 'train-cp', 'sample'])
    parser.add_argument('--batch', type=int, default=8)
    parser.add_argument('--rounds', type=int, default=5)
    parser.add_argument('--dit-models', help="facebookresearch/DiT's models.py, compared as 'DiT (facebookresearch)'")
    parser.add_argument('--release-dit', help="the WeightFormer release's model/wfm_dit.py, as 'WF-DiT (release)'")
    parser.add_argument('--amp', choices=sorted(AMP_DTYPES), help='mixed precision (autocast; fp16 with a dynamic '
                        'loss scale), as the configs\' *_bf16 / *_fp16 rows. Defaults to fp32')
    parser.add_argument('--no-memory', action='store_true')
    parser.add_argument('--profile', action='store_true',
                        help="instead of the comparison: each family's step by phase and operator group (CPU)")
    parser.add_argument('--memory-probe', nargs=6, help=argparse.SUPPRESS)


def run(args) -> None:
    files = {name: getattr(args, dest) for name, dest in REFERENCES.items() if getattr(args, dest)}
    if args.memory_probe:
        family, arch, size, batch, mode, reference = args.memory_probe
        step = make_step(family, arch, int(size), int(batch), mode, args.device, reference or None, args.amp)
        print(step_memory(step, args.device))
        return
    families = [*FAMILIES, *files]
    if args.profile:
        print_profiles(families, files, args)
        return

    def memory(family: str, arch: str, size: int, mode: str) -> str:
        if args.no_memory:
            return '-'
        if args.device.startswith('cuda'):
            step = make_step(family, arch, size, args.batch, mode, args.device, files.get(family), args.amp)
            return f'{step_memory(step, args.device):.0f}'
        probe = ['generation', '--memory-probe', family, arch, str(size), str(args.batch), mode, files.get(family, ''),
                 *(['--amp', args.amp] if args.amp else [])]
        return f'{float(last_line_of(args.script, probe, torch.get_num_threads())):.0f}'

    print(f'device {args.device}, torch {torch.__version__}, threads {torch.get_num_threads()}, batch {args.batch}, '
          f'{precision(args.amp)}, {args.rounds} rounds, median seconds per step; speed-up = the DiT\'s s / WF-DiT s, '
          'round by round')
    others = families[1:]
    print('| arch | latent | step | ' + ' | '.join(f'{f} s' for f in families) + ' | '
          + ' | '.join(f'vs {f}' for f in others) + ' | ' + ' | '.join(f'{f} MB' for f in families) + ' |')
    print('|---' * (3 + 2 * len(families) + len(others)) + '|')
    for arch in args.archs:
        for size in args.sizes:
            for mode in args.modes:
                steps = [make_step(f, arch, size, args.batch, mode, args.device, files.get(f), args.amp)
                         for f in families]
                times = interleaved_times(steps, args.rounds, args.device)
                del steps
                ratios = [statistics.median(o / w for w, o in zip(times[0], times[i])) for i in range(1, len(times))]
                mem = [memory(f, arch, size, mode) for f in families]
                print(f'| {arch} | {size}x{size} | {mode} | ' + ' | '.join(f'{statistics.median(t):.3f}' for t in times)
                      + ' | ' + ' | '.join(f'{r:.2f}x' for r in ratios) + ' | ' + ' | '.join(mem) + ' |', flush=True)


def print_profiles(families: list[str], files: dict[str, str], args: argparse.Namespace) -> None:
    """Per arch, size and mode: milliseconds of one step (the median of ``--rounds`` profiled steps after a warm-up)
    by phase and operator group, each family side by side."""
    phases = ('forward', 'backward', 'optimizer')
    clock = 'kernel time on the GPU' if args.device.startswith('cuda') else 'CPU time'
    print(f'device {args.device}, torch {torch.__version__}, threads {torch.get_num_threads()}, batch {args.batch}, '
          f'{precision(args.amp)}; ms of one step by phase and operator group (the aten operators\' own {clock}), '
          f'median of {args.rounds} steps')
    for arch in args.archs:
        for size in args.sizes:
            for mode in args.modes:
                medians = {}
                for family in families:
                    step = make_step(family, arch, size, args.batch, mode, args.device, files.get(family), args.amp)
                    step()
                    runs = [step_profile(step, args.device) for _ in range(args.rounds)]
                    medians[family] = {k: statistics.median(r.get(k, 0.0) for r in runs)
                                       for k in set().union(*runs)}
                groups = sorted({g for m in medians.values() for p, g in m if p != 'all'})
                shown = phases if mode.startswith('train') else phases[:1]
                print(f'\n{arch}, {size}x{size} latents, {mode}')
                print('| group | ' + ' | '.join(f'{f} {p}' for f in families for p in shown) + ' |')
                print('|---' * (1 + len(families) * len(shown)) + '|')
                for group in groups:
                    cells = [f'{medians[f].get((p, group), 0.0):.0f}' for f in families for p in shown]
                    print(f'| {group} | ' + ' | '.join(cells) + ' |')
                walls = [f'{medians[f][("all", "step")]:.0f}' if p == shown[0] else '' for f in families for p in shown]
                print('| step (wall) | ' + ' | '.join(walls) + ' |')

