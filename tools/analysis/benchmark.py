"""Inference throughput of WeightFormer, the static baseline CNN and DeiT (timm), measured side by side.

Models run interleaved, round after round, on identical inputs. Throughput is the median over rounds;
a ratio is the median over rounds of (reference time / model time) within the same round, which keeps
the machine's drifts (shared CPUs) out of the comparison. CPU by default (threads = all cores); on CUDA
the device is synchronised around each timed loop.

    python tools/analysis/benchmark.py                       # 224 (batch 16), 512, 1024 (batch 1)
    python tools/analysis/benchmark.py --sizes 224 1248 --models wf-t deit-t
"""
from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn as nn


def build(name: str, size: int) -> nn.Module:
    """Classifier-form models (1000-class head) as in the paper's Table 3."""
    import timm

    from mmwf.models.backbones import WeightFormer

    class Classifier(nn.Module):
        def __init__(self, backbone: WeightFormer) -> None:
            super().__init__()
            self.backbone = backbone

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.backbone.forward_classifier(x)

    makers: dict[str, Callable[[], nn.Module]] = {
        'wf-t': lambda: Classifier(WeightFormer('t', num_classes=1000)),
        'wf-s': lambda: Classifier(WeightFormer('s', num_classes=1000)),
        'static-t': lambda: Classifier(WeightFormer('t', dynamic_blocks=[], num_classes=1000)),
        'deit-t': lambda: timm.create_model('deit_tiny_patch16_224', img_size=size),
        'deit-s': lambda: timm.create_model('deit_small_patch16_224', img_size=size),
    }
    if name not in makers:
        raise SystemExit(f'unknown model {name!r}; choose from {sorted(makers)}')
    return makers[name]().eval()


def time_once(model: nn.Module, x: torch.Tensor, iters: int) -> float:
    """Seconds per image for ``iters`` forward passes."""
    if x.is_cuda:
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(iters):
        model(x)
    if x.is_cuda:
        torch.cuda.synchronize()
    return (time.perf_counter() - start) / (iters * x.shape[0])


def measure(names: list[str], size: int, batch: int, rounds: int, iters: int,
            device: str) -> dict[str, list[float]]:
    """Seconds per image of each model at one resolution, one entry per round (models interleaved)."""
    x = torch.randn(batch, 3, size, size, device=device)
    models = {n: build(n, size).to(device) for n in names}
    per_image: dict[str, list[float]] = {n: [] for n in names}
    with torch.inference_mode():
        for m in models.values():
            m(x)  # warm-up
        for _ in range(rounds):
            for n, m in models.items():
                per_image[n].append(time_once(m, x, iters))
    return per_image


def parse_batches(spec: list[str]) -> dict[int, int]:
    return {int(s.split(':')[0]): int(s.split(':')[1]) for s in spec}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--models', nargs='+', default=['wf-t', 'static-t', 'deit-t'])
    parser.add_argument('--sizes', nargs='+', type=int, default=[224, 512, 1024])
    parser.add_argument('--batch', nargs='+', default=['224:16'],
                        help='SIZE:BATCH pairs; sizes not listed use batch 1')
    parser.add_argument('--rounds', type=int, default=7)
    parser.add_argument('--iters', type=int, default=2, help='forward passes per round')
    parser.add_argument('--reference', default='deit-t', help='model the ratios are taken against')
    parser.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu')
    parser.add_argument('--threads', type=int, default=None, help='torch CPU threads (default: all)')
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    batches = parse_batches(args.batch)
    print(f'device {args.device}, torch {torch.__version__}, threads {torch.get_num_threads()}, '
          f'{args.rounds} rounds x {args.iters} iters, median')
    print('| model | input | batch | img/s | ratio vs ' + args.reference + ' |')
    print('|---|---|---|---|---|')
    for size in args.sizes:
        batch = batches.get(size, 1)
        times = measure(args.models, size, batch, args.rounds, args.iters, args.device)
        ref = times.get(args.reference)
        for name, t in times.items():
            # the ratio is taken round by round (same moment, same machine state), then the median
            ratio = f'{statistics.median(r / s for r, s in zip(ref, t)):.2f}x' if ref else '-'
            print(f'| {name} | {size} | {batch} | {1 / statistics.median(t):.1f} | {ratio} |', flush=True)


if __name__ == '__main__':
    main()
