"""Attention-output distillation from a frozen softmax DeiT teacher during dense fine-tuning.

L = L_task + lambda * sum_l MSE(A_s^l, A_t^l) (docs/linear_attention.md section 9): A^l is the output of
``blocks[l].attn`` (after ``proj``, before the residual add) of the student's and the teacher's backbone, each
running on its own hidden states over the same preprocessed images.
"""
from __future__ import annotations

from contextlib import contextmanager

import torch
import torch.nn as nn
import torch.nn.functional as F
from mmengine.model import BaseModel

from mmwf.registry import MODELS
from mmwf.utils.checkpoint import CheckpointError, unwrap_state_dict
from mmwf.utils.checkpoint.read import modules_of


@contextmanager
def capture_attention(backbone: nn.Module):
    """Collect the outputs of ``backbone.blocks[i].attn`` during the ``with`` body, in block order."""
    outputs: list[torch.Tensor] = []
    handles = [block.attn.register_forward_hook(lambda m, i, o: outputs.append(o)) for block in backbone.blocks]
    try:
        yield outputs
    finally:
        for handle in handles:
            handle.remove()


@MODELS.register_module()
class AttentionDistiller(BaseModel):
    """Wraps any mmdet detector or mmseg segmentor whose ``backbone`` is our ``DeiT`` and adds ``loss_distill``
    to its training losses; prediction is the student's.

    Args:
        student (dict): the task model's config (e.g. ``_base_.model`` of a Mask R-CNN or UperNet config).
        teacher (dict): a softmax ``DeiT`` backbone config with its checkpoint, e.g.
            ``dict(type='DeiT', arch='b', init_cfg=dict(type='Pretrained', checkpoint=...))``. It is frozen
            (no gradients, always in eval mode) and must have the student's depth and width and global
            attention (no windows).
        loss_weight (float): lambda. Defaults to 50 (the paper's, for every operator, dataset and init).
        reduction (str): over the blocks, ``'sum'`` or ``'mean'``; each block's MSE is averaged over batch,
            tokens and channels. Defaults to ``'sum'``.
        data_preprocessor (dict, optional): the student's when it has none of its own (mmengine's Runner passes
            a config's top-level ``data_preprocessor`` here); the distiller always uses the student's. Defaults
            to None.
        init_cfg (dict, optional): mmengine init config. Defaults to None.

    Tokens compared: all of them when both networks have the same tokens; the teacher's patch tokens when the
    student has no class token (MHLA, TTT). Computed in fp32.
    """

    def __init__(self, student: dict, teacher: dict, loss_weight: float = 50.0, reduction: str = 'sum',
                 data_preprocessor: dict | None = None, init_cfg: dict | None = None) -> None:
        super().__init__(init_cfg=init_cfg)
        if reduction not in ('sum', 'mean'):
            raise ValueError(f"reduction must be 'sum' or 'mean', got {reduction!r}")
        if data_preprocessor is not None and student.get('data_preprocessor') is None:
            student = dict(student, data_preprocessor=data_preprocessor)
        self.student = MODELS.build(student)
        self.data_preprocessor = self.student.data_preprocessor
        self.teacher = MODELS.build(teacher)
        self.loss_weight, self.reduction = loss_weight, reduction
        backbone = getattr(self.student, 'backbone', None)
        if backbone is None or not hasattr(backbone, 'blocks'):
            raise TypeError(f'{type(self.student).__name__} has no block-structured backbone to distil '
                            '(use our DeiT as its backbone)')
        if len(backbone.blocks) != len(self.teacher.blocks):
            raise ValueError(f'student has {len(backbone.blocks)} blocks, teacher {len(self.teacher.blocks)}: '
                             'build the teacher with the student\'s arch')
        if any(b.window_size for b in [*backbone.blocks, *self.teacher.blocks]):
            raise ValueError('attention distillation compares global token sets: build student and teacher '
                             'without window attention (window_block_indexes=())')
        for p in self.teacher.parameters():
            p.requires_grad = False

    def train(self, mode: bool = True) -> AttentionDistiller:
        super().train(mode)
        self.teacher.eval()
        return self

    def distill_loss(self, student: list[torch.Tensor], teacher: list[torch.Tensor]) -> torch.Tensor:
        """Per-block MSE between attention outputs (B, N_s, C) and (B, N_t, C), weighted by lambda."""
        losses = []
        for s, t in zip(student, teacher, strict=True):
            if t.shape[1] == s.shape[1] + 1:
                t = t[:, 1:]
            if t.shape != s.shape:
                raise ValueError(f'student attention output {tuple(s.shape)} does not match the teacher\'s '
                                 f'{tuple(t.shape)}')
            losses.append(F.mse_loss(s.float(), t.float()))
        total = torch.stack(losses)
        return self.loss_weight * (total.sum() if self.reduction == 'sum' else total.mean())

    def loss(self, inputs: torch.Tensor, data_samples: list) -> dict[str, torch.Tensor]:
        with capture_attention(self.student.backbone) as student_outputs:
            losses = self.student.loss(inputs, data_samples)
        with torch.no_grad(), capture_attention(self.teacher) as teacher_outputs:
            self.teacher(inputs)
        losses['loss_distill'] = self.distill_loss(student_outputs, teacher_outputs)
        return losses

    def forward(self, inputs: torch.Tensor, data_samples: list | None = None, mode: str = 'tensor'):
        if mode == 'loss':
            return self.loss(inputs, data_samples)
        return self.student(inputs, data_samples, mode)


def student_checkpoint(checkpoint: dict, path: str, backbone_only: bool = False) -> dict:
    """The student of an :class:`AttentionDistiller` checkpoint as a checkpoint of its own: ``{'state_dict': the
    student's tensors (or its backbone's), 'meta': {'converted_from', 'dataset_meta' when recorded}}``, which
    loads into the student's config (``load_from``, ``tools/test.py``) or its backbone (``Pretrained``)."""
    state = unwrap_state_dict(checkpoint, path)
    prefix = 'student.backbone.' if backbone_only else 'student.'
    student = {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}
    if not student:
        raise CheckpointError(f'{path!r} is not a distiller checkpoint: it has no {prefix!r} keys (its keys start '
                              f'with {modules_of(list(state))}). Give the checkpoint of an AttentionDistiller run.')
    meta = {'converted_from': path, 'part': 'student.backbone' if backbone_only else 'student'}
    dataset_meta = (checkpoint.get('meta') or {}).get('dataset_meta') if isinstance(checkpoint, dict) else None
    if dataset_meta and not backbone_only:
        meta['dataset_meta'] = dataset_meta
    return {'state_dict': student, 'meta': meta}
