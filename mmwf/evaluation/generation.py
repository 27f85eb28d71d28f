"""FID and Inception Score of generated images, with the Inception-v3 weights of the TensorFlow FID
(``pt_inception-2015-12-05-6726825d.pth``, pytorch-fid's port) read from a local file.

Features are the 2048-wide pool3 activations, logits the 1008-way classifier (IS); images are uint8 (B, 3, H, W),
resized bilinearly to 299 x 299 as pytorch-fid does. Statistics files are ``.npz`` with ``mu`` (2048,) and
``sigma`` (2048, 2048): written by tools/generation/fid_stats.py, or ADM's reference batches
(``VIRTUAL_imagenet256_labeled.npz``), which hold the same keys.
"""
from __future__ import annotations

import os.path as osp
import warnings
from collections.abc import Callable, Sequence

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from mmengine.evaluator import BaseMetric

from mmwf.registry import METRICS

INCEPTION_FILE = 'pt_inception-2015-12-05-6726825d.pth'
INCEPTION_URL = f'https://github.com/mseitzer/pytorch-fid/releases/download/fid_weights/{INCEPTION_FILE}'


def frechet_distance(mu1: np.ndarray, sigma1: np.ndarray, mu2: np.ndarray, sigma2: np.ndarray) -> float:
    """||mu1 - mu2||^2 + tr(S1 + S2 - 2 (S1 S2)^(1/2)), the Fréchet distance of two Gaussians, in float64 (the
    matrix square root by scipy, its imaginary rounding dropped; a singular product is offset by 1e-6 I, as
    pytorch-fid does)."""
    from scipy import linalg
    mu1, mu2 = np.atleast_1d(mu1).astype(np.float64), np.atleast_1d(mu2).astype(np.float64)
    sigma1, sigma2 = np.atleast_2d(sigma1).astype(np.float64), np.atleast_2d(sigma2).astype(np.float64)
    if mu1.shape != mu2.shape or sigma1.shape != sigma2.shape:
        raise ValueError(f'statistics of different sizes: {mu1.shape} / {sigma1.shape} vs {mu2.shape} / {sigma2.shape}')
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always', linalg.LinAlgWarning)
        covmean = linalg.sqrtm(sigma1 @ sigma2)
    if caught or not np.isfinite(covmean).all():
        warnings.warn(f'the covariance product is singular (fewer samples than the {len(sigma1)} feature dimensions?): '
                      'its square root is taken with 1e-6 I added to both covariances; an FID needs many more samples '
                      'than dimensions (FID-50K: 50,000)', stacklevel=2)
        offset = np.eye(len(sigma1)) * 1e-6
        covmean = linalg.sqrtm((sigma1 + offset) @ (sigma2 + offset))
    covmean = np.real(covmean)
    diff = mu1 - mu2
    return float(diff @ diff + np.trace(sigma1) + np.trace(sigma2) - 2 * np.trace(covmean))


