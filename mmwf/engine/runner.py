"""The runner the dense configs name, so that another project's tools run them as mmwf's tools do."""
from __future__ import annotations

import copy
from collections.abc import Iterable

from mmengine.config import Config, ConfigDict
from mmengine.runner import Runner

from mmwf.configs import FollowedField, follow_image_size, formatted_once, take_followed
from mmwf.registry import RUNNERS


def log_followed(logger, followed: Iterable[FollowedField]) -> None:
    """Say in a run's log (``runner.logger``: the console and the work folder's log file) what following the image
    size did: each field set (info), each value kept because it was set explicitly (warning)."""
    for field in followed:
        (logger.warning if field.kept else logger.info)(str(field))


@RUNNERS.register_module()
class ImageSizeRunner(Runner):
    """mmengine's ``Runner`` that first sets what follows the config's ``image_size``
    (:func:`mmwf.configs.follow_image_size`) and logs each field it set or kept. mmengine resolves a config's
    variables when it reads the file, so a child config's or ``--cfg-options``' ``image_size`` reaches the crops,
    pads and test scales only through that call: mmwf's tools make it when they load a config; mmdet's and
    mmpretrain's ``tools/train.py`` and ``tools/test.py`` and mmseg's ``tools/train.py`` build the ``runner_type`` a
    config names, and the dense configs name this one. A run whose fields did not follow its size (mmseg's
    ``tools/test.py``, which builds mmengine's ``Runner``; a config naming ``FlexibleRunner``) is refused before the
    first batch (:class:`~mmwf.engine.hooks.DatasetCheckHook`)."""

    @classmethod
    def from_cfg(cls, cfg: Config | ConfigDict | dict) -> Runner:
        """Build the runner of ``cfg`` (a copy) with its image size followed, and log what that did (here, or in the
        tool that loaded the config: :func:`mmwf.configs.record_followed`)."""
        cfg = formatted_once(copy.deepcopy(cfg) if isinstance(cfg, Config) else ConfigDict(copy.deepcopy(cfg)))
        followed = [*take_followed(cfg), *follow_image_size(cfg)]
        runner = super().from_cfg(cfg)
        log_followed(runner.logger, followed)
        return runner
