"""FID and Inception Score of generated images, with the Inception-v3 weights of the TensorFlow FID
(``pt_inception-2015-12-05-6726825d.pth``, pytorch-fid's port) read from a local file.

Features are the 2048-wide pool3 activations; the Inception Score's logits are pool3 times the 1008-way
classifier's weight, without its bias, as ADM's evaluator takes them; images are uint8 (B, 3, H, W), resized
bilinearly to 299 x 299 as pytorch-fid does. Statistics files are ``.npz`` with ``mu`` (2048,) and
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
    """||mu1 - mu2||^2 + tr(S1 + S2 - 2 (S1 S2)^(1/2)), the Fréchet distance of two Gaussians, computed by pytorch-fid's
    ``calculate_frechet_distance`` in float64 (the formula of ADM's evaluator too): a product whose square root is not
    finite is retried with 1e-6 I added to both covariances, and an imaginary part above 1e-3 on the square root's
    diagonal is an error, not a number."""
    from pytorch_fid.fid_score import calculate_frechet_distance
    mu1, mu2 = np.atleast_1d(mu1).astype(np.float64), np.atleast_1d(mu2).astype(np.float64)
    sigma1, sigma2 = np.atleast_2d(sigma1).astype(np.float64), np.atleast_2d(sigma2).astype(np.float64)
    if mu1.shape != mu2.shape or sigma1.shape != sigma2.shape:
        raise ValueError(f'statistics of different sizes: {mu1.shape} / {sigma1.shape} vs {mu2.shape} / {sigma2.shape}')
    try:
        with warnings.catch_warnings():  # pytorch-fid's own call of scipy's sqrtm(disp=False), not the user's
            warnings.filterwarnings('ignore', 'The `disp` argument is deprecated', DeprecationWarning)
            return float(calculate_frechet_distance(mu1, sigma1, mu2, sigma2))
    except ValueError as err:
        if 'Imaginary component' not in str(err):
            raise
        raise ValueError(f'no Fréchet distance: the square root of the covariance product has an imaginary part '
                         f'({err}), as pytorch-fid and ADM refuse it; the covariances are too ill-conditioned, most '
                         f'often from fewer samples than the {len(sigma1)} feature dimensions (FID-50K uses 50,000)'
                         ) from None


def feature_statistics(features: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean and covariance (rows are samples, N - 1 normalisation) of features (N, D), float64, through the sums
    that several processes add up (:func:`moment_sums`)."""
    return moment_statistics(moment_sums(torch.as_tensor(np.asarray(features))))


def inception_score(logits: np.ndarray, split_size: int = 5000) -> tuple[float, float]:
    """exp(E_x KL(p(y|x) || p(y))) on consecutive parts of ``split_size`` samples of softmax(logits) (N, K), the
    last part shorter, as ADM's evaluator computes it: (mean, std) over parts (ADM reports the mean)."""
    logits = torch.as_tensor(np.asarray(logits))
    parts, num_parts = inception_parts(torch.arange(len(logits)), len(logits), split_size)
    return inception_score_of_sums(inception_part_sums(logits, parts, num_parts))


def inception_parts(indices: torch.Tensor, total: int, split_size: int) -> tuple[torch.Tensor, int]:
    """The Inception Score part of each sample index of ``total`` samples (consecutive parts of ``split_size``, the
    last shorter) and the number of parts."""
    return indices // split_size, -(-total // split_size)


def inception_part_sums(logits: torch.Tensor, parts: torch.Tensor, num_parts: int) -> dict[str, torch.Tensor]:
    """What the Inception Score needs per part, summable over batches and processes: ``part_probs`` (num_parts, K),
    the sum of p(y|x); ``part_neg_entropy`` (num_parts,), the sum of sum_y p log p; ``part_count``."""
    probs = torch.softmax(logits.detach().double().cpu(), dim=1)
    neg_entropy = (probs * torch.log(probs.clamp_min(1e-30))).sum(1)
    zeros = torch.zeros(num_parts, dtype=torch.float64)
    return dict(part_probs=torch.zeros(num_parts, probs.shape[1], dtype=torch.float64).index_add_(0, parts, probs),
                part_neg_entropy=zeros.clone().index_add_(0, parts, neg_entropy),
                part_count=zeros.clone().index_add_(0, parts, torch.ones(len(probs), dtype=torch.float64)))


def inception_score_of_sums(sums: dict[str, torch.Tensor]) -> tuple[float, float]:
    """(mean, std) over parts of exp(mean p log p - sum p(y) log p(y)), p(y) the part's mean p(y|x)."""
    marginal = sums['part_probs'] / sums['part_count'][:, None]
    kl = sums['part_neg_entropy'] / sums['part_count'] - (marginal * torch.log(marginal.clamp_min(1e-30))).sum(1)
    scores = torch.exp(kl).numpy()
    return float(scores.mean()), float(scores.std())


class FIDInception(nn.Module):
    """The FID Inception-v3 up to pool3 (pytorch-fid's ``InceptionV3`` feature for feature: its resize,
    normalisation and FID blocks) and the weight of its 1008-way classifier.

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
        """uint8 images (B, 3, H, W) -> pool3 features (B, 2048) and the Inception Score's logits (B, 1008):
        features times the classifier's weight, no bias (ADM's evaluator)."""
        x = F.interpolate(images.float() / 255, size=(299, 299), mode='bilinear', align_corners=False)
        x = 2 * x - 1
        for name in self.blocks:
            x = getattr(self.net, name)(x)
        features = F.adaptive_avg_pool2d(x, 1).flatten(1)
        return features, features @ self.net.fc.weight.T


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


def moment_sums(features: torch.Tensor) -> dict[str, torch.Tensor]:
    """What mean and covariance need of features (N, D), in float64 and summable over batches and processes:
    ``count``, ``feature_sum`` (D,), ``outer_sum`` (D, D)."""
    features = features.detach().double().cpu()
    return dict(count=torch.tensor(float(len(features)), dtype=torch.float64), feature_sum=features.sum(0),
                outer_sum=features.T @ features)


def add_sums(total: dict[str, torch.Tensor], more: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``total`` plus ``more``, key by key (an empty ``total`` takes ``more``)."""
    return {k: total[k] + v if k in total else v for k, v in more.items()}