def feature_statistics(features: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean and covariance (rows are samples, N - 1 normalisation) of features (N, D), float64."""
    features = np.asarray(features, dtype=np.float64)
    if len(features) < 2:
        raise ValueError('statistics need at least two samples')
    return features.mean(0), np.cov(features, rowvar=False)


def inception_score(logits: np.ndarray, splits: int = 10) -> tuple[float, float]:
    """exp(E_x KL(p(y|x) || p(y))) over ``splits`` equal parts of softmax(logits) (N, K): (mean, std) over parts."""
    probs = torch.softmax(torch.as_tensor(logits, dtype=torch.float64), dim=1).numpy()
    scores = []
    for part in np.array_split(probs, splits):
        marginal = part.mean(0, keepdims=True)
        kl = (part * (np.log(np.clip(part, 1e-30, None)) - np.log(np.clip(marginal, 1e-30, None)))).sum(1)
        scores.append(np.exp(kl.mean()))
    return float(np.mean(scores)), float(np.std(scores))


class FIDInception(nn.Module):
    """The FID Inception-v3 (pytorch-fid's blocks) up to pool3 and its 1008-way classifier.

    Args:
        weights (str, optional): the local ``pt_inception-2015-12-05-6726825d.pth``. None builds random weights
            (tests only: no FID of them means anything). Defaults to None.
    """

    def __init__(self, weights: str | None = None) -> None:
        super().__init__()
        if weights is not None and not osp.isfile(weights):
            raise FileNotFoundError(
                f'FID Inception weights {weights!r} not found: download {INCEPTION_FILE} once from {INCEPTION_URL} '
                '(pytorch-fid\'s port of the TensorFlow FID Inception) and give its path (metric inception=...)')
        from pytorch_fid import inception as fid
        net = fid._inception_v3(num_classes=1008, aux_logits=False, weights=None)
        net.Mixed_5b, net.Mixed_5c, net.Mixed_5d = (fid.FIDInceptionA(192, 32), fid.FIDInceptionA(256, 64),
                                                    fid.FIDInceptionA(288, 64))
        net.Mixed_6b, net.Mixed_6c = fid.FIDInceptionC(768, 128), fid.FIDInceptionC(768, 160)
        net.Mixed_6d, net.Mixed_6e = fid.FIDInceptionC(768, 160), fid.FIDInceptionC(768, 192)
        net.Mixed_7b, net.Mixed_7c = fid.FIDInceptionE_1(1280), fid.FIDInceptionE_2(2048)
        if weights is not None:
            from mmwf.utils.checkpoint import load_state_dict_file, load_strict
            load_strict(net, load_state_dict_file(weights), weights)
        self.net = net.eval()
        self.blocks = ['Conv2d_1a_3x3', 'Conv2d_2a_3x3', 'Conv2d_2b_3x3', 'maxpool1', 'Conv2d_3b_1x1', 'Conv2d_4a_3x3',
                       'maxpool2', 'Mixed_5b', 'Mixed_5c', 'Mixed_5d', 'Mixed_6a', 'Mixed_6b', 'Mixed_6c', 'Mixed_6d',
                       'Mixed_6e', 'Mixed_7a', 'Mixed_7b', 'Mixed_7c']

    @torch.no_grad()
    def forward(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """uint8 images (B, 3, H, W) -> pool3 features (B, 2048) and logits (B, 1008)."""
        x = F.interpolate(images.float() / 255, size=(299, 299), mode='bilinear', align_corners=False)
        x = 2 * x - 1
        for name in self.blocks:
            x = getattr(self.net, name)(x)
        features = F.adaptive_avg_pool2d(x, 1).flatten(1)
        return features, self.net.fc(features)


def load_statistics(path: str) -> tuple[np.ndarray, np.ndarray]:
    """``mu`` and ``sigma`` of a statistics ``.npz`` (ours or ADM's reference batch)."""
    if not osp.isfile(path):
        raise FileNotFoundError(f'reference statistics {path!r} not found: compute them from the real images with '
                                'python tools/generation/fid_stats.py IMAGE_FOLDER OUT.npz --inception WEIGHTS, or use '
                                "ADM's VIRTUAL_imagenet256_labeled.npz (openai/guided-diffusion, evaluations)")
    from mmwf.utils.arrays import load_arrays
    data = load_arrays(path, ('mu', 'sigma'), fix='A statistics file holds mu and sigma: write it with '
                       'python tools/generation/fid_stats.py.')
    return data['mu'], data['sigma']


@METRICS.register_module()
class GenerationMetric(BaseMetric):
    """FID against reference statistics and Inception Score of the samples of a generation config's test run.

    Args:
        reference (str): statistics ``.npz`` of the real images (:func:`load_statistics`).
        inception (str, optional): the local FID Inception weights. Defaults to None: ``extractor`` must be given.
        extractor (Callable, optional): images -> (features, logits), instead of the Inception (e.g. the demo's
            classifier; then the distance is not FID and is reported under ``prefix``). Defaults to None.
        is_splits (int): Inception Score splits. Defaults to 10.
        collect_device (str): Defaults to ``'cpu'``.
        prefix (str, optional): metric prefix. Defaults to None.
    """

    default_prefix = 'gen'

    def __init__(self, reference: str, inception: str | None = None, extractor: Callable | None = None,
                 is_splits: int = 10, collect_device: str = 'cpu', prefix: str | None = None) -> None:
        super().__init__(collect_device=collect_device, prefix=prefix)
        if (inception is None) == (extractor is None):
            raise ValueError('give the FID Inception weights (inception=PATH) or an extractor, not both')
        self.reference, self.is_splits = load_statistics(reference), is_splits
        self.extractor = extractor or FIDInception(inception)

    def process(self, data_batch: dict, data_samples: Sequence[dict]) -> None:
        images = torch.stack([s['fake_img'] for s in data_samples])
        module = self.extractor if isinstance(self.extractor, nn.Module) else None
        if module is not None:
            images = images.to(next(module.parameters()).device)
        features, logits = self.extractor(images)
        for f, lg in zip(features.cpu().numpy(), logits.cpu().numpy()):
            self.results.append((f, lg))

    def compute_metrics(self, results: list) -> dict[str, float]:
        features = np.stack([f for f, _ in results])
        logits = np.stack([lg for _, lg in results])
        fid = frechet_distance(*feature_statistics(features), *self.reference)
        score, std = inception_score(logits, min(self.is_splits, len(logits)))
        return dict(FID=fid, IS=score, IS_std=std, samples=len(results))
