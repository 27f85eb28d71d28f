"""``benchmark.py onnx``: ONNX Runtime against eager PyTorch: each classifier exported twice (a static graph, and one
with a dynamic batch and image size), the three run interleaved with the other models, round after round, in one
table.

A time is the median over rounds of one timed sample (``--repeat`` forward passes at batch ``--batch``); a ratio is
the median over rounds of the per-round ratio, so the machine's drifts (shared CPUs, clocks) fall on both sides.
Every graph is checked against PyTorch first (largest difference printed). The models are mmwf's
(``weightformer_t``, ``deit_t_softmax``, ...: :func:`mmwf.analysis.classifier_config`), random weights. ONNX
Runtime's times include handing it the input from host memory (on CUDA, a copy to the GPU).
"""
from __future__ import annotations

import os.path as osp
import statistics
import tempfile

import numpy as np
import torch

from mmwf.analysis import build_classifier
from mmwf.analysis.timing import interleaved_times
from mmwf.deployment import export_facts, export_onnx


def session(path: str, device: str):
    """An ONNX Runtime session on the CPU or CUDA execution provider (default options: every graph optimisation)."""
    import onnxruntime as ort
    providers = ['CUDAExecutionProvider'] if device == 'cuda' else ['CPUExecutionProvider']
    if providers[0] not in ort.get_available_providers():
        raise SystemExit(f'error: ONNX Runtime here has no {providers[0]} (install onnxruntime-gpu for --device cuda)')
    return ort.InferenceSession(path, providers=providers)


def add_arguments(parser) -> None:
    parser.add_argument('--models', nargs='+', default=['weightformer_t', 'deit_t_softmax'])
    parser.add_argument('--sizes', type=int, nargs='+', default=[224, 1024])
    parser.add_argument('--batch', type=int, default=1)
    parser.add_argument('--rounds', type=int, default=10)
    parser.add_argument('--repeat', type=int, default=1, help='forward passes per timed sample')
    parser.add_argument('--fp16', action='store_true', help='half-precision weights and inputs (CUDA)')
    parser.add_argument('--work-dir', help='keep the ONNX files here (default: a temporary folder, removed)')


def run(args) -> None:
    if args.fp16 and args.device != 'cuda':
        raise SystemExit('error: --fp16 needs --device cuda (CPU kernels of ONNX Runtime are fp32)')
    if args.work_dir:
        return measure(args, args.work_dir)
    with tempfile.TemporaryDirectory(prefix='onnx_benchmark_') as work_dir:  # removed with its files afterwards
        measure(args, work_dir)


def measure(args, work_dir: str) -> None:
    """Export, check and time every model at every size, the ONNX files in ``work_dir``; print the table."""
    dtype = torch.float16 if args.fp16 else torch.float32
    rows = []
    for size in args.sizes:
        x = torch.randn(args.batch, 3, size, size)
        steps, labels = [], []
        for name in args.models:
            model = build_classifier(name).to(args.device, dtype)
            facts = export_facts(model, 'classifier')
            xd = x.to(args.device, dtype)
            with torch.inference_mode():
                reference = model(xd).float().cpu().numpy()
            for dynamic in (False, True):
                path = osp.join(work_dir, f'{name}_{size}_{"dynamic" if dynamic else "static"}.onnx')
                export_onnx(model, (size, size), path, facts, dynamic)
                sess = session(path, args.device)
                feed = {sess.get_inputs()[0].name: xd.cpu().numpy()}
                diff = float(np.abs(sess.run(None, feed)[0].astype(np.float32) - reference).max())
                print(f'{path}: largest |ONNX Runtime - PyTorch| = {diff:.1e}', flush=True)
                steps.append(lambda s=sess, f=feed: [s.run(None, f) for _ in range(args.repeat)])
                labels.append((name, 'static' if not dynamic else 'dynamic'))

            def eager(m=model, t=xd):
                with torch.inference_mode():
                    for _ in range(args.repeat):
                        m(t)
            steps.append(eager)
            labels.append((name, 'eager'))
        times = dict(zip(labels, interleaved_times(steps, args.rounds, args.device)))
        for name in args.models:
            ms = {k: statistics.median(times[name, k]) * 1e3 / args.repeat for k in ('static', 'dynamic', 'eager')}
            ratio = {k: statistics.median(e / o for e, o in zip(times[name, 'eager'], times[name, k]))
                     for k in ('static', 'dynamic')}
            rows.append(f'| {name} | {size} | {ms["static"]:.1f} | {ms["dynamic"]:.1f} | {ms["eager"]:.1f} | '
                        f'{ratio["static"]:.2f}x | {ratio["dynamic"]:.2f}x |')
        if len(args.models) > 1:
            first, *others = args.models
            for other in others:
                r = statistics.median(o / f for o, f in zip(times[other, 'static'], times[first, 'static']))
                rows.append(f'| {first} vs {other} (ONNX Runtime, static) | {size} | | | | {r:.2f}x | |')
    precision = 'fp16' if args.fp16 else 'fp32'
    print(f'\nbatch {args.batch}, {args.device}, {precision}, {torch.get_num_threads()} threads, median of '
          f'{args.rounds} rounds x {args.repeat} passes')
    print('| model | size | ONNX Runtime static ms | ONNX Runtime dynamic ms | eager ms | static vs eager | '
          'dynamic vs eager |')
    print('|---|---|---|---|---|---|---|')
    print('\n'.join(rows))

