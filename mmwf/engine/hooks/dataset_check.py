"""The datasets of a run checked against each other and the model before the first batch, under any runner."""
from __future__ import annotations

from mmengine.hooks import Hook
from mmengine.model import is_model_wrapper

from mmwf.configs import unfollowed_image_size
from mmwf.datasets.checks import REMAP_KEY, check_classes, configure_annotation_checks
from mmwf.registry import HOOKS

from .runner_state import built_datasets


@HOOKS.register_module()
class DatasetCheckHook(Hook):
    """Before the run, the built datasets (train and val when training, test when testing) are checked against each
    other and the model's heads (:func:`mmwf.datasets.check_classes`: class lists, ``num_classes``, COCO
    categories, and labels remapped by class name: refused unless the config sets ``remap_classes=True``, then each
    remapping logged), and every ``LoadAnnotations`` of their pipelines is followed by a
    :class:`~mmwf.datasets.CheckAnnotations` step with the dataset's class count and the decode head's ignore index,
    before any loader worker starts (mmdet's ``NumClassCheckHook`` is the pattern). The test set meets the classes
    the model was trained on through the checkpoint's record of them (:class:`StrictLoadHook`). First, a config's
    changed ``image_size`` must have reached the fields that follow it (:func:`mmwf.configs.unfollowed_image_size`):
    built from stale crops and pads, the run would train at the old size."""

    priority = 'VERY_HIGH'

    def before_run(self, runner) -> None:
        problem = unfollowed_image_size(runner.cfg)
        if problem is not None:
            raise ValueError(problem)
        model = runner.model.module if is_model_wrapper(runner.model) else runner.model
        splits = built_datasets(runner)
        remap = bool(runner.cfg.get(REMAP_KEY, False))
        for line in check_classes(splits, model, remap=remap):
            runner.logger.warning(f'{REMAP_KEY}=True: {line}')
        ignore = next((m.ignore_index for name, m in model.named_modules()
                       if name.endswith('decode_head') and isinstance(getattr(m, 'ignore_index', None), int)), None)
        added = sum(configure_annotation_checks(dataset, ignore) for dataset in splits.values())
        if added:
            runner.logger.info(f'CheckAnnotations added after {added} LoadAnnotations steps')