def summed_over_processes(sums: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The sums of every process added (``all_reduce``; one process: a copy)."""
    from mmengine.dist import all_reduce
    out = {k: v.clone() for k, v in sums.items()}
    for v in out.values():
        all_reduce(v, op='sum')
    return out


def moment_statistics(sums: dict[str, torch.Tensor]) -> tuple[np.ndarray, np.ndarray]:
    """Mean and covariance (N - 1 normalisation), float64, from :func:`moment_sums` added up."""
    n = int(sums['count'])
    if n < 2:
        raise ValueError('statistics need at least two samples')
    mu = (sums['feature_sum'] / n).numpy()
    return mu, (sums['outer_sum'].numpy() - n * np.outer(mu, mu)) / (n - 1)


@METRICS.register_module()
class GenerationMetric(BaseMetric):
    """FID against reference statistics and Inception Score of the samples of a generation config's test run.

    Each process sums what the scores need over its samples (features, their outer products and count; per
    Inception Score part, the class probabilities and sum p log p), and the sums of all processes are added: the
    scores equal those of one process over all samples, and only those sums cross processes. The Inception runs on
    the device of the samples. Samples carry their test-set ``index`` (:class:`~mmwf.datasets.SamplingLabels`);
    under several processes a sample is counted by the process of ``index % world_size`` (mmengine's
    ``DefaultSampler`` order: the copies that pad the last round are not counted), and the count must come to the
    test set's ``num_samples``.

    Args:
        reference (str): statistics ``.npz`` of the real images (:func:`load_statistics`).
        inception (str, optional): the local FID Inception weights. Defaults to None: ``extractor`` must be given.
        extractor (Callable, optional): images -> (features, logits), instead of the Inception (e.g. the demo's
            classifier; then the distance is not FID and is reported under ``prefix``). Defaults to None.
        is_split_size (int): samples per Inception Score part (consecutive indices; the last part takes the rest),
            ADM's evaluator's. Defaults to 5000.
        collect_device (str): Defaults to ``'cpu'``.
        prefix (str, optional): metric prefix. Defaults to None.
    """

    default_prefix = 'gen'

    def __init__(self, reference: str, inception: str | None = None, extractor: Callable | None = None,
                 is_split_size: int = 5000, collect_device: str = 'cpu', prefix: str | None = None) -> None:
        super().__init__(collect_device=collect_device, prefix=prefix)
        if (inception is None) == (extractor is None):
            raise ValueError('give the FID Inception weights (inception=PATH) or an extractor, not both')
        self.reference, self.is_split_size = load_statistics(reference), is_split_size
        self.extractor = extractor or FIDInception(inception)
        self.sums: dict[str, torch.Tensor] = {}

    def num_samples(self) -> int:
        total = (self.dataset_meta or {}).get('num_samples')
        if total is None:
            raise ValueError("GenerationMetric needs the test set's num_samples in its metainfo (SamplingLabels "
                             'gives it): the Inception Score parts and the sample count follow from it')
        return int(total)

    def process(self, data_batch: dict, data_samples: Sequence[dict]) -> None:
        from mmengine.dist import get_dist_info
        rank, world_size = get_dist_info()
        kept = [s for s in data_samples if int(s['index']) % world_size == rank]
        if not kept:
            return
        images = torch.stack([s['fake_img'] for s in kept])
        module = self.extractor if isinstance(self.extractor, nn.Module) else None
        if module is not None and next(module.parameters()).device != images.device:
            module.to(images.device)
        with torch.no_grad():
            features, logits = self.extractor(images)
        parts, num_parts = inception_parts(torch.tensor([int(s['index']) for s in kept]), self.num_samples(),
                                           self.is_split_size)
        self.sums = add_sums(self.sums, dict(moment_sums(features),
                                             **inception_part_sums(logits, parts, num_parts)))

    def evaluate(self, size: int) -> dict[str, float]:
        """The sums of every process added (``all_reduce``), then the scores, computed by the first process (the
        2048-wide matrix square root of FID takes seconds of CPU) and broadcast, as mmengine's evaluator does."""
        from mmengine.dist import broadcast_object_list, is_main_process
        if not self.sums:
            raise ValueError('GenerationMetric: no samples reached this process (an empty test set?)')
        sums, self.sums = summed_over_processes(self.sums), {}
        result: list = [None]
        if is_main_process():
            try:
                result = [self.compute_metrics(sums)]
            except Exception as err:  # raised on every process, none left waiting for the broadcast
                result = [err]
        broadcast_object_list(result)
        if isinstance(result[0], Exception):
            raise result[0]
        metrics = result[0]
        return {f'{self.prefix}/{k}' if self.prefix else k: v for k, v in metrics.items()}

    def compute_metrics(self, sums: dict[str, torch.Tensor]) -> dict[str, float]:
        n = int(sums['count'])
        if n != self.num_samples():
            raise ValueError(f'GenerationMetric counted {n} samples of {self.num_samples()}: the test loader must '
                             "hand out the test set in mmengine's DefaultSampler order (sample i to process i % world "
                             'size), each sample once')
        score, std = inception_score_of_sums(sums)
        return dict(FID=frechet_distance(*moment_statistics(sums), *self.reference), IS=score, IS_std=std, samples=n)
