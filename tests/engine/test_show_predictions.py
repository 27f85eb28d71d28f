"""ShowPredictionsHook: one picture per test image, drawn by the config's visualizer (mmdet's and mmseg's are run
by the demo test in tests/tools; here mmpretrain's, which draws through another method, and the image limit)."""
from types import SimpleNamespace

import cv2
import numpy as np
import torch

from mmwf.engine.hooks import ShowPredictionsHook


def test_classification_pictures_and_the_limit(tmp_path):
    from mmpretrain.structures import DataSample
    from mmpretrain.visualization import UniversalVisualizer
    samples = []
    for i in range(3):
        path = tmp_path / f'img{i}.jpg'
        cv2.imwrite(str(path), np.full((40, 60, 3), 60 * i, np.uint8))
        sample = DataSample(metainfo=dict(img_path=str(path))).set_gt_label(i % 2)
        samples.append(sample.set_pred_score(torch.tensor([0.3, 0.7])))
    visualizer = UniversalVisualizer(name='show_predictions_test')
    visualizer.dataset_meta = dict(classes=('circle', 'square'))
    runner = SimpleNamespace(visualizer=visualizer, logger=SimpleNamespace(info=lambda msg: None))
    hook = ShowPredictionsHook(str(tmp_path / 'pictures'), max_images=2)
    hook.before_test(runner)
    hook.after_test_iter(runner, 0, outputs=samples[:2])
    hook.after_test_iter(runner, 1, outputs=samples[2:])
    assert sorted(p.name for p in (tmp_path / 'pictures').iterdir()) == ['img0.png', 'img1.png']
    drawn = cv2.imread(str(tmp_path / 'pictures/img1.png'))
    assert drawn is not None and (drawn != 60).any()  # the labels are written on the image
