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

from mmwf.analysis.timing import interleaved_times, module_from_file, peak_memory
from mmwf.analysis.train_step import PARTS, train_step

RELEASE_ARGS = {'weightformer_t': dict(embed_dim=192, depth=17), 'weightformer_s': dict(embed_dim=384, depth=17)}


def add_arguments(parser) -> None:
    parser.add_argument('--models', nargs='+', default=['weightformer_t', 'deit_t_softmax'])
    parser.add_argument('--part', choices=PARTS, default='classifier')
    parser.add_argument('--batch', type=int, default=256)
    parser.add_argument('--size', type=int, default=224)
    parser.add_argument('--amp', action='store_true', help='mixed precision (fp16 on CUDA, bf16 on CPU)')
    parser.add_argument('--rounds', type=int, default=5)
    parser.add_argument('--iters', type=int, default=3, help='steps per round')
    parser.add_argument('--release-wfm', help="the WeightFormer release's model/wfm.py: its classifiers side by side")


def run(args) -> None:
    steps = {name: train_step(name, args.part, args.batch, args.size, args.device, args.amp)[0] for name in args.models}
    if args.release_wfm:
        release = module_from_file(args.release_wfm, "the release's model/wfm.py")
        for name in [n for n in args.models if n in RELEASE_ARGS]:
            network = release.VisionTransformer(img_size=args.size, patch_size=16, num_classes=1000,
                                                **RELEASE_ARGS[name])
            steps[f'{name} (release)'] = train_step(name, args.part, args.batch, args.size, args.device, args.amp,
                                                    network)[0]
    peaks = {}  # CUDA: the peak allocation of one step after a warm-up (on the CPU a step's peak is not its own)
    if args.device.startswith('cuda'):
        for name, step in steps.items():
            step()
            peaks[name] = peak_memory(step, args.device)[0]
    times = dict(zip(steps, interleaved_times([lambda s=s: [s() for _ in range(args.iters)] for s in steps.values()],
                                              args.rounds, args.device)))
    times = {name: [t / args.iters for t in ts] for name, ts in times.items()}
    ref = args.models[-1]
    print(f'{args.part}, batch {args.batch} at {args.size}, {"AMP" if args.amp else "fp32"}, {args.device}; loss and '
          'loss scale after the last step (fp16 on CUDA scales dynamically; a scale far below its start of 65536 means '
          'non-finite gradients were skipped)')
    print(f'| model | s / step | img/s | vs {ref} | peak MB | last loss | loss scale |\n' + '|---' * 7 + '|')
    for name, ts in times.items():
        t = statistics.median(ts)
        ratio = statistics.median(r / s for r, s in zip(times[ref], ts))
        loss, scaler = steps[name](), steps[name].scaler
        scale = f'{scaler.get_scale():.3g}' if scaler.is_enabled() else '-'
        print(f'| {name} | {t:.3f} | {args.batch / t:.1f} | {ratio:.2f}x | {peaks.get(name, float("nan")):.0f} | '
              f'{loss.item():.3f} | {scale} |')
