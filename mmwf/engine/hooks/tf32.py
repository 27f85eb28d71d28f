"""TF32 for the run's float32 matmuls and convolutions on Ampere and later GPUs, as a config switch."""
from __future__ import annotations

import torch
from mmengine.hooks import Hook

from mmwf.registry import HOOKS
from mmwf.utils.tf32_settings import TF32State, restore_tf32, set_tf32


@HOOKS.register_module()
class TF32Hook(Hook):
    """Sets TF32 in CUDA float32 matmuls and in cuDNN's float32 convolutions for the run (training and testing) and
    restores both after it, through the API the running torch has (:mod:`mmwf.utils.tf32_settings`: torch's per-backend
    ``fp32_precision``, and the legacy ``allow_tf32`` flags where they still read, so that a script that set either
    API runs on). TF32 keeps float32's range with a 10-bit mantissa in the products (sums stay float32): DiT enables
    both for training (train.py:12-13, "a lot faster" on A100) and matmul for sampling (sample_ddp.py:49, cuDNN's
    left at torch's default, on). torch's defaults are matmul off, cuDNN on. No effect on CPU or on bf16 / fp16
    products.

    Args:
        matmul (bool): TF32 in float32 matmuls (``nn.Linear``, ``@``). Defaults to True.
        cudnn (bool): TF32 in cuDNN's float32 convolutions (and RNNs). Defaults to True.
    """

    priority = 'VERY_HIGH'

    def __init__(self, matmul: bool = True, cudnn: bool = True) -> None:
        self.matmul, self.cudnn = matmul, cudnn
        self._saved: TF32State | None = None

    def before_run(self, runner) -> None:
        self._saved = set_tf32(matmul=self.matmul, cudnn=self.cudnn)
        if torch.cuda.is_available():
            runner.logger.info(f'TF32: matmul {"on" if self.matmul else "off"}, cuDNN {"on" if self.cudnn else "off"}')

    def after_run(self, runner) -> None:
        self.restore_process_state()

    def restore_process_state(self) -> None:
        """Put back the settings ``before_run`` found (once): at ``after_run``, and through
        :func:`mmwf.engine.launch.restored_state` when the run stops on an error (mmengine then skips ``after_run``)."""
        if self._saved is not None:
            restore_tf32(self._saved)
            self._saved = None
