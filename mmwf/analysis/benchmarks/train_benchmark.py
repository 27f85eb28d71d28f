"""``benchmark.py train``: training-step time and peak memory of WeightFormer against DeiT, side by side
(interleaved rounds): the classifier step of the ImageNet recipe (batch 256 at 224 with AMP on one GPU) and the
backbone + SimpleFeaturePyramid step of the Cascade configs (1024 x 1024). Needs torch, timm and mmengine only.

``--release-wfm`` adds the WeightFormer release's own classifiers (its ``model/wfm.py``, read from the user's path)
for each ``weightformer_{t,s}`` asked for, as ``weightformer_t (release)`` and so on: its ``VisionTransformer``
with the arguments of its ``wfm_tiny`` / ``wfm_small`` (built directly: their timm-0.4 builder call fails on timm
1.x).
"""
from __future__ import annotations

import statistics

from mmwf.analysis.protocol import Protocol, add_protocol_arguments, provenance
from mmwf.analysis.timing import device_busy_share, interleaved_times, module_from_file, peak_memory, time_call
from mmwf.analysis.train_step import PARTS, train_step

RELEASE_ARGS = {'weightformer_t': dict(embed_dim=192, depth=17), 'weightformer_s': dict(embed_dim=384, depth=17)}


def add_arguments(parser) -> None:
    parser.add_argument('--models', nargs='+', default=['weightformer_t', 'deit_t_softmax'])
    parser.add_argument('--part', choices=PARTS, default='classifier')
    parser.add_argument('--batch', type=int, default=256)
    parser.add_argument('--size', type=int, default=224)
    parser.add_argument('--amp', action='store_true', help='mixed precision as the references train: fp16 with a loss '
                        'scale on CUDA (bf16 on CPU); --dtype bf16 for bf16 autocast')
    add_protocol_arguments(parser)
    parser.add_argument('--rounds', type=int, default=5)
    parser.add_argument('--iters', type=int, default=3, help='steps per round')
    parser.add_argument('--release-wfm', help="the WeightFormer release's model/wfm.py: its classifiers side by side")


def run(args) -> None:
    protocol = Protocol.from_args(args)
    with protocol.backends():
        measure(args, protocol)


def measure(args, protocol: Protocol) -> None:
    steps = {name: train_step(name, args.part, args.batch, args.size, args.device, args.amp, protocol=protocol)[0]
             for name in args.models}
    if args.release_wfm:
        release = module_from_file(args.release_wfm, "the release's model/wfm.py")
        for name in [n for n in args.models if n in RELEASE_ARGS]:
            network = release.VisionTransformer(img_size=args.size, patch_size=16, num_classes=1000,
                                                **RELEASE_ARGS[name])
            steps[f'{name} (release)'] = train_step(name, args.part, args.batch, args.size, args.device, args.amp,
                                                    network, protocol)[0]
    first = {name: time_call(step, args.device) for name, step in steps.items()}  # compiles, if compiled
    peaks = {}  # CUDA: the peak allocation of one step after a warm-up (on the CPU a step's peak is not its own)
    if args.device.startswith('cuda'):
        for name, step in steps.items():
            peaks[name] = peak_memory(step, args.device)[0]
    times = dict(zip(steps, interleaved_times([lambda s=s: [s() for _ in range(args.iters)] for s in steps.values()],
                                              args.rounds, args.device)))
    times = {name: [t / args.iters for t in ts] for name, ts in times.items()}
    busy = {name: device_busy_share(step, args.device) for name, step in steps.items()}
    ref = args.models[-1]
    print(provenance(args.device))
    print(f'{args.part}, batch {args.batch} at {args.size}, {protocol.describe(args.amp)}, {args.device}; '
          'AdamW (fused on CUDA); loss and loss scale after the last step (fp16 on CUDA scales dynamically; a scale '
          'far below its start of 65536 means non-finite gradients were skipped); compile s: the first step less a '
          'steady one')
    print(f'| model | s / step | img/s | vs {ref} | GPU busy | compile s | peak MB | last loss | loss scale |\n'
          + '|---' * 9 + '|')
    for name, ts in times.items():
        t = statistics.median(ts)
        ratio = statistics.median(r / s for r, s in zip(times[ref], ts))
        loss, scaler = steps[name](), steps[name].scaler
        scale = f'{scaler.get_scale():.3g}' if scaler.is_enabled() else '-'
        compile_s = f'{max(first[name] - t, 0):.1f}' if protocol.compile != 'none' else '-'
        share = '-' if busy[name] is None else f'{busy[name]:.0%}'
        print(f'| {name} | {t:.3f} | {args.batch / t:.1f} | {ratio:.2f}x | {share} | {compile_s} | '
              f'{peaks.get(name, float("nan")):.0f} | {loss.item():.3f} | {scale} |')
