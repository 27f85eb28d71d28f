"""Export a model of an mmwf config to ONNX (PyTorch's dynamo exporter) and check it with ONNX Runtime.

    python tools/deployment/pytorch2onnx.py configs/imagenet/weightformer_t_in1k.py CKPT --out wf_t.onnx \
        --shape 224 224 --dynamic
    python tools/deployment/pytorch2onnx.py configs/cascade_wf_t_coco.py --out wf_t_fpn.onnx --shape 1024 1024 --dynamic
    python tools/deployment/pytorch2onnx.py configs/upernet_wf_t_ade20k.py --out upernet.onnx --shape 512 512 --dynamic

The graph takes the normalised image batch (B, 3, H, W) and returns what ``forward(x, mode='tensor')`` returns: a
classifier's logits, a detector's backbone + neck level maps, a segmentor's segmentation logits. ``--dynamic``
makes the batch and, except for UperNet (mmseg's pyramid pooling module pools to fixed bins: only the batch), the
image size dynamic (multiples of the model's stride). The tool runs ONNX Runtime against PyTorch at the export size
and at a second size (a second batch size for UperNet), prints the largest difference and fails above --atol.
"""
from __future__ import annotations

import argparse
import statistics

import torch

from mmwf.analysis.timing import interleaved_times
from mmwf.deployment import check_onnx, export_onnx, exportable_model


def latency(path: str, module: torch.nn.Module, shape: tuple[int, ...], rounds: int) -> tuple[float, float]:
    """Median seconds per forward of ONNX Runtime and of eager PyTorch on the same input (interleaved rounds)."""
    import onnxruntime as ort
    session = ort.InferenceSession(path, providers=['CPUExecutionProvider'])
    x = torch.randn(*shape)
    feed = {session.get_inputs()[0].name: x.numpy()}

    def run_torch() -> None:
        with torch.no_grad():
            module(x)
    ort_times, torch_times = interleaved_times([lambda: session.run(None, feed), run_torch], rounds, 'cpu')
    return statistics.median(ort_times), statistics.median(torch_times)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('config')
    parser.add_argument('checkpoint', nargs='?', help='weights (default: random, to try the export)')
    parser.add_argument('--out', required=True, help='ONNX file to write')
    parser.add_argument('--shape', type=int, nargs=2, required=True, metavar=('H', 'W'), help='export input size')
    parser.add_argument('--dynamic', action='store_true', help='dynamic batch (and image size where possible)')
    parser.add_argument('--atol', type=float, default=1e-4, help='largest ONNX Runtime - PyTorch difference allowed')
    parser.add_argument('--latency', type=int, metavar='ROUNDS', help='also time ONNX Runtime against eager PyTorch '
                        '(batch 1 at the export size, interleaved rounds, CPU)')
    args = parser.parse_args(argv)
    module, facts = exportable_model(args.config, args.checkpoint)
    shape = tuple(args.shape)
    if any(s % facts['stride'] or s < facts['min_size'] for s in shape):
        raise SystemExit(f'error: --shape {shape[0]} {shape[1]}: this model takes sides that are multiples of '
                         f'{facts["stride"]}, at least {facts["min_size"]}')
    if facts['kind'] == 'segmentor':
        facts = dict(facts, fixed_size=True)
    export_onnx(module, shape, args.out, facts, args.dynamic)
    second = shape if facts.get('fixed_size') or not args.dynamic else (shape[0] + 2 * facts['stride'], shape[1])
    shapes = [(1, 3, *shape), (3 if args.dynamic else 1, 3, *second)]
    diffs = check_onnx(args.out, module, shapes)
    for s, d in zip(shapes, diffs):
        print(f'{args.out}: input {s}: largest |ONNX Runtime - PyTorch| = {d:.2e}')
    if max(diffs) > args.atol:
        raise SystemExit(f'error: the exported graph differs from PyTorch by {max(diffs):.2e} > {args.atol}')
    if args.latency:
        ort_s, torch_s = latency(args.out, module, (1, 3, *shape), args.latency)
        print(f'latency at {shape[0]}x{shape[1]}, batch 1: ONNX Runtime {ort_s * 1e3:.1f} ms, eager PyTorch '
              f'{torch_s * 1e3:.1f} ms ({torch_s / ort_s:.2f}x)')
    axes = ('dynamic batch' + ('' if facts.get('fixed_size') else ' and size')) if args.dynamic else 'static'
    print(f'wrote {args.out} ({facts["kind"]}, {axes})')


if __name__ == '__main__':
    main()
