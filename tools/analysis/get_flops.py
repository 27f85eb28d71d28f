"""Params and FLOPs (multiply-accumulates) of an mmdet / mmseg config: backbone, backbone + neck (the
paper's "backbone" convention, docs/protocol.md) and the whole model, as a markdown table; or of an ImageNet
classifier given by mmpretrain config (configs/imagenet/*, at its test crop) or by its timm name, one per ImageNet
config (``weightformer_{t,s,b}``, ``weightformer_t_static``, ``deit_{t,s,b}_softmax`` and the linear-attention DeiTs
``deit_{t,s,b}_{elu,relu,inline,mhla,ttt}``, ...), with ``--timm-args`` for their block options; or of the denoiser
of a generation config (configs/generation/*, Table 7) on one latent of its input size.

    python tools/analysis/get_flops.py configs/upernet_wf_t_ade20k.py --shape 512 512 --paper
    python tools/analysis/get_flops.py configs/cascade_wf_t_coco.py --shape 1024 1024 --paper
    python tools/analysis/get_flops.py weightformer_t deit_t_softmax weightformer_s deit_s_softmax --paper  # Table 3
    python tools/analysis/get_flops.py deit_t_softmax deit_t_relu deit_t_ttt --shape 1024 1024
    python tools/analysis/get_flops.py configs/generation/wf_dit_s_2_in256.py configs/generation/dit_s_2_in256.py
    python tools/analysis/get_flops.py weightformer_t deit_t_softmax --timm-args norm_layer=rmsnorm mlp_layer=swiglu

An AttentionDistiller config is counted without its teacher (training only). The counting is
``mmwf.analysis.classifier_counts`` / ``task_model_counts``; ``--paper`` puts the paper's figures from the metafiles
beside ours (at the metafile's input size).

FLOPs are counted in the released evaluation order of WeightFormer's Bilateral update (as the paper did);
``--our-order`` counts the order mmwf runs (cheaper at high resolution). The whole detector is counted on
its inference path: the cascade box heads on the RPN proposals (``test_cfg.rpn.max_per_img``), the mask head
on ``--detections`` kept detections (default ``test_cfg.rcnn.max_per_img``, 100; the weights are random, so the
score threshold is lowered to keep that many). The paper's totals (Table 4) are the row ``whole (no mask head)``:
backbone, pyramid, RPN and the three box heads on 1000 proposals.
"""
from __future__ import annotations

import argparse
import os.path as osp

from mmengine.config import Config

from mmwf.analysis import classifier_counts, crop_size, generator_counts, imagenet_model_name, task_model_counts
from mmwf.configs import metafile_models, paper_counts


def paper_figures(name: str, shape: tuple[int, int]) -> dict[str, float]:
    """The paper's figures for config (or classifier) ``name`` if they hold at ``shape``, else empty."""
    name = imagenet_model_name(name)
    listed = metafile_models().get(name, {}).get('Metadata', {}).get('Input')
    return paper_counts(name) if listed == f'{shape[0]}x{shape[1]}' else {}


def beside(ours: float, paper: float | None) -> str:
    return f'{paper} ({(ours - paper) / paper * 100:+.1f}%)' if paper else '-'


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('configs', nargs='+')
    parser.add_argument('--shape', type=int, nargs=2, help='input H W (default: 1024 for mmdet, 512 for mmseg)')
    parser.add_argument('--paper', action='store_true', help='put the paper rows beside ours')
    parser.add_argument('--our-order', action='store_true', help="count mmwf's evaluation order")
    parser.add_argument('--detections', type=int, help='detections the mask head runs on (default: the '
                        "config's test_cfg.rcnn.max_per_img)")
    parser.add_argument('--timm-args', nargs='+', default=[], metavar='KEY=VALUE',
                        help="create_model arguments of mmwf's timm names, e.g. norm_layer=rmsnorm mlp_layer=swiglu")
    args = parser.parse_args()
    timm_args = dict(arg.split('=', 1) for arg in args.timm_args)
    header = '| config | input | part | params (M) | GFLOPs |' + (' paper |' if args.paper else '')
    print(header)
    print('|---' * (header.count('|') - 1) + '|')
    for config in args.configs:
        cfg = Config.fromfile(config) if osp.isfile(config) else None
        scope = cfg.default_scope if cfg else None
        name = osp.splitext(osp.basename(config))[0]
        if cfg and cfg.model.type == 'LatentDiffusion':
            size = cfg.model.denoiser.input_size
            shape = (size, size)
            counts = {'denoiser': generator_counts(config, args.our_order)}
            paper = {'denoiser': ('GFLOPs', 'Parameters (M)')}
        elif scope in (None, 'mmpretrain'):  # a classifier by name or an ImageNet config
            shape = tuple(args.shape) if args.shape else (crop_size(config) if scope else (224, 224))
            try:
                counts = {'classifier': classifier_counts(config, shape, args.our_order, **timm_args)}
            except ValueError as err:
                raise SystemExit(f'{err}; or give a config file') from None
            paper = {'classifier': ('GFLOPs', 'Parameters (M)')}
        else:
            shape = tuple(args.shape) if args.shape else ((1024, 1024) if scope == 'mmdet' else (512, 512))
            counts = task_model_counts(config, shape, args.our_order, args.detections)
            paper = {'backbone+neck': ('GFLOPs (backbone+neck)', None), 'whole': ('GFLOPs', 'Parameters (M)'),
                     'whole (no mask head)': ('GFLOPs (no mask head)', None)}
        figures = paper_figures(name, shape) if args.paper else {}
        decimals = 1 if 'whole' in counts else 2
        for part, (params, flops) in counts.items():
            row = f'| {name} | {shape[0]}x{shape[1]} | {part} | {params:.2f} | {flops:.{decimals}f} |'
            if args.paper:
                flops_key, params_key = paper.get(part, (None, None))
                extra = beside(flops, figures.get(flops_key))
                if params_key in figures:
                    extra += f'; params {beside(params, figures[params_key])}'
                row += f' {extra} |'
            print(row, flush=True)


if __name__ == '__main__':
    main()
