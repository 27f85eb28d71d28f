"""``benchmark.py workload``: the real workload of detection / segmentation configs, compared in pairs (each config
against the next; default: every Table 4 / 5 WeightFormer config against its DeiT row), side by side in interleaved
rounds: a training step of backbone + neck and of the whole model (loss, backward, optimizer step) at the config's
input size, and test-time inference, with peak memory (on CPU in a fresh interpreter per case); ``--image-sizes``
adds segmentation inference on whole images of those sizes in both test modes (``'whole'`` and the config's
``'slide'``). The speed-up is the median over rounds of (second / first) within a round."""
from __future__ import annotations

import argparse
import logging
import os.path as osp
import statistics

import torch
from mmengine.config import Config

from mmwf.analysis import MODES, Workload
from mmwf.analysis.timing import interleaved_times, last_line_of, step_memory

PAIRS = ['configs/cascade_wf_t_coco.py', 'configs/cascade_deit_t_coco.py', 'configs/upernet_wf_t_ade20k.py',
         'configs/upernet_deit_t_ade20k.py', 'configs/upernet_wf_s_ade20k.py', 'configs/upernet_deit_s_ade20k.py']


def workload_case(config: str, mode: str, size: str | None, test_mode: str | None, device: str,
                  compile: bool = False):
    workload = Workload(config, device, test_mode=test_mode, compile=compile)
    return workload.step(mode, tuple(map(int, size.split('x'))) if size else None)


def workload_memory(config: str, mode: str, size: str | None, test_mode: str | None, args) -> float:
    """:func:`step_memory` of a workload case, on CPU in a fresh interpreter."""
    if args.device.startswith('cuda'):
        return step_memory(workload_case(config, mode, size, test_mode, args.device, args.compile), args.device)
    probe = ['workload', '--workload-probe', config, mode, size or '-', test_mode or '-',
             *(['--compile'] if args.compile else [])]
    return float(last_line_of(args.script, probe, torch.get_num_threads()))


def run_workloads(args) -> list[dict]:
    """Each case of each config pair side by side, interleaved round by round; a markdown table."""
    configs = args.configs
    if len(configs) % 2:
        raise SystemExit('--configs takes pairs: each config is compared with the next one')
    cases = [(mode, None, None) for mode in args.modes]
    cases += [('inference', size, tm) for size in args.image_sizes for tm in ('whole', 'slide')]
    print(f'device {args.device}, torch {torch.__version__}, threads {torch.get_num_threads()}, '
          f'{args.rounds} rounds, median seconds per step; speed-up = second / first, round by round')
    print('| first | second | step | input | first s | second s | speed-up | first MB | second MB |')
    print('|---|---|---|---|---|---|---|---|---|')
    rows = []
    for a, b in zip(configs[::2], configs[1::2]):
        segmentation = Config.fromfile(a).default_scope == 'mmseg'
        for mode, size, test_mode in cases:
            if size and not segmentation:
                continue
            times = interleaved_times([workload_case(c, mode, size, test_mode, args.device, args.compile)
                                       for c in (a, b)], args.rounds, args.device)
            speedup = statistics.median(tb / ta for ta, tb in zip(*times))
            memory = ['-', '-'] if args.no_memory else [
                f'{workload_memory(c, mode, size, test_mode, args):.0f}' for c in (a, b)]
            label = f'{mode} ({test_mode})' if test_mode else mode
            row = dict(first=osp.basename(a), second=osp.basename(b), step=label, input=size or '-',
                       first_s=statistics.median(times[0]), second_s=statistics.median(times[1]), speedup=speedup)
            rows.append(row)
            print(f'| {row["first"]} | {row["second"]} | {label} | {row["input"]} | {row["first_s"]:.2f} | '
                  f'{row["second_s"]:.2f} | {speedup:.2f}x | {memory[0]} | {memory[1]} |', flush=True)
    return rows


def save_workload_plot(rows: list[dict], path: str) -> None:
    """Seconds per step of each pair and case, first config against second."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    labels = [f'{r["first"].removesuffix(".py")}\n{r["step"]} {r["input"]}' for r in rows]
    fig, ax = plt.subplots(figsize=(max(6, len(rows) * 1.2), 4))
    xs = range(len(rows))
    ax.bar([x - 0.2 for x in xs], [r['first_s'] for r in rows], width=0.4, label='first config of each pair')
    ax.bar([x + 0.2 for x in xs], [r['second_s'] for r in rows], width=0.4, label='second config')
    ax.set_xticks(list(xs), labels, rotation=30, ha='right', fontsize=7)
    ax.set(ylabel='seconds per step (log)', yscale='log', title='real workload, side by side')
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def add_arguments(parser) -> None:
    parser.add_argument('--configs', nargs='+', default=PAIRS, help='config pairs (default: Tables 4 / 5)')
    parser.add_argument('--modes', nargs='+', default=list(MODES), choices=MODES, help='steps to time')
    parser.add_argument('--image-sizes', nargs='*', default=[], help='HxW: segmentation inference on whole images '
                        "of these sizes in 'whole' and 'slide' mode")
    parser.add_argument('--rounds', type=int, default=7)
    parser.add_argument('--no-memory', action='store_true', help='skip the memory measurements')
    parser.add_argument('--compile', action='store_true', help='torch.compile the backbones and necks')
    parser.add_argument('--plot', help='write a bar chart PNG here')
    parser.add_argument('--workload-probe', nargs=4, help=argparse.SUPPRESS)


def run(args) -> None:
    from mmengine.logging import MMLogger
    MMLogger.get_current_instance().setLevel(logging.WARNING)  # the models' build logs would interleave the table
    if args.workload_probe:
        config, mode, size, test_mode = (None if v == '-' else v for v in args.workload_probe)
        print(step_memory(workload_case(config, mode, size, test_mode, args.device, args.compile), args.device))
        return
    rows = run_workloads(args)
    if args.plot:
        save_workload_plot(rows, args.plot)
        print(f'saved {args.plot}')

