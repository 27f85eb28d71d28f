"""Gaussian diffusion as DiT trains and samples it (IDDPM, Nichol & Dhariwal 2021): a linear beta schedule,
epsilon prediction with a learned variance interpolated in log space between the posterior variance and beta
("learned range"), the hybrid loss (noise MSE + the variational-bound term, the mean detached, not rescaled),
timestep respacing and ancestral (DDPM) sampling with optional classifier-free guidance.

The schedule is kept in float64 (as IDDPM) and gathered per timestep in the dtype of the data. Data x (B, C, H, W),
timesteps t (B,) integers in [0, num_timesteps).
"""
from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence

import numpy as np
import torch


def randn(shape: Sequence[int], generator: torch.Generator | Sequence[torch.Generator] | None,
          device: torch.device | str, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Standard normal noise of ``shape`` from one generator (or torch's), or from one generator per sample: row k of
    the first ``len(generator)`` rows from ``generator[k]``, so that a sample's noise does not depend on the batch it
    is in; further rows (the unconditional half of a guided batch, which guidance does not read) repeat them."""
    if generator is None or isinstance(generator, torch.Generator):
        return torch.randn(shape, generator=generator, device=device, dtype=dtype)
    rows = torch.stack([torch.randn(tuple(shape[1:]), generator=g, device=device, dtype=dtype) for g in generator])
    return rows.repeat(shape[0] // len(rows), *([1] * (len(shape) - 1)))


def index_generators(seed: int, indices: Iterable[int], device: torch.device | str) -> list[torch.Generator]:
    """One generator per index i, seeded (h + i) mod 2**32, h a 32-bit hash of ``seed`` (numpy's SeedSequence): a
    draw that depends on the seed and its index alone, never on the batch or the process. Distinct for the indices
    of one seed (torch's CPU generator keeps 32 bits of a seed); two seeds' sets overlap only if their hashes lie
    within the set size of each other."""
    base = int(np.random.SeedSequence(seed).generate_state(1)[0])
    return [torch.Generator(device).manual_seed((base + int(i)) % 2**32) for i in indices]


def linear_betas(num_timesteps: int) -> torch.Tensor:
    """Ho et al.'s linear schedule extended to any step count: linspace(1e-4 s, 0.02 s), s = 1000 / num_timesteps."""
    scale = 1000 / num_timesteps
    return torch.linspace(scale * 1e-4, scale * 0.02, num_timesteps, dtype=torch.float64)


def space_timesteps(num_timesteps: int, section_counts: int | str | Sequence[int]) -> list[int]:
    """IDDPM's respacing: the steps kept from each of ``len(section_counts)`` equal sections of the process, a section
    of ``size`` steps giving ``count`` steps ``round(k (size - 1) / (count - 1))`` (accumulated in floating point and
    rounded half to even, as the reference does); ``'ddimN'`` takes the integer stride that gives N steps."""
    if isinstance(section_counts, int):  # e.g. sampling_steps=250 from the command line
        section_counts = [section_counts]
    if isinstance(section_counts, str):
        if section_counts.startswith('ddim'):
            count = int(section_counts[4:])
            for stride in range(1, num_timesteps):
                if len(range(0, num_timesteps, stride)) == count:
                    return list(range(0, num_timesteps, stride))
            raise ValueError(f'cannot take exactly {count} of {num_timesteps} steps with an integer stride')
        section_counts = [int(c) for c in section_counts.split(',')]
    size_per, extra = divmod(num_timesteps, len(section_counts))
    start, steps = 0, []
    for i, count in enumerate(section_counts):
        size = size_per + (1 if i < extra else 0)
        if size < count:
            raise ValueError(f'cannot divide a section of {size} steps into {count}')
        stride = 1 if count <= 1 else (size - 1) / (count - 1)
        position = 0.0
        for _ in range(count):
            steps.append(start + round(position))
            position += stride
        start += size
    return sorted(set(steps))


def normal_kl(mean1: torch.Tensor, logvar1: torch.Tensor, mean2: torch.Tensor, logvar2: torch.Tensor) -> torch.Tensor:
    """KL(N(mean1, e^logvar1) || N(mean2, e^logvar2)), element-wise, in nats."""
    return 0.5 * (-1.0 + logvar2 - logvar1 + torch.exp(logvar1 - logvar2) + (mean1 - mean2) ** 2 * torch.exp(-logvar2))


def approx_standard_normal_cdf(x: torch.Tensor) -> torch.Tensor:
    """The tanh approximation of the standard normal CDF used by IDDPM's likelihood."""
    return 0.5 * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def discretized_gaussian_log_likelihood(x: torch.Tensor, means: torch.Tensor, log_scales: torch.Tensor) -> torch.Tensor:
    """log P(x) (nats, element-wise) of data x in [-1, 1] on 256 levels under N(means, e^(2 log_scales)): the mass of
    the bin [x - 1/255, x + 1/255], the outer bins extended to infinity; probabilities floored at 1e-12."""
    centred, inv_std = x - means, torch.exp(-log_scales)
    cdf_plus = approx_standard_normal_cdf(inv_std * (centred + 1.0 / 255))
    cdf_min = approx_standard_normal_cdf(inv_std * (centred - 1.0 / 255))
    log_cdf_plus = torch.log(cdf_plus.clamp(min=1e-12))
    log_one_minus_cdf_min = torch.log((1.0 - cdf_min).clamp(min=1e-12))
    log_delta = torch.log((cdf_plus - cdf_min).clamp(min=1e-12))
    return torch.where(x < -0.999, log_cdf_plus, torch.where(x > 0.999, log_one_minus_cdf_min, log_delta))


def mean_flat(x: torch.Tensor) -> torch.Tensor:
    """Mean over every dimension but the batch: (B, ...) -> (B,)."""
    return x.mean(dim=tuple(range(1, x.dim())))


class GaussianDiffusion:
    """The diffusion process q(x_t | x_0) = N(sqrt(abar_t) x_0, (1 - abar_t) I) of ``betas`` and the model's reverse
    process p(x_{t-1} | x_t), whose output is the noise (C channels) and, with ``learn_sigma``, v (C channels):
    log Sigma = (v + 1) / 2 log beta_t + (1 - v) / 2 log beta~_t.

    Args:
        betas (torch.Tensor | Sequence[float], optional): the schedule. Defaults to None: :func:`linear_betas`.
        num_timesteps (int): steps of the default schedule. Defaults to 1000.
        learn_sigma (bool): the model predicts the variance (else the fixed large variance beta_t). Defaults to True.
        timestep_map (Sequence[int], optional): for a respaced process, the original timestep of each step (the
            model is called with it). Defaults to None (the identity).
    """

    def __init__(self, betas: torch.Tensor | Sequence[float] | None = None, num_timesteps: int = 1000,
                 learn_sigma: bool = True, timestep_map: Sequence[int] | None = None) -> None:
        betas = linear_betas(num_timesteps) if betas is None else torch.as_tensor(betas, dtype=torch.float64)
        if betas.dim() != 1 or not ((betas > 0) & (betas <= 1)).all():
            raise ValueError('betas must be a 1-D schedule in (0, 1]')
        self.betas, self.num_timesteps, self.learn_sigma = betas, len(betas), learn_sigma
        self.timestep_map = torch.as_tensor(range(len(betas)) if timestep_map is None else timestep_map)
        alphas = 1.0 - betas
        self.alphas_cumprod = torch.cumprod(alphas, 0)
        self.alphas_cumprod_prev = torch.cat([torch.ones(1, dtype=torch.float64), self.alphas_cumprod[:-1]])
        self.posterior_variance = betas * (1.0 - self.alphas_cumprod_prev) / (1.0 - self.alphas_cumprod)
        # the posterior variance is 0 at t = 0: its log takes the value of t = 1 there
        self.posterior_log_variance_clipped = torch.log(
            torch.cat([self.posterior_variance[1:2], self.posterior_variance[1:]]))
        self.posterior_mean_coef1 = betas * self.alphas_cumprod_prev.sqrt() / (1.0 - self.alphas_cumprod)
        self.posterior_mean_coef2 = (1.0 - self.alphas_cumprod_prev) * alphas.sqrt() / (1.0 - self.alphas_cumprod)

    def respaced(self, section_counts: int | str | Sequence[int]) -> GaussianDiffusion:
        """The process on the steps of :func:`space_timesteps` (e.g. ``'250'``): beta'_i = 1 - abar_{s_i} /
        abar_{s_(i-1)}, so that abar is unchanged at the kept steps."""
        kept = space_timesteps(self.num_timesteps, section_counts)
        acp = self.alphas_cumprod[kept]
        betas = 1.0 - acp / torch.cat([torch.ones(1, dtype=torch.float64), acp[:-1]])
        return GaussianDiffusion(betas, learn_sigma=self.learn_sigma, timestep_map=self.timestep_map[kept].tolist())

    @staticmethod
    def _at(values: torch.Tensor, t: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        """values[t] as (B, 1, ..., 1) in the dtype and device of ``like``."""
        out = values.to(t.device)[t].to(like.dtype)
        return out.view(-1, *([1] * (like.dim() - 1)))

    def q_sample(self, x_start: torch.Tensor, t: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        """x_t = sqrt(abar_t) x_0 + sqrt(1 - abar_t) noise."""
        acp = self._at(self.alphas_cumprod, t, x_start)
        return acp.sqrt() * x_start + (1.0 - acp).sqrt() * noise

    def q_posterior(self, x_start: torch.Tensor, x_t: torch.Tensor,
                    t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Mean, variance and clipped log-variance of q(x_{t-1} | x_t, x_0)."""
        mean = self._at(self.posterior_mean_coef1, t, x_t) * x_start + self._at(self.posterior_mean_coef2, t, x_t) * x_t
        return (mean, self._at(self.posterior_variance, t, x_t).expand_as(x_t),
                self._at(self.posterior_log_variance_clipped, t, x_t).expand_as(x_t))

    def p_mean_variance(self, model_output: torch.Tensor, x_t: torch.Tensor, t: torch.Tensor,
                        clip_denoised: bool = False) -> dict[str, torch.Tensor]:
        """p(x_{t-1} | x_t) from the model's output: ``mean``, ``log_variance`` and ``pred_xstart``
        (x_0 = sqrt(1 / abar) x_t - sqrt(1 / abar - 1) eps, clipped to [-1, 1] with ``clip_denoised``)."""
        C = x_t.shape[1]
        if self.learn_sigma:
            if model_output.shape[1] != 2 * C:
                raise ValueError(f'a learned-variance model outputs 2 x {C} channels, got {model_output.shape[1]}')
            eps, v = model_output.split(C, dim=1)
            min_log = self._at(self.posterior_log_variance_clipped, t, x_t)
            max_log = self._at(torch.log(self.betas), t, x_t)
            frac = (v + 1) / 2
            log_variance = frac * max_log + (1 - frac) * min_log
        else:  # fixed large: beta_t, with beta~_1 at t = 0
            eps = model_output
            log_variance = self._at(torch.log(torch.cat([self.posterior_variance[1:2], self.betas[1:]])), t,
                                    x_t).expand_as(x_t)
        acp = self._at(self.alphas_cumprod, t, x_t)
        pred_xstart = (1.0 / acp).sqrt() * x_t - (1.0 / acp - 1).sqrt() * eps
        if clip_denoised:
            pred_xstart = pred_xstart.clamp(-1, 1)
        mean, _, _ = self.q_posterior(pred_xstart, x_t, t)
        return dict(mean=mean, log_variance=log_variance, pred_xstart=pred_xstart)

    def vb_terms_bpd(self, model_output: torch.Tensor, x_start: torch.Tensor, x_t: torch.Tensor,
                     t: torch.Tensor) -> torch.Tensor:
        """The variational-bound term of each sample (bits per dimension, (B,)): KL(q(x_{t-1} | x_t, x_0) ||
        p(x_{t-1} | x_t)) for t > 0, the discretised decoder NLL of x_0 at t = 0."""
        true_mean, _, true_log_variance = self.q_posterior(x_start, x_t, t)
        out = self.p_mean_variance(model_output, x_t, t)
        kl = mean_flat(normal_kl(true_mean, true_log_variance, out['mean'], out['log_variance'])) / math.log(2.0)
        nll = -mean_flat(discretized_gaussian_log_likelihood(
            x_start, out['mean'], 0.5 * out['log_variance'])) / math.log(2.0)
        return torch.where(t == 0, nll, kl)

    def training_losses(self, model: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], x_start: torch.Tensor,
                        t: torch.Tensor, noise: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """DiT's loss per sample (B,): ``mse`` of the predicted noise, ``vb`` (learned variance: the bound term with
        the predicted noise detached, so that it trains the variance only) and ``loss`` = mse + vb. ``model`` is
        called with the original timesteps (:attr:`timestep_map`)."""
        noise = torch.randn_like(x_start) if noise is None else noise
        x_t = self.q_sample(x_start, t, noise)
        output = model(x_t, self.timestep_map.to(t.device)[t])
        C = x_start.shape[1]
        terms = {}
        if self.learn_sigma:
            eps, v = output.split(C, dim=1)
            terms['vb'] = self.vb_terms_bpd(torch.cat([eps.detach(), v], 1), x_start, x_t, t)
        else:
            eps = output
        terms['mse'] = mean_flat((noise - eps) ** 2)
        terms['loss'] = terms['mse'] + terms.get('vb', 0)
        return terms

    def p_sample(self, model_output: torch.Tensor, x_t: torch.Tensor, t: torch.Tensor,
                 noise: torch.Tensor) -> torch.Tensor:
        """x_{t-1} = mean + exp(log_variance / 2) noise (no noise at t = 0)."""
        out = self.p_mean_variance(model_output, x_t, t)
        nonzero = (t != 0).to(x_t.dtype).view(-1, *([1] * (x_t.dim() - 1)))
        return out['mean'] + nonzero * torch.exp(0.5 * out['log_variance']) * noise

    @torch.no_grad()
    def p_sample_loop(self, model: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], noise: torch.Tensor,
                      generator: torch.Generator | Sequence[torch.Generator] | None = None,
                      progress: Callable[[int], None] | None = None) -> torch.Tensor:
        """Ancestral sampling from x_T = ``noise`` through every step of this (respaced) process; ``model`` (x, t)
        receives the original timesteps; the step noise as :func:`randn` draws it from ``generator``. Returns x_0."""
        x = noise
        steps = self.timestep_map.to(noise.device)
        for i in reversed(range(self.num_timesteps)):
            t = torch.full((x.shape[0],), i, device=x.device, dtype=torch.long)
            z = randn(x.shape, generator, x.device, x.dtype)
            x = self.p_sample(model(x, steps[t]), x, t, z)
            if progress is not None:
                progress(self.num_timesteps - i)
        return x
