"""``benchmark.py engine-split``: where the time of a block goes, by engine: the token mixer (softmax attention, each
linear attention, WeightFormer's dynamic depthwise conv) against the channel mixer (the MLP, WeightFormer's MLP with
its dynamic linears) of one block of DeiT-T and WF-T, timed side by side (interleaved rounds) across sequence lengths
(224 to 2048 px at patch 16), in inference and in training (forward, backward); prints the length at which each token
mixer's time exceeds its block's channel mixer's, and plots it."""
from __future__ import annotations

import statistics

import torch

from mmwf.analysis.engine_split import block_engines, crossover
from mmwf.analysis.timing import interleaved_times
from mmwf.models.layers import OPERATORS

MODES = ('inference', 'training')


def mixer_step(mixer, x: torch.Tensor, mode: str):
    """One call of ``mixer`` on ``x``: under no_grad (inference) or forward and backward (training)."""
    if mode == 'inference':
        def step() -> None:
            with torch.no_grad():
                mixer(x)
        return step
    x = x.detach().requires_grad_()

    def step() -> None:
        mixer(x).sum().backward()
    return step


def token_mixer_name(model: str) -> str:
    return 'dynamic DWConv' if model.startswith('weightformer') else f'{model.split("_")[-1]} attention'


def add_arguments(parser) -> None:
    parser.add_argument('--models', nargs='+', default=[*(f'deit_t_{op}' for op in OPERATORS), 'weightformer_t'])
    parser.add_argument('--sizes', nargs='+', type=int, default=[224, 384, 512, 768, 1024, 1536, 2048],
                        help='image sides in px (patch 16)')
    parser.add_argument('--modes', nargs='+', default=list(MODES), choices=MODES)
    parser.add_argument('--batch', type=int, default=1)
    parser.add_argument('--rounds', type=int, default=5)
    parser.add_argument('--plot', help='write the PNG here')


def run(args) -> None:
    print(f'device {args.device}, torch {torch.__version__}, threads {torch.get_num_threads()}, batch {args.batch}, '
          f'{args.rounds} rounds; median ms of one block\'s token mixer / channel mixer')
    lengths = [(s // 16) ** 2 for s in args.sizes]
    results = {}
    for mode in args.modes:
        print(f'\n{mode}\n| model | token mixer | ' + ' | '.join(f'{s} px ({n})' for s, n in zip(args.sizes, lengths))
              + ' | tokens (px) from which the token mixer costs more |')
        print('|---' * (3 + len(args.sizes)) + '|')
        for model in args.models:
            token, channel = [], []
            for size in args.sizes:
                hw = (size // 16, size // 16)
                block, *mixers = block_engines(model, hw)
                block.to(args.device).train(mode == 'training')
                x = torch.randn(args.batch, hw[0] * hw[1], block.norm2.normalized_shape[0], device=args.device)
                times = interleaved_times([mixer_step(m, x, mode) for m in mixers], args.rounds, args.device)
                token.append(statistics.median(times[0]) * 1e3)
                channel.append(statistics.median(times[1]) * 1e3)
            cross = crossover(lengths, token, channel)
            results[(mode, model)] = token, channel, cross
            where = f'{cross:.0f} ({16 * cross ** 0.5:.0f})' if cross else f'none up to {lengths[-1]}'
            print(f'| {model} | {token_mixer_name(model)} | '
                  + ' | '.join(f'{t:.1f} / {c:.1f}' for t, c in zip(token, channel)) + f' | {where} |', flush=True)
    if args.plot:
        save_plot(results, lengths, args.plot, args.device)
        print(f'plot: {args.plot}')


def save_plot(results: dict, lengths: list[int], path: str, device: str) -> None:
    """Token-mixer time over channel-mixer time against sequence length, one panel per mode; 1 is the crossover."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    modes = sorted({mode for mode, _ in results}, key=MODES.index)
    fig, axes = plt.subplots(1, len(modes), figsize=(6 * len(modes), 4.2), squeeze=False)
    for ax, mode in zip(axes[0], modes):
        for (m, model), (token, channel, _) in results.items():
            if m == mode:
                ax.plot(lengths, [t / c for t, c in zip(token, channel)], marker='o',
                        label=f'{model}: {token_mixer_name(model)}')
        ax.axhline(1, color='grey', linestyle='--', linewidth=1)
        ax.set_xscale('log')
        ax.set_yscale('log')
        ax.set_xlabel('sequence length (tokens)')
        ax.set_ylabel('token mixer time / channel mixer time')
        ax.set_title(f'one block, {mode} ({device})')
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)

