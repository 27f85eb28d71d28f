"""Pictures of test predictions: what ``tools/test.py --show-dir`` adds to a run."""
from __future__ import annotations

import os
import os.path as osp
from collections.abc import Sequence

from mmengine.hooks import Hook

from mmwf.registry import HOOKS


@HOOKS.register_module()
class ShowPredictionsHook(Hook):
    """After every test iteration, draw each image's ground truth and prediction with the config's visualizer
    (mmdet: boxes and masks; mmseg: colour maps; mmpretrain: the classes) to ``out_dir/<image name>.png``.

    Unlike mmdet's ``DetVisualizationHook`` (``work_dir/<timestamp>/show_dir``) and mmseg's visualizer backends,
    the pictures of every task go straight to ``out_dir``, one file per image.

    Args:
        out_dir (str): folder for the pictures; created if missing.
        max_images (int, optional): draw the first ``max_images`` test images only. Defaults to None (all).
    """

    def __init__(self, out_dir: str, max_images: int | None = None) -> None:
        if max_images is not None and max_images < 1:
            raise ValueError(f'ShowPredictionsHook max_images={max_images}: give a positive count, or None for all')
        self.out_dir, self.max_images = out_dir, max_images
        self.written: list[str] = []

    def before_test(self, runner) -> None:
        os.makedirs(self.out_dir, exist_ok=True)
        self.written = []

    def after_test_iter(self, runner, batch_idx: int, data_batch: dict | None = None,
                        outputs: Sequence | None = None) -> None:
        import mmcv
        for sample in outputs or ():
            if self.max_images is not None and len(self.written) >= self.max_images:
                return
            name = osp.basename(sample.img_path)
            out_file = osp.join(self.out_dir, osp.splitext(name)[0] + '.png')
            image = mmcv.imread(sample.img_path, channel_order='rgb')
            visualizer = runner.visualizer
            if hasattr(visualizer, 'visualize_cls'):  # mmpretrain's UniversalVisualizer
                visualizer.visualize_cls(image, sample, name=name, out_file=out_file)
            else:  # mmdet's and mmseg's local visualizers
                visualizer.add_datasample(name, image, data_sample=sample, draw_gt=True, draw_pred=True,
                                          out_file=out_file)
            self.written.append(out_file)

    def after_test(self, runner) -> None:
        runner.logger.info(f'{len(self.written)} prediction pictures in {self.out_dir}')
