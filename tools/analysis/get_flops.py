"""Params and FLOPs (multiply-accumulates) of an mmdet / mmseg config: backbone, backbone + neck (the
paper's "backbone" convention, docs/protocol.md) and the whole model, as a markdown table; or of an ImageNet
classifier given by mmpretrain config (configs/imagenet/*, at its test crop) or by name (Table 3): ``wf-{t,s,b}``,
``static-t``, ``deit-{t,s,b}`` and the linear-attention DeiTs ``deit-{t,s,b}-{elu,relu,inline,mhla,ttt}``.

    python tools/analysis/get_flops.py configs/upernet_wf_t_ade20k.py --shape 512 512 --paper
    python tools/analysis/get_flops.py configs/cascade_wf_t_coco.py --shape 1024 1024 --paper
    python tools/analysis/get_flops.py wf-t deit-t wf-s deit-s --paper          # Table 3, at 224
    python tools/analysis/get_flops.py deit-t deit-t-relu deit-t-ttt --shape 1024 1024

An AttentionDistiller config is counted without its teacher (training only).

FLOPs are counted in the released evaluation order of WeightFormer's Bilateral update (as the paper did);
``--our-order`` counts the order mmwf runs (cheaper at high resolution). The whole detector is counted on
its inference path: the cascade box heads on the RPN proposals (``test_cfg.rpn.max_per_img``), the mask head
on ``--detections`` kept detections (default ``test_cfg.rcnn.max_per_img``, 100; the weights are random, so the
score threshold is lowered to keep that many). The paper's totals (Table 4) match ``--detections 0``: backbone,
pyramid, RPN and the three box heads on 1000 proposals, no mask head.
"""
from __future__ import annotations

import argparse
import contextlib
import os.path as osp
import sys

import torch
import torch.nn as nn
from mmengine.config import Config

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
sys.path.insert(0, ROOT)

from mmwf.analysis import count_flops, flop_analyzer, released_order  # noqa: E402
from mmwf.analysis.inputs import Classifier, build_classifier, build_task_model, task_model_config  # noqa: E402
from mmwf.configs import paper_counts  # noqa: E402

# paper (Tables 4 and 5): params (M), total FLOPs (G), backbone FLOPs (G)
PAPER = {
    'cascade_deit_t_coco': (None, 594, 106), 'cascade_wf_t_coco': (None, 566, 77),
    'upernet_deit_t_ade20k': (11, 42, 11), 'upernet_deit_s_ade20k': (43, 157, 35),
    'upernet_wf_t_ade20k': (12, 38, 7), 'upernet_wf_s_ade20k': (47, 148, 27),
}


# classifier names of Table 3 -> their configs, whose metafile entries hold the paper's counts
CLASSIFIER_CONFIGS = {'wf-t': 'weightformer_t_in1k', 'wf-s': 'weightformer_s_in1k', 'deit-t': 'deit_t_softmax_in1k',
                      'deit-s': 'deit_s_softmax_in1k', 'deit-b': 'deit_b_softmax_in1k'}


def count_classifier(name: str, shape: tuple[int, int], our_order: bool) -> dict[str, tuple[float, float]]:
    """{'classifier': (params M, GFLOPs)} of a classifier by name, or of an mmpretrain config's classifier (its
    backbone with ``out_type='logits'`` holds the head)."""
    if osp.isfile(name):
        from mmwf.registry import MODELS
        model = Classifier(MODELS.build(dict(task_model_config(name)[1].backbone))).eval()
    else:
        try:
            model = build_classifier(name)
        except ValueError as err:
            raise SystemExit(f'{err}; or give a config file') from None
    order = contextlib.nullcontext() if our_order else released_order(model)
    with order, torch.no_grad():
        flops = count_flops(model, torch.randn(1, 3, *shape)) / 1e9
    return {'classifier': (sum(p.numel() for p in model.parameters()) / 1e6, flops)}


class Part(nn.Module):
    """Runs one part of a detector / segmentor on an image batch, for the FLOP counter."""

    def __init__(self, model: nn.Module, part: str, data_samples: list | None = None) -> None:
        super().__init__()
        self.model, self.part, self.data_samples = model, part, data_samples

    def forward(self, x: torch.Tensor):
        if self.part == 'backbone':
            return self.model.backbone(x)
        feats = self.model.extract_feat(x)
        if self.part == 'backbone+neck':
            return feats
        if hasattr(self.model, 'decode_head'):
            return self.model.decode_head(feats)
        proposals = self.model.rpn_head.predict(feats, self.data_samples, rescale=False)
        results = self.model.roi_head.predict(feats, proposals, self.data_samples, rescale=False)
        return tuple(t for r in results for t in (r.bboxes, r.scores, r.masks))


