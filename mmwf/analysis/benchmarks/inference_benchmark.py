"""``benchmark.py inference``: inference throughput and peak memory of WeightFormer, the static baseline CNN and DeiT
(timm) against resolution, measured side by side: a markdown table and a PNG in the style of the paper's Figure 5.

Models run interleaved, round after round, on identical inputs, under one protocol (:mod:`mmwf.analysis.protocol`:
dtype, TF32, cuDNN's autotuner, compile mode; a compiled model's first call, where it compiles, is reported apart).
Throughput is the median over rounds; a ratio is the median over rounds of (reference time / model time) within the
same round, which keeps the machine's drifts (shared CPUs) out of the comparison. Beside each ratio its FLOP ceiling
(the reference's multiply-adds over the model's, counted by mmengine at batch 1: the ratio if both ran at the same
rate) and, on CUDA, the share of the timed loop the GPU spent in kernels. CPU by default (threads = all cores); on
CUDA the device is synchronised around each timed loop.

Memory of one forward pass: on CUDA, peak ``max_memory_allocated`` and its rise over the weights and input
(activations); on CPU, in a fresh subprocess per model and size, the peak resident set (VmHWM) and its rise during
the forward (activations; the peak is reset before the forward through /proc/self/clear_refs).
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch
import torch.nn as nn

from mmwf.analysis import build_classifier, count_flops
from mmwf.analysis.protocol import EAGER_FP32, Protocol, add_protocol_arguments, provenance
from mmwf.analysis.timing import device_busy_share, last_line_of, peak_memory, time_call


def build(name: str, size: int) -> nn.Module:
    """Classifiers (1000-class head) as in the paper's Table 3: mmwf's by name (:func:`mmwf.analysis.classifier_config`:
    ``weightformer_t``, ``weightformer_t_static``, ``deit_t_relu``, ...), or one of timm's own ViTs at ``size``
    (the reference: DeiT-T is ``deit_tiny_patch16_224``)."""
    import timm
    try:
        return build_classifier(name)
    except ValueError as err:
        if name not in timm.list_models():
            raise SystemExit(f'{err}, or one of timm\'s ViTs (deit_tiny_patch16_224, ...)') from None
    return timm.create_model(name, img_size=size).eval()


def time_once(model, x: torch.Tensor, iters: int) -> float:
    """Seconds per image for ``iters`` forward passes."""
    return time_call(lambda: [model(x) for _ in range(iters)], str(x.device)) / (iters * x.shape[0])


class Measured:
    """One size's measurements: seconds per image by model, one entry per round (``per_image``), the first call's
    seconds less a steady call's (``compile``: compiling, for a compiled model) and the GPU's busy share
    (``busy``: None off CUDA)."""

    def __init__(self, per_image: dict[str, list[float]], compile: dict[str, float], busy: dict[str, float | None]):
        self.per_image, self.compile, self.busy = per_image, compile, busy


def measure(names: list[str], size: int, batch: int, rounds: int, iters: int, device: str,
            protocol: Protocol = EAGER_FP32) -> Measured:
    """Each model at one resolution under ``protocol``, interleaved round after round."""
    x = torch.randn(batch, 3, size, size, device=device)
    models = {n: protocol.prepare(build(n, size).to(device)) for n in names}
    per_image: dict[str, list[float]] = {n: [] for n in names}
    with protocol.backends(), protocol.autocast(device), torch.inference_mode():
        first = {n: time_call(lambda m=m: m(x), device)  # compiles, if compiled
                  for n, m in models.items()}
        steady = {n: time_call(lambda m=m: m(x), device) for n, m in models.items()}
        for _ in range(rounds):
            for n, m in models.items():
                per_image[n].append(time_once(m, x, iters))
        busy = {n: device_busy_share(lambda m=m: [m(x) for _ in range(iters)], device) for n, m in models.items()}
    return Measured(per_image, {n: max(first[n] - steady[n], 0.0) for n in names}, busy)


def flops(name: str, size: int) -> int:
    """Multiply-adds of one forward of ``name`` at ``size`` (batch 1, on the CPU, as mmengine counts them)."""
    with torch.no_grad():
        return count_flops(build(name, size), torch.randn(1, 3, size, size))


def forward_memory(name: str, size: int, batch: int, device: str) -> dict[str, float]:
    """Peak and activation memory (MB) of one forward pass, measured in this process."""
    model = build(name, size).to(device)
    x = torch.randn(batch, 3, size, size, device=device)
    with torch.inference_mode():
        peak, base = peak_memory(lambda: model(x), device)
    return dict(peak=peak, activations=peak - base)


def memory_in_subprocess(script: str, name: str, size: int, batch: int, threads: int) -> dict[str, float]:
    """CPU memory of one forward in a fresh interpreter (``script``: the benchmark tool, run with its hidden probe)."""
    return json.loads(last_line_of(script, ['inference', '--memory-probe', name, str(size), str(batch)], threads))


def save_plot(rows: list[dict], path: str, device: str) -> None:
    """Throughput and activation memory against resolution, one line per model (Figure 5's layout)."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for name in dict.fromkeys(r['model'] for r in rows):
        mine = [r for r in rows if r['model'] == name]
        sizes = [r['size'] for r in mine]
        axes[0].plot(sizes, [r['img_s'] for r in mine], marker='o', label=name)
        if 'activations' in mine[0]:
            axes[1].plot(sizes, [max(r['activations'], 1e-3) for r in mine], marker='o', label=name)
    axes[0].set(xlabel='input resolution', ylabel='throughput (img/s, log)', yscale='log',
                title=f'inference throughput ({device})')
    axes[1].set(xlabel='input resolution', ylabel='memory (MB, log)', yscale='log',
                title='activation memory of one forward (batch as in the table)')
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def parse_batches(spec: list[str]) -> dict[int, int]:
    return {int(s.split(':')[0]): int(s.split(':')[1]) for s in spec}


def add_arguments(parser) -> None:
    parser.add_argument('--models', nargs='+',
                        default=['weightformer_t', 'weightformer_t_static', 'deit_tiny_patch16_224'])
    parser.add_argument('--sizes', nargs='+', type=int, default=[224, 512, 1024])
    parser.add_argument('--batch', nargs='+', default=['224:16'],
                        help='SIZE:BATCH pairs; sizes not listed use batch 1')
    parser.add_argument('--rounds', type=int, default=7)
    parser.add_argument('--iters', type=int, default=2, help='forward passes per round')
    parser.add_argument('--reference', default='deit_tiny_patch16_224', help='model the ratios are taken against')
    parser.add_argument('--no-memory', action='store_true', help='skip the memory measurements')
    parser.add_argument('--plot', help='write the Figure-5-style PNG here')
    add_protocol_arguments(parser)
    parser.add_argument('--memory-probe', nargs=3, metavar=('MODEL', 'SIZE', 'BATCH'), help=argparse.SUPPRESS)


def run(args) -> None:
    if args.memory_probe:
        name, size, batch = args.memory_probe
        print(json.dumps(forward_memory(name, int(size), int(batch), args.device)))
        return
    batches = parse_batches(args.batch)
    protocol = Protocol.from_args(args)
    print(provenance(args.device))
    print(f'device {args.device}, threads {torch.get_num_threads()}, {protocol.describe()}, {args.rounds} rounds x '
          f'{args.iters} iters, median; FLOP ceiling: {args.reference}\'s multiply-adds over the model\'s')
    print(f'| model | input | batch | img/s | ratio vs {args.reference} | FLOP ceiling | GPU busy | compile s | '
          'peak MB | activations MB |')
    print('|---|---|---|---|---|---|---|---|---|---|')
    rows = []
    for size in args.sizes:
        batch = batches.get(size, 1)
        measured = measure(args.models, size, batch, args.rounds, args.iters, args.device, protocol)
        times = measured.per_image
        ref = times.get(args.reference)
        counts = {name: flops(name, size) for name in args.models} if ref else {}
        for name, t in times.items():
            # the ratio is taken round by round (same moment, same machine state), then the median
            ratio = f'{statistics.median(r / s for r, s in zip(ref, t)):.2f}x' if ref else '-'
            ceiling = f'{counts[args.reference] / counts[name]:.2f}x' if ref else '-'
            busy = measured.busy[name]
            row = dict(model=name, size=size, batch=batch, img_s=1 / statistics.median(t))
            memory = '- | -'
            if not args.no_memory:
                row.update(forward_memory(name, size, batch, args.device) if args.device.startswith('cuda')
                           else memory_in_subprocess(args.script, name, size, batch, torch.get_num_threads()))
                memory = f'{row["peak"]:.0f} | {row["activations"]:.0f}'
            rows.append(row)
            compile_s = f'{measured.compile[name]:.1f}' if protocol.compile != 'none' else '-'
            print(f'| {name} | {size} | {batch} | {row["img_s"]:.1f} | {ratio} | {ceiling} | '
                  f'{"-" if busy is None else f"{busy:.0%}"} | {compile_s} | {memory} |', flush=True)
    if args.plot:
        save_plot(rows, args.plot, args.device)
        print(f'saved {args.plot}')
