"""Params and FLOPs: mmengine's analyzer plus the ops it does not know (multiply-accumulates, the fvcore /
mmengine convention: a matmul of m x k by k x n counts m*k*n), and the counts of a classifier or of a detector /
segmentor by part that ``tools/analysis/get_flops.py`` prints and the metafiles list."""
from __future__ import annotations

import contextlib
import os.path as osp
from collections.abc import Callable
from math import prod

import torch
import torch.nn as nn
from mmengine.analysis import FlopAnalyzer
from mmengine.analysis.jit_handles import get_shape


def sdpa_flop_jit(inputs: list, outputs: list) -> int:
    """``aten::scaled_dot_product_attention``: Q K^T and A V, each B*h*N*M*d (softmax not counted)."""
    q, k, v = (get_shape(t) for t in inputs[:3])
    return prod(q[:-1]) * k[-2] * q[-1] + prod(q[:-1]) * k[-2] * v[-1]


EXTRA_HANDLES: dict[str, Callable] = {
    'aten::scaled_dot_product_attention': sdpa_flop_jit,
}


def flop_analyzer(model: nn.Module, inputs: torch.Tensor | tuple) -> FlopAnalyzer:
    """mmengine's FlopAnalyzer that also counts fused attention, with its warnings silenced."""
    analyzer = FlopAnalyzer(model, inputs).set_op_handle(**EXTRA_HANDLES)
    analyzer.unsupported_ops_warnings(False)
    analyzer.uncalled_modules_warnings(False)
    return analyzer


def count_flops(model: nn.Module, inputs: torch.Tensor | tuple) -> int:
    """Total multiply-accumulates of ``model(*inputs)``."""
    return int(flop_analyzer(model, inputs).total())


def released_order(model: nn.Module) -> contextlib.AbstractContextManager[nn.Module]:
    """Evaluate every dynamic linear with a choice of order (Bilateral, eq. 8, and the correlation strategies,
    eqs. 5-7) in the token order (same outputs), for the block: the release's for Bilateral, the one whose FLOPs the
    paper's Table 2 reports for eqs. 5-7; e.g. to count FLOPs under the paper's convention. The layers' choice
    scope, :func:`mmwf.models.layers.implementation.evaluation`."""
    from mmwf.models.layers.implementation import evaluation
    return evaluation(model, order='tokens')


def params_m(module: nn.Module) -> float:
    """Parameters of ``module`` in millions."""
    return sum(p.numel() for p in module.parameters()) / 1e6


def classifier_counts(spec: str, shape: tuple[int, int], our_order: bool = False, **timm_args) -> tuple[float, float]:
    """(params M, GFLOPs) of an ImageNet classifier given by name (:func:`mmwf.analysis.models.build_classifier`:
    ``timm_args`` for a timm name) or by mmpretrain config (its backbone with ``out_type='logits'`` holds the head),
    on a (1, 3, *shape) input."""
    from mmwf.configs import task_model_config

    from .models import build_classifier
    if osp.isfile(spec):
        from mmwf.registry import MODELS
        model = MODELS.build(dict(task_model_config(spec)[1].backbone, out_type='timm')).eval()
    else:
        model = build_classifier(spec, **timm_args)
    with (contextlib.nullcontext() if our_order else released_order(model)), torch.no_grad():
        flops = count_flops(model, torch.randn(1, 3, *shape)) / 1e9
    return params_m(model), flops


class Part(nn.Module):
    """A detector / segmentor run as its test path on an image batch, for the FLOP counter: backbone, neck, then the
    decode head, or the RPN and the RoI heads on ``data_samples``; returns the tensors of the predictions."""

    def __init__(self, model: nn.Module, data_samples: list | None = None) -> None:
        super().__init__()
        self.model, self.data_samples = model, data_samples

    def forward(self, x: torch.Tensor):
        feats = self.model.extract_feat(x)
        if hasattr(self.model, 'decode_head'):
            return self.model.decode_head(feats)
        proposals = self.model.rpn_head.predict(feats, self.data_samples, rescale=False)
        results = self.model.roi_head.predict(feats, proposals, self.data_samples, rescale=False)
        return tuple(t for r in results for t in (r.bboxes, r.scores, r.masks))


