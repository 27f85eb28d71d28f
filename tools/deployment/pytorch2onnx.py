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

Deployed end to end, checked on images against the config's model in PyTorch (``--images``):

    python tools/deployment/pytorch2onnx.py configs/cascade_wf_t_coco.py CKPT --out cascade.onnx --shape 1024 1024 \
        --end2end --images demo1.jpg demo2.jpg
    python tools/deployment/pytorch2onnx.py configs/upernet_wf_t_ade20k.py CKPT --out upernet.onnx --shape 512 512 \
        --images demo1.jpg

``--end2end`` exports a detector's whole inference (Cascade Mask R-CNN: boxes, scores, labels, mask probabilities;
NMS and RoIAlign as ONNX operators) at the padded size the config's pipeline gives; ``mmwf.deployment.DetectorSession``
runs it with mmdet's pre- and post-processing. With ``--images`` the tool compares, per image, the deployed
detections with the model's ``predict`` (count, labels, boxes within --box-rtol, masks' IoU above --mask-iou), or a
segmentor's label maps (``mmwf.deployment.SegmentorSession``: sliding window or whole image as the config tests) with
at least --label-agreement of the pixels equal, and fails otherwise; a check with no detection on any image fails.

Every file carries its description as ONNX metadata (``mmwf.task``, ``mmwf.classes``, ``mmwf.mean``, ``mmwf.std``,
``mmwf.input_size``, ``mmwf.outputs`` and the whole config as ``mmwf.config``), so the sessions run it without the
config. The arguments (``--out``, ``--images``, ``--shape`` against the size the config's test pipeline pads to)
are checked before the export.
"""
from __future__ import annotations

import argparse
import os.path as osp
import statistics

import torch

from mmwf.analysis.timing import interleaved_times
from mmwf.deployment import (
    DetectorSession,
    SegmentorSession,
    check_onnx,
    compare_detections,
    export_detector,
    export_onnx,
    exportable_model,
    label_agreement,
    preprocessed_sizes,
    pytorch_detections,
    pytorch_label_map,
)
from mmwf.utils.checkpoint import output_problem


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
                        '(batch 1 at the export size, interleaved rounds, CPU; with --end2end: the first of --images '
                        'from the file to the pasted masks)')
    parser.add_argument('--end2end', action='store_true', help='a detector: export its whole inference (boxes, '
                        'scores, labels, masks), not only the backbone + neck')
    parser.add_argument('--images', nargs='+', metavar='IMAGE', help='check the deployed predictions on these '
                        'images against PyTorch (--end2end detectors, segmentors)')
    parser.add_argument('--box-rtol', type=float, default=1e-3, help='largest relative box difference allowed')
    parser.add_argument('--mask-iou', type=float, default=0.99, help='smallest IoU of a deployed mask allowed')
    parser.add_argument('--label-agreement', type=float, default=0.999, help='smallest share of equal pixels '
                        'allowed in a label map')
    args = parser.parse_args(argv)
    problem = output_problem(args.out)
    if problem:
        raise SystemExit(f'error: --out: {problem}')
    missing = [image for image in args.images or [] if not osp.isfile(image)]
    if missing:
        raise SystemExit(f'error: --images: {", ".join(missing)} not found')
    module, facts = exportable_model(args.config, args.checkpoint)
    shape = tuple(args.shape)
    if any(s % facts['stride'] or s < facts['min_size'] for s in shape):
        raise SystemExit(f'error: --shape {shape[0]} {shape[1]}: this model takes sides that are multiples of '
                         f'{facts["stride"]}, at least {facts["min_size"]}')
    kind = facts['kind'].replace('backbone+neck', 'detector')
    if args.end2end and kind != 'detector':
        raise SystemExit(f'error: --end2end is for detectors; {args.config} is a {kind}')
    if args.images and not (args.end2end or kind == 'segmentor'):
        raise SystemExit(f'error: --images checks deployed predictions of a detector (with --end2end) or a '
                         f'segmentor; {args.config} is a {kind}' + ('; add --end2end' if kind == 'detector' else ''))
    if args.end2end:
        if args.dynamic:
            raise SystemExit('error: --end2end exports one image at a static size (the size the config pads to): '
                             'drop --dynamic')
        if args.latency and not args.images:
            raise SystemExit('error: --end2end --latency times the deployed detector on an image: add --images')
        sizes = preprocessed_sizes(facts['config'], 'mmdet')
        if sizes != {shape}:
            padded = ' or '.join(f'{h} {w}' for h, w in sorted(sizes))
            raise SystemExit(f'error: --shape {shape[0]} {shape[1]}: {args.config} preprocesses images to {padded} '
                             + ('(its test pipeline pads to a fixed size): export at --shape that size'
                                if len(sizes) == 1 else '(the size follows the image): an end-to-end graph is static; '
                                'pad to a fixed size in the test pipeline (mmdet\'s Pad with size=...)'))
        export_detector(module.model, shape, args.out, cfg=facts['config'])
        print(f'wrote {args.out} (detector end to end, {shape[0]} x {shape[1]})')
        if args.images:
            session = check_detector(args, module.model)
            if args.latency:
                image = args.images[0]
                ort_times, torch_times = interleaved_times(
                    [lambda: session(image), lambda: pytorch_detections(module.model, *session.inputs(image))],
                    args.latency, 'cpu')
                ort_s, torch_s = statistics.median(ort_times), statistics.median(torch_times)
                print(f'latency on {image}, from the file to the pasted masks: deployed (ONNX Runtime) {ort_s:.2f} s, '
                      f'PyTorch predict {torch_s:.2f} s ({torch_s / ort_s:.2f}x)')
        return
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
    if args.images:
        check_segmentor(args, module.model)


def check_segmentor(args: argparse.Namespace, model: torch.nn.Module) -> None:
    """Compare the deployed label maps with the model's ``predict`` on each of ``args.images``; exit on a failure."""
    session = SegmentorSession(args.out, args.config)
    worst = 1.0
    for image in args.images:
        inputs, meta = session.inputs(image)
        share = label_agreement(pytorch_label_map(model, inputs, meta), session.predict(inputs, meta))
        worst = min(worst, share)
        print(f'{image}: label map equal to PyTorch\'s on {100 * share:.3f} % of the pixels')
    if worst < args.label_agreement:
        raise SystemExit(f'error: a deployed label map agrees with PyTorch on {100 * worst:.3f} % of the pixels '
                         f'< {100 * args.label_agreement:g} %')


def check_detector(args: argparse.Namespace, model: torch.nn.Module) -> DetectorSession:
    """Compare the deployed detections with the model's ``predict`` on each of ``args.images``; exit on a failure,
    else return the session."""
    session = DetectorSession(args.out, args.config)
    failures, compared = [], 0
    for image in args.images:
        inputs, meta = session.inputs(image)
        d = compare_detections(pytorch_detections(model, inputs, meta), session.predict(inputs, meta))
        print(f'{image}: {d["count"][0]} detections in PyTorch, {d["count"][1]} deployed, {d["paired"]} paired '
              f'(same label, box IoU > 0.5); largest relative box difference {d["box_rel"]:.1e}; score difference '
              f'{d["score_abs"]:.1e}; smallest mask IoU {d["mask_iou"]:.4f}')
        compared += d['count'][0] + d['count'][1]
        if not d['count'][0] == d['count'][1] == d['paired'] or d['box_rel'] > args.box_rtol \
                or d['mask_iou'] < args.mask_iou:
            failures.append(image)
    if not compared:
        raise SystemExit('error: no detection on any image, in PyTorch or deployed: the check compared nothing. Give '
                         'the trained checkpoint (random weights score below the threshold) and images of its classes')
    if failures:
        raise SystemExit(f'error: the deployed detector differs from PyTorch on {", ".join(failures)} (a detection '
                         f'without its pair, boxes beyond --box-rtol {args.box_rtol} or masks below --mask-iou '
                         f'{args.mask_iou})')
    return session


if __name__ == '__main__':
    main()
