"""CPU stand-ins for the configs' mixed-precision training steps: one training step of one config per family
(Cascade, UperNet, ImageNet, WF-DiT), the config's own model, data preprocessor and losses, under bfloat16 autocast
around the forward and the loss as mmengine's ``AmpOptimWrapper`` runs them on a GPU (it asserts a GPU itself, so
``tools/train.py`` trains these configs in fp32 on a CPU), against the same step in fp32, the random draws alike.
Mixed precision runs then through every layer these configs reach before a GPU sees it."""
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from mmengine.config import Config

from tests.configs.test_configs import build, det_batch, seg_batch
from tests.mixed_precision import relative_error, unit_roundoff

ROOT = Path(__file__).resolve().parents[2]


def step(model, data_fn, autocast: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The total loss and the flat gradients of every parameter of one training step, every generator seeded (the
    batch augments of mmpretrain draw from numpy)."""
    torch.manual_seed(0)
    np.random.seed(0)
    random.seed(0)
    model.zero_grad()
    with torch.autocast('cpu', dtype=torch.bfloat16, enabled=autocast):
        loss, _ = model.parse_losses(model(**data_fn(), mode='loss'))
    loss.backward()
    return loss.detach(), torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])


def classifier(path: str, size: int):
    from tests.configs.test_imagenet_configs import build as build_classifier
    model = build_classifier(Config.fromfile(path))

    def data():
        from mmpretrain.structures import DataSample
        images = [torch.randint(0, 255, (3, size, size), dtype=torch.uint8) for _ in range(4)]
        samples = [DataSample().set_gt_label(i) for i in range(4)]
        return model.data_preprocessor(dict(inputs=images, data_samples=samples), True)
    return model, data


def generator(path: str, size: int):
    from mmwf.registry import MODELS
    cfg = Config.fromfile(path)
    model = MODELS.build(dict(cfg.model, denoiser=dict(cfg.model.denoiser, input_size=size)))

    def data():
        return dict(inputs=torch.randn(4, 4, size, size), labels=torch.tensor([0, 1, 2, 3]))
    return model, data


def dense(path: str, size: int):
    """mmcv's CPU kernels of NMS and RoIAlign take fp32 only (its CUDA kernels take fp16 too): the stand-in runs
    them in fp32 (:func:`fp32_mmcv_ops`)."""
    cfg, model = build(path, tiny=size)
    batch = det_batch if cfg.default_scope == 'mmdet' else seg_batch
    return model, lambda: batch(model, size, True)


# config -> (builder, input size, bounds on the loss's and the gradients' relative error in bf16 unit roundoffs u):
# about four times the errors measured here (loss under 0.5 u everywhere; gradients 2.4 u ImageNet, 0.8 u WF-DiT,
# 24 u Cascade and 43 u UperNet, whose heads' BatchNorm at random init normalises channels of small variance and so
# magnifies the rounding), and no bound under the backbones' (tests/mixed_precision.py)
FAMILIES = {
    'imagenet/weightformer_t_in1k': (classifier, 64, 12, 12),
    'upernet_wf_t_ade20k': (dense, 128, 12, 175),
    'cascade_wf_t_coco': (dense, 64, 12, 100),
    'generation/wf_dit_b_2_in256_bf16': (generator, 8, 12, 12),
}


@pytest.fixture
def fp32_mmcv_ops(monkeypatch):
    """mmcv's NMS and RoIAlign evaluated on fp32 copies of their inputs, the result in the input's dtype."""
    from importlib import import_module
    from types import SimpleNamespace
    nms, roi = import_module('mmcv.ops.nms'), import_module('mmcv.ops.roi_align')  # the modules, not the functions
    ext, roi_align = nms.ext_module, roi.roi_align
    monkeypatch.setattr(nms, 'ext_module', SimpleNamespace(
        nms=lambda boxes, scores, **kw: ext.nms(boxes.float(), scores.float(), **kw)))
    monkeypatch.setattr(roi, 'roi_align', lambda x, rois, *args: roi_align(x.float(), rois.float(), *args).to(x.dtype))


@pytest.mark.slow
@pytest.mark.parametrize('name', FAMILIES)
def test_config_training_step_under_bf16_autocast_matches_fp32(name, fp32_mmcv_ops):
    make, size, loss_bound, grad_bound = FAMILIES[name]
    model, data = make(str(ROOT / f'configs/{name}.py'), size)
    model.train()
    loss, grads = step(model, data, False)
    mixed_loss, mixed_grads = step(model, data, True)
    assert torch.isfinite(mixed_loss) and torch.isfinite(mixed_grads).all()
    u = unit_roundoff(torch.bfloat16)
    assert relative_error(mixed_loss, loss) < loss_bound * u
    assert relative_error(mixed_grads, grads) < grad_bound * u