def task_model_counts(config: str, shape: tuple[int, int], our_order: bool = False,
                      detections: int | None = None) -> dict[str, tuple[float, float]]:
    """{part: (params M, GFLOPs)} of an mmdet / mmseg config's network on a (1, 3, *shape) image, for
    ``'backbone'``, ``'backbone+neck'`` (the paper's "backbone") and ``'whole'``; a detector's mask head runs on
    ``detections`` kept detections (default: its ``test_cfg.rcnn.max_per_img``; the weights are random, so the score
    threshold is lowered to keep that many; 0 runs none), and ``'whole (no mask head)'`` is its total without the
    mask head (the paper's Table 4 totals: backbone, pyramid, RPN, the box heads on the proposals). One trace of the
    whole model; the parts are its modules' shares."""
    from mmwf.configs import build_task_model, task_model_config

    from .task_models import det_samples
    cfg, model_cfg = task_model_config(config)
    detector = cfg.default_scope == 'mmdet'
    if detector:
        rcnn = model_cfg.test_cfg.rcnn
        rcnn.score_thr = 1.1 if detections == 0 else 0.0
        rcnn.max_per_img = detections or rcnn.max_per_img
    model = build_task_model(cfg.default_scope, model_cfg).eval()
    with (contextlib.nullcontext() if our_order else released_order(model)), torch.no_grad():
        analyzer = flop_analyzer(Part(model, det_samples(shape) if detector else None), torch.randn(1, 3, *shape))
        by_module = analyzer.by_module()
    flops = {'backbone': by_module['model.backbone'], 'whole': analyzer.total()}
    flops['backbone+neck'] = flops['backbone'] + by_module['model.neck']
    counts = {'backbone': (params_m(model.backbone), flops['backbone'] / 1e9),
              'backbone+neck': (params_m(model.backbone) + params_m(model.neck), flops['backbone+neck'] / 1e9),
              'whole': (params_m(model), flops['whole'] / 1e9)}
    mask_head = getattr(getattr(model, 'roi_head', None), 'mask_head', None)
    if mask_head is not None:  # the paper's Table 4 totals: the same trace without the mask head's share
        counts['whole (no mask head)'] = (params_m(model) - params_m(mask_head),
                                          (flops['whole'] - by_module['model.roi_head.mask_head']) / 1e9)
    return counts


def crop_size(config: str) -> tuple[int, int]:
    """The test input (H, W) of an mmpretrain config: its ``CenterCrop`` size."""
    from mmengine.config import Config
    crop = next(t['crop_size'] for t in Config.fromfile(config).test_pipeline if t['type'] == 'CenterCrop')
    return (crop, crop) if isinstance(crop, int) else tuple(crop)


class Denoise(nn.Module):
    """A diffusion transformer's forward on (x, t, y) of one sample, for the FLOP counter."""

    def __init__(self, denoiser: nn.Module) -> None:
        super().__init__()
        self.denoiser = denoiser

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        zeros = torch.zeros(x.shape[0], dtype=torch.long, device=x.device)
        return self.denoiser(x, zeros + 500, zeros)


def generator_counts(config: str, our_order: bool = False) -> tuple[float, float]:
    """(params M, GFLOPs) of a generation config's denoiser on one (1, C, s, s) latent of its ``input_size`` (the
    attention's products counted too, through the fused-attention handle)."""
    from mmengine.config import Config

    from mmwf.registry import MODELS
    denoiser = MODELS.build(Config.fromfile(config).model.denoiser).eval()
    x = torch.randn(1, denoiser.in_channels, denoiser.input_size, denoiser.input_size)
    with (contextlib.nullcontext() if our_order else released_order(denoiser)), torch.no_grad():
        flops = count_flops(Denoise(denoiser), x) / 1e9
    return params_m(denoiser), flops
