"""Inference throughput and peak memory of WeightFormer, the static baseline CNN and DeiT (timm) against
resolution, measured side by side: a markdown table and a PNG in the style of the paper's Figure 5.

Models run interleaved, round after round, on identical inputs. Throughput is the median over rounds;
a ratio is the median over rounds of (reference time / model time) within the same round, which keeps
the machine's drifts (shared CPUs) out of the comparison. CPU by default (threads = all cores); on CUDA
the device is synchronised around each timed loop.

Memory of one forward pass: on CUDA, peak ``max_memory_allocated`` and its rise over the weights and input
(activations); on CPU, in a fresh subprocess per model and size, the peak resident set (VmHWM) and its rise
during the forward (activations; the peak is reset before the forward through /proc/self/clear_refs).

    python tools/analysis/benchmark.py                       # 224 (batch 16), 512, 1024 (batch 1)
    python tools/analysis/benchmark.py --sizes 224 512 768 1024 1248 --models wf-t wf-s static-t deit-t deit-s \
        --plot benchmark.png
    python tools/analysis/benchmark.py --models deit-t deit-t-relu deit-t-mhla deit-t-ttt   # linear attention

With ``--configs``, the real workload of detection / segmentation configs, compared in pairs (each config against
the next; default: every Table 4 / 5 WeightFormer config against its DeiT row): a training step of backbone + neck
and of the whole model (loss, backward, optimizer step) at the config's input size, and test-time inference, with
peak memory; ``--image-sizes`` adds segmentation inference on whole images of those sizes in both test modes
(``'whole'`` and the config's ``'slide'``):

    python tools/analysis/benchmark.py --configs --rounds 3 --plot workload.png
    python tools/analysis/benchmark.py --configs configs/upernet_wf_t_ade20k.py configs/upernet_deit_t_ade20k.py \
        --modes inference --image-sizes 512x2048 1024x2048
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import os.path as osp
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

import torch
import torch.nn as nn
from mmengine.config import Config

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))


def build(name: str, size: int) -> nn.Module:
    """Classifier-form models (1000-class head) as in the paper's Table 3: ``deit-t`` / ``deit-s`` are timm's
    (the reference); every other name is one of mmwf's (:func:`mmwf.analysis.inputs.classifier_config`:
    ``wf-t``, ``static-t``, ``deit-t-relu``, ``deit-s-ttt``, ...)."""
    import timm

    from mmwf.analysis.inputs import build_classifier
    if name in ('deit-t', 'deit-s'):
        return timm.create_model(f'deit_{"tiny" if name == "deit-t" else "small"}_patch16_224', img_size=size).eval()
    try:
        return build_classifier(name)
    except ValueError as err:
        raise SystemExit(str(err)) from None


def time_call(call: Callable[[], object], device: str) -> float:
    """Seconds of one ``call()``, the device synchronised before and after."""
    if device.startswith('cuda'):
        torch.cuda.synchronize()
    start = time.perf_counter()
    call()
    if device.startswith('cuda'):
        torch.cuda.synchronize()
    return time.perf_counter() - start


def time_once(model: nn.Module, x: torch.Tensor, iters: int) -> float:
    """Seconds per image for ``iters`` forward passes."""
    return time_call(lambda: [model(x) for _ in range(iters)], str(x.device)) / (iters * x.shape[0])


def measure(names: list[str], size: int, batch: int, rounds: int, iters: int, device: str,
            compile: bool = False) -> dict[str, list[float]]:
    """Seconds per image of each model at one resolution, one entry per round (models interleaved)."""
    x = torch.randn(batch, 3, size, size, device=device)
    models = {n: build(n, size).to(device) for n in names}
    if compile:
        models = {n: torch.compile(m) for n, m in models.items()}
    per_image: dict[str, list[float]] = {n: [] for n in names}
    with torch.inference_mode():
        for m in models.values():
            m(x)  # warm-up
        for _ in range(rounds):
            for n, m in models.items():
                per_image[n].append(time_once(m, x, iters))
    return per_image


def proc_status_mb(field: str) -> float:
    """A memory field of /proc/self/status (VmRSS, VmHWM) in MB."""
    with open('/proc/self/status') as f:
        for line in f:
            if line.startswith(field + ':'):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f'{field} not in /proc/self/status')


def peak_memory(call: Callable[[], object], device: str) -> tuple[float, float]:
    """(peak, base) memory in MB around one ``call()``: CUDA's allocated bytes, or on CPU the resident set
    (VmHWM after resetting it to VmRSS)."""
    if device.startswith('cuda'):
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        call()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() / 2 ** 20, base / 2 ** 20
    base = proc_status_mb('VmRSS')
    with open('/proc/self/clear_refs', 'w') as f:
        f.write('5')  # resets VmHWM to the current RSS
    call()
    return proc_status_mb('VmHWM'), base


def forward_memory(name: str, size: int, batch: int, device: str) -> dict[str, float]:
    """Peak and activation memory (MB) of one forward pass, measured in this process."""
    model = build(name, size).to(device)
    x = torch.randn(batch, 3, size, size, device=device)
    with torch.inference_mode():
        peak, base = peak_memory(lambda: model(x), device)
    return dict(peak=peak, activations=peak - base)


def probe_in_subprocess(probe: list[str], threads: int) -> str:
    """The last output line of this script run as ``probe`` (a hidden probe option) on CPU in a fresh
    interpreter, so that nothing measured before counts."""
    cmd = [sys.executable, osp.abspath(__file__), *probe, '--threads', str(threads), '--device', 'cpu']
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=dict(os.environ))
    if out.returncode:
        raise RuntimeError(f'memory probe {" ".join(probe)} failed:\n{out.stderr[-2000:]}')
    return out.stdout.strip().splitlines()[-1]


def memory_in_subprocess(name: str, size: int, batch: int, threads: int) -> dict[str, float]:
    """CPU memory of one forward in a fresh interpreter."""
    return json.loads(probe_in_subprocess(['--memory-probe', name, str(size), str(batch)], threads))


PAIRS = ['configs/cascade_wf_t_coco.py', 'configs/cascade_deit_t_coco.py', 'configs/upernet_wf_t_ade20k.py',
         'configs/upernet_deit_t_ade20k.py', 'configs/upernet_wf_s_ade20k.py', 'configs/upernet_deit_s_ade20k.py']


def step_memory(step: Callable[[], None], device: str) -> float:
    """Peak memory (MB) above what was allocated before one call of ``step`` (after a warm-up call)."""
    step()
    peak, base = peak_memory(step, device)
    return peak - base


def workload_case(config: str, mode: str, size: str | None, test_mode: str | None, device: str,
                  compile: bool = False):
    from mmwf.analysis import Workload
    workload = Workload(osp.join(ROOT, config), device, test_mode=test_mode, compile=compile)
    return workload.step(mode, tuple(map(int, size.split('x'))) if size else None)


def workload_memory(config: str, mode: str, size: str | None, test_mode: str | None, args) -> float:
    """:func:`step_memory` of a workload case, on CPU in a fresh interpreter."""
    if args.device.startswith('cuda'):
        return step_memory(workload_case(config, mode, size, test_mode, args.device, args.compile), args.device)
    probe = ['--workload-probe', config, mode, size or '-', test_mode or '-'] + (['--compile'] if args.compile else [])
    return float(probe_in_subprocess(probe, torch.get_num_threads()))


def run_workloads(args) -> list[dict]:
    """Each case of each config pair side by side, interleaved round by round; a markdown table."""
    configs = args.configs or PAIRS
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
        segmentation = Config.fromfile(osp.join(ROOT, a)).default_scope == 'mmseg'
        for mode, size, test_mode in cases:
            if size and not segmentation:
                continue
            steps = [workload_case(c, mode, size, test_mode, args.device, args.compile) for c in (a, b)]
            for step in steps:
                step()  # warm-up
            times = [[], []]
            for _ in range(args.rounds):
                for i, step in enumerate(steps):
                    times[i].append(time_call(step, args.device))
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
    parser.add_argument('--no-memory', action='store_true', help='skip the memory measurements')
    parser.add_argument('--plot', help='write the Figure-5-style PNG here')
    parser.add_argument('--configs', nargs='*', help='benchmark the workload of config pairs (none: Tables 4 / 5)')
    parser.add_argument('--modes', nargs='+', default=['train backbone+neck', 'train whole', 'inference'],
                        help='workload steps with --configs')
    parser.add_argument('--image-sizes', nargs='*', default=[], help='HxW: segmentation inference on whole images '
                        "of these sizes in 'whole' and 'slide' mode (with --configs)")
    parser.add_argument('--compile', action='store_true', help='torch.compile every model (with --configs: the '
                        'backbones and necks)')
    parser.add_argument('--memory-probe', nargs=3, metavar=('MODEL', 'SIZE', 'BATCH'), help=argparse.SUPPRESS)
    parser.add_argument('--workload-probe', nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.workload_probe or args.configs is not None:
        from mmengine.logging import MMLogger
        MMLogger.get_current_instance().setLevel(logging.WARNING)  # the models' build logs would interleave the table
    if args.workload_probe:
        config, mode, size, test_mode = (None if v == '-' else v for v in args.workload_probe)
        print(step_memory(workload_case(config, mode, size, test_mode, args.device, args.compile), args.device))
        return
    if args.configs is not None:
        rows = run_workloads(args)
        if args.plot:
            save_workload_plot(rows, args.plot)
            print(f'saved {args.plot}')
        return
    if args.memory_probe:
        name, size, batch = args.memory_probe
        print(json.dumps(forward_memory(name, int(size), int(batch), args.device)))
        return
    batches = parse_batches(args.batch)
    print(f'device {args.device}, torch {torch.__version__}, threads {torch.get_num_threads()}, '
          f'{args.rounds} rounds x {args.iters} iters, median')
    print(f'| model | input | batch | img/s | ratio vs {args.reference} | peak MB | activations MB |')
    print('|---|---|---|---|---|---|---|')
    rows = []
    for size in args.sizes:
        batch = batches.get(size, 1)
        times = measure(args.models, size, batch, args.rounds, args.iters, args.device, args.compile)
        ref = times.get(args.reference)
        for name, t in times.items():
            # the ratio is taken round by round (same moment, same machine state), then the median
            ratio = f'{statistics.median(r / s for r, s in zip(ref, t)):.2f}x' if ref else '-'
            row = dict(model=name, size=size, batch=batch, img_s=1 / statistics.median(t))
            memory = '- | -'
            if not args.no_memory:
                row.update(forward_memory(name, size, batch, args.device) if args.device.startswith('cuda')
                           else memory_in_subprocess(name, size, batch, torch.get_num_threads()))
                memory = f'{row["peak"]:.0f} | {row["activations"]:.0f}'
            rows.append(row)
            print(f'| {name} | {size} | {batch} | {row["img_s"]:.1f} | {ratio} | {memory} |', flush=True)
    if args.plot:
        save_plot(rows, args.plot, args.device)
        print(f'saved {args.plot}')


if __name__ == '__main__':
    main()
