"""The real workload of a detection or segmentation config, for benchmarking: a training step of backbone + neck
and of the whole model (loss, backward, optimizer step) at the config's input size, and test-time inference.

Weights are random (``init_cfg`` dropped); batches are synthetic but shaped as the config's: 1024 x 1024 padded
images with boxes and masks for the Cascade configs, 512 x 512 crops with label maps for UperNet, and for
inference an image of ``size`` run through the config's test mode (``'whole'`` or ``'slide'``).
"""
from __future__ import annotations

from collections.abc import Callable

import torch
from mmengine.optim import build_optim_wrapper

from mmwf.configs import build_task_model, task_model_config

MODES = ('train backbone+neck', 'train whole', 'inference')


class Workload:
    """A config's model, optimizer and synthetic batches.

    Args:
        config (str): an mmdet or mmseg config file.
        device (str): where to run. Defaults to ``'cpu'``.
        batch (int, optional): images per step. Defaults to 1 for detection and 2 for segmentation (the UperNet
            head's BatchNorm needs two images in training).
        test_mode (str, optional): segmentation only: ``'whole'`` or ``'slide'`` instead of the config's test
            mode. Defaults to None.
        compile (bool): ``torch.compile`` the backbone and the neck (the heads of mmdet / mmseg stay eager).
            Defaults to False.
    """

    def __init__(self, config: str, device: str = 'cpu', batch: int | None = None,
                 test_mode: str | None = None, compile: bool = False) -> None:
        self.cfg, model_cfg = task_model_config(config)
        self.scope = self.cfg.default_scope
        if self.scope not in ('mmdet', 'mmseg'):
            raise ValueError(f'{config} is an {self.scope} config; the workload benchmark takes mmdet / mmseg ones')
        if test_mode == 'whole':
            model_cfg.test_cfg = dict(mode='whole')
        elif test_mode is not None:
            model_cfg.test_cfg.mode = test_mode
        self.model = build_task_model(self.scope, model_cfg).to(device)
        if compile:
            self.model.backbone, self.model.neck = torch.compile(self.model.backbone), torch.compile(self.model.neck)
        self.optim = build_optim_wrapper(self.model, self.cfg.optim_wrapper)
        self.device, self.batch = device, batch or (1 if self.scope == 'mmdet' else 2)
        self.size = (1024, 1024) if self.scope == 'mmdet' else tuple(self.cfg.crop_size)

    def samples(self, size: tuple[int, int], train: bool) -> dict:
        """A preprocessed batch of images of ``size`` (with boxes and masks, or label maps)."""
        with torch.random.fork_rng(devices=[]):  # the same batch every time, torch's own generator left as it was
            torch.manual_seed(0)
            return self._samples(size, train)

    def _samples(self, size: tuple[int, int], train: bool) -> dict:
        if self.scope == 'mmdet':
            from mmdet.testing import demo_mm_inputs
            packed = demo_mm_inputs(batch_size=self.batch, image_shapes=[(3, *size)] * self.batch,
                                    num_items=[8] * self.batch, num_classes=80, with_mask=True)
        else:
            from mmengine.structures import PixelData
            from mmseg.structures import SegDataSample
            samples = []
            for _ in range(self.batch):
                s = SegDataSample(metainfo=dict(img_shape=size, ori_shape=size, pad_shape=size))
                s.gt_sem_seg = PixelData(data=torch.randint(0, 150, (1, *size)))
                samples.append(s)
            packed = dict(inputs=[torch.randint(0, 255, (3, *size), dtype=torch.uint8) for _ in samples],
                          data_samples=samples)
        data = self.model.data_preprocessor(packed, train)
        return dict(inputs=data['inputs'].to(self.device), data_samples=data['data_samples'])

    def train_backbone_neck(self) -> Callable[[], None]:
        """One step of backbone + neck at the input size: sum of the levels' mean squares as the loss."""
        x = torch.randn(self.batch, 3, *self.size, device=self.device)

        def step() -> None:
            self.model.train()
            loss = sum(f.float().square().mean() for f in self.model.extract_feat(x))
            self.optim.update_params(loss)
        return step

    def train_whole(self) -> Callable[[], None]:
        """One step of the whole model: the config's losses, backward, optimizer step."""
        data = self.samples(self.size, train=True)

        def step() -> None:
            self.model.train()
            loss, _ = self.model.parse_losses(self.model(**data, mode='loss'))
            self.optim.update_params(loss)
        return step

    def inference(self, size: tuple[int, int] | None = None) -> Callable[[], None]:
        """Test-time prediction of an image of ``size`` (default: the input size) in the config's test mode."""
        data = self.samples(size or self.size, train=False)

        def step() -> None:
            self.model.eval()
            with torch.no_grad():
                self.model(**data, mode='predict')
        return step

    def step(self, mode: str, size: tuple[int, int] | None = None) -> Callable[[], None]:
        """The callable that runs one ``mode`` step (see :data:`MODES`)."""
        steps = {'train backbone+neck': self.train_backbone_neck, 'train whole': self.train_whole,
                 'inference': lambda: self.inference(size)}
        if mode not in steps:
            raise ValueError(f'unknown workload mode {mode!r}; choose from {MODES}')
        return steps[mode]()
