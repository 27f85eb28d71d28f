"""Smoke check of the installed stack (becomes the end-to-end demo with the dense-prediction configs).

Builds WeightFormer-T through mmdet's and mmseg's registries (as a config with
``custom_imports=dict(imports=['mmwf'])`` does), runs a forward pass on a non-square image, and checks
that mmcv's compiled ops work.
"""
import time

import torch


def main() -> None:
    start = time.perf_counter()
    import mmwf
    from mmwf.utils import check_stack

    check_stack(require_mmcv_ops=True)
    from mmcv.ops import nms
    from mmengine.registry import init_default_scope

    boxes = torch.tensor([[0, 0, 10, 10], [1, 1, 10, 10], [20, 20, 30, 30]], dtype=torch.float32)
    _, keep = nms(boxes, torch.tensor([0.9, 0.8, 0.7]), iou_threshold=0.5)
    assert keep.tolist() == [0, 2], keep
    img = torch.randn(1, 3, 320, 480)
    for scope in ('mmdet', 'mmseg'):
        init_default_scope(scope)
        registry = __import__(f'{scope}.registry', fromlist=['MODELS']).MODELS
        model = registry.build(dict(type='WeightFormer', arch='t', out_indices=(4, 8, 12, 16))).eval()
        with torch.no_grad():
            shapes = [tuple(o.shape) for o in model(img)]
        print(f'{scope}: WeightFormer-T on {tuple(img.shape)} -> {shapes}')
    print(f'mmwf {mmwf.__version__}: stack ok, mmcv ops ok ({time.perf_counter() - start:.1f}s)')


if __name__ == '__main__':
    main()