def det_samples(shape: tuple[int, int]) -> list:
    from mmdet.structures import DetDataSample
    return [DetDataSample(metainfo=dict(img_shape=shape, ori_shape=shape, pad_shape=shape, scale_factor=(1., 1.),
                                        batch_input_shape=shape))]


def count(config: str, shape: tuple[int, int], our_order: bool,
          detections: int | None = None) -> dict[str, tuple[float, float]]:
    """{part: (params M, GFLOPs)} for backbone, backbone+neck and the whole model; a detector keeps
    ``detections`` boxes for its mask head (default: its ``test_cfg.rcnn.max_per_img``)."""
    cfg, model_cfg = task_model_config(config)
    if cfg.default_scope == 'mmdet':  # random weights: keep as many detections as asked (0: none pass 1.1)
        rcnn = model_cfg.test_cfg.rcnn
        rcnn.score_thr = 1.1 if detections == 0 else 0.0
        rcnn.max_per_img = detections or rcnn.max_per_img
    model = build_task_model(cfg.default_scope, model_cfg).eval()
    samples = det_samples(shape) if cfg.default_scope == 'mmdet' else None
    x = torch.randn(1, 3, *shape)
    order = contextlib.nullcontext() if our_order else released_order(model)
    params = {'backbone': model.backbone, 'backbone+neck': nn.ModuleList([model.backbone, model.neck]),
              'whole': model}
    with order, torch.no_grad():  # one trace of the whole model; its modules' shares give the parts
        analyzer = flop_analyzer(Part(model, 'whole', samples), x)
        by_module = analyzer.by_module()
    flops = {'backbone': by_module['model.backbone'], 'whole': analyzer.total()}
    flops['backbone+neck'] = flops['backbone'] + by_module['model.neck']
    return {part: (sum(p.numel() for p in module.parameters()) / 1e6, flops[part] / 1e9)
            for part, module in params.items()}


def crop_size(config: str) -> tuple[int, int]:
    """The test input of an mmpretrain config: its ``CenterCrop`` size."""
    crop = next(t['crop_size'] for t in Config.fromfile(config).test_pipeline if t['type'] == 'CenterCrop')
    return (crop, crop) if isinstance(crop, int) else tuple(crop)


def rel(ours: float, paper: float | None) -> str:
    return f'{paper} ({(ours - paper) / paper * 100:+.1f}%)' if paper else '-'


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('configs', nargs='+')
    parser.add_argument('--shape', type=int, nargs=2, help='input H W (default: 1024 for mmdet, 512 for mmseg)')
    parser.add_argument('--paper', action='store_true', help='put the paper rows beside ours')
    parser.add_argument('--our-order', action='store_true', help="count mmwf's evaluation order")
    parser.add_argument('--detections', type=int, help='detections the mask head runs on (default: the '
                        "config's test_cfg.rcnn.max_per_img; 0 counts the paper's Table 4 totals)")
    args = parser.parse_args()
    header = '| config | input | part | params (M) | GFLOPs |' + (' paper |' if args.paper else '')
    print(header)
    print('|---' * (header.count('|') - 1) + '|')
    for config in args.configs:
        scope = Config.fromfile(config).default_scope if osp.isfile(config) else None
        if scope in (None, 'mmpretrain'):  # a classifier by name or an ImageNet config
            shape = tuple(args.shape) if args.shape else (crop_size(config) if scope else (224, 224))
            params, flops = count_classifier(config, shape, args.our_order)['classifier']
            name = osp.splitext(osp.basename(config))[0]
            row = f'| {name} | {shape[0]}x{shape[1]} | classifier | {params:.2f} | {flops:.2f} |'
            if args.paper:
                paper = paper_counts(CLASSIFIER_CONFIGS.get(name, name)) if shape == (224, 224) else None
                row += f' {rel(flops, paper[1])}; params {rel(params, paper[0])} |' if paper else ' - |'
            print(row, flush=True)
            continue
        shape = tuple(args.shape) if args.shape else ((1024, 1024) if scope == 'mmdet' else (512, 512))
        name = osp.splitext(osp.basename(config))[0]
        paper = PAPER.get(name, (None, None, None))
        for part, (params, flops) in count(config, shape, args.our_order, args.detections).items():
            row = f'| {name} | {shape[0]}x{shape[1]} | {part} | {params:.2f} | {flops:.1f} |'
            if args.paper:
                ref = {'backbone+neck': paper[2], 'whole': paper[1]}.get(part)
                extra = rel(flops, ref) + ('; params ' + rel(params, paper[0]) if part == 'whole' and paper[0] else '')
                row += f' {extra} |'
            print(row, flush=True)


if __name__ == '__main__':
    main()
