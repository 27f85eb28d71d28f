"""``benchmark.py kernels``: each operation of a dynamic block (the per-sample depthwise conv, the adaptive pooling,
the Bilateral linear's update) timed in every evaluation mmwf has for it, inference and training, beside the one
the layers' rule picks on that device and the operation's memory time (:mod:`mmwf.analysis.kernels`)."""
from __future__ import annotations

import statistics

import torch

from mmwf.analysis.timing import interleaved_times

from .inference_benchmark import parse_batches


def bench_kernels(names: list[str], sizes: list[int], batches: dict[int, int], rounds: int, device: str) -> None:
    """Two markdown tables: per model, size and mode, each operation's evaluations (median ms of ``rounds``
    interleaved rounds), the rule's pick, the fastest, and the rule's time over the fastest; then the kernel table's
    entries these timings propose for this device (:func:`~mmwf.analysis.kernels.proposed_entries`), beside what the
    table says today. A proposal: the table changes only by hand, after a look at both."""
    from mmwf.analysis.kernels import MODES, copy_bandwidth, kernel_cases, proposed_entries
    from mmwf.models.layers.implementation import KERNELS
    archs = {name: name.removeprefix('weightformer_') for name in names}
    if any(arch not in ('t', 's', 'b') for arch in archs.values()):
        raise SystemExit('kernels times WeightFormer\'s dynamic layers: give weightformer_t, weightformer_s or '
                         f'weightformer_b, not {" ".join(n for n, a in archs.items() if a not in ("t", "s", "b"))}')
    bandwidth = copy_bandwidth(device)
    print(f'device {device}, torch {torch.__version__}, threads {torch.get_num_threads()}, {rounds} rounds, '
          'median ms; the rule: the kernel table and the cost rule on this device; memory time: the bytes each '
          f'operation must move over the copy bandwidth measured here, {bandwidth / 1e9:.0f} GB/s')
    print('| model | input | batch | mode | operation | ms by evaluation | rule picks | fastest | rule / fastest '
          '| memory time ms | fastest / memory time |')
    print('|---|---|---|---|---|---|---|---|---|---|---|')
    wins: dict[tuple[str, str], list[str]] = {}
    for name, arch in archs.items():
        for size in sizes:
            batch = batches.get(size, 1)
            for mode in MODES:
                for case in kernel_cases(arch, size, batch, device, mode):
                    times = interleaved_times(list(case.evaluations.values()), rounds, device)
                    ms = {n: statistics.median(t) * 1e3 for n, t in zip(case.evaluations, times)}
                    fastest = min(ms, key=ms.get)
                    wins.setdefault((case.entry, mode), []).append(fastest)
                    cells = ', '.join(f'{n} {t:.3f}' for n, t in ms.items())
                    memory_ms = case.bytes / bandwidth * 1e3
                    print(f'| {name} | {size} | {batch} | {mode} | {case.operation} | {cells} | {case.rule} | '
                          f'{fastest} | {ms[case.rule] / ms[fastest]:.2f}x | {memory_ms:.4f} | '
                          f'{ms[fastest] / memory_ms:.1f}x |', flush=True)
    device_type = torch.device(device).type
    print(f'\nKERNELS entries this {device_type} device would choose for the eager implementation (a proposal)')
    print('| entry | proposed | cases won | the table today |')
    print('|---|---|---|---|')
    table = KERNELS['eager']
    for key, (best, won, timed) in proposed_entries(wins, device_type).items():
        operation = key.split(f'_{device_type}')[0]
        today = table.get(key, table.get(key.removesuffix('_autograd'), table.get(operation, '-')))
        print(f'| {key} | {best} | {won} of {timed} | {today} |')


def add_arguments(parser) -> None:
    parser.add_argument('--models', nargs='+', default=['weightformer_t'],
                        help='weightformer_t, weightformer_s or weightformer_b')
    parser.add_argument('--sizes', nargs='+', type=int, default=[224, 1024])
    parser.add_argument('--batch', nargs='+', default=['224:16'],
                        help='SIZE:BATCH pairs; sizes not listed use batch 1')
    parser.add_argument('--rounds', type=int, default=5)


def run(args) -> None:
    bench_kernels(args.models, args.sizes, parse_batches(args.batch), args.rounds, args.device)
