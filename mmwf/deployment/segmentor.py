"""An exported segmentor (:class:`~mmwf.deployment.onnx.ExportWrapper` of kind ``'segmentor'``: images -> decode
head logits) run by ONNX Runtime on image files to a label map, with the steps of mmseg's ``EncoderDecoder.predict``
around it: the config's test pipeline and data preprocessor, whole or sliding-window inference with its resizes,
the padding cropped, the logits resized to the original image, the argmax.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from mmwf.deployment.onnx import ImageSession


class SegmentorSession(ImageSession):
    """Label maps of an exported segmentor graph, as mmseg's ``predict`` gives them.

    Args:
        path (str): the ONNX file (a graph of static size: the sliding window's crop, or the padded image).
        config (str, optional): the segmentor's config (test pipeline, data preprocessor, ``test_cfg``, the decode
            head's ``align_corners``). Defaults to None (the one the export wrote into the file).
        providers (list[str], optional): ONNX Runtime execution providers. Defaults to the CPU's.
    """

    SCOPE = 'mmseg'
    TASK = 'segmentor'

    def __init__(self, path: str, config: str | None = None, providers: list[str] | None = None) -> None:
        super().__init__(path, config, providers)
        self.test_cfg = self.cfg.model.test_cfg
        self.align_corners = self.cfg.model.decode_head.get('align_corners', False)
        self.name = self.session.get_inputs()[0].name

    def encode_decode(self, inputs: Tensor, size: tuple[int, int]) -> Tensor:
        """The graph's logits of ``inputs`` resized to ``size``, as the decode head's ``predict``."""
        self.check_size(inputs, 'the image' if self.test_cfg.get('mode', 'whole') == 'whole' else 'a sliding crop')
        (logits,) = self.session.run(None, {self.name: inputs.numpy()})
        return F.interpolate(torch.from_numpy(logits), size=tuple(size), mode='bilinear',
                             align_corners=self.align_corners)

    def logits(self, inputs: Tensor, meta: dict) -> Tensor:
        """Logits (1, C, H, W) of the preprocessed image: ``EncoderDecoder.inference``, whole or sliding window."""
        if self.test_cfg.get('mode', 'whole') == 'whole':
            return self.encode_decode(inputs, meta['pad_shape'][:2] if 'pad_shape' in meta else meta['img_shape'])
        (h_stride, w_stride), (h_crop, w_crop) = self.test_cfg.stride, self.test_cfg.crop_size
        h_img, w_img = inputs.shape[2:]
        preds, count = None, torch.zeros(1, 1, h_img, w_img)
        for h_idx in range(max(h_img - h_crop + h_stride - 1, 0) // h_stride + 1):
            for w_idx in range(max(w_img - w_crop + w_stride - 1, 0) // w_stride + 1):
                y2, x2 = min(h_idx * h_stride + h_crop, h_img), min(w_idx * w_stride + w_crop, w_img)
                y1, x1 = max(y2 - h_crop, 0), max(x2 - w_crop, 0)
                crop = self.encode_decode(inputs[:, :, y1:y2, x1:x2], (y2 - y1, x2 - x1))
                crop = F.pad(crop, (x1, w_img - x2, y1, h_img - y2))
                preds = crop if preds is None else preds + crop
                count[:, :, y1:y2, x1:x2] += 1
        return preds / count

    def predict(self, inputs: Tensor, meta: dict) -> Tensor:
        """The label map (h, w) int64 of one preprocessed image, in its original size: ``pred_sem_seg`` of mmseg's
        ``predict``."""
        logits = self.logits(inputs, meta)
        left, right, top, bottom = meta.get('img_padding_size', meta.get('padding_size', [0] * 4))
        logits = logits[:, :, top:logits.shape[2] - bottom, left:logits.shape[3] - right]
        logits = F.interpolate(logits, size=tuple(meta['ori_shape'][:2]), mode='bilinear',
                               align_corners=self.align_corners)
        return logits[0].argmax(0)


def pytorch_label_map(model: torch.nn.Module, inputs: Tensor, meta: dict) -> Tensor:
    """``pred_sem_seg`` (h, w) of the segmentor's ``predict`` on one preprocessed image."""
    from mmseg.structures import SegDataSample
    with torch.no_grad():
        return model.predict(inputs, [SegDataSample(metainfo=meta)])[0].pred_sem_seg.data[0]


def label_agreement(ref: Tensor | np.ndarray, got: Tensor | np.ndarray) -> float:
    """The share of pixels on which two label maps agree."""
    ref, got = torch.as_tensor(np.asarray(ref)), torch.as_tensor(np.asarray(got))
    if ref.shape != got.shape:
        raise ValueError(f'label maps of shapes {tuple(ref.shape)} and {tuple(got.shape)}')
    return float((ref == got).float().mean())
