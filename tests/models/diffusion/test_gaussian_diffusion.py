"""DiT's Gaussian diffusion against closed forms: the schedule, forward-process moments, the Bayes posterior, the
Gaussian KL, the discretised likelihood with the exact normal CDF, respacing, the hybrid loss, and ancestral
sampling of a point mass with its optimal denoiser."""
import math

import numpy as np
import pytest
import torch
from torch.distributions import Normal, kl_divergence

from mmwf.models.diffusion.gaussian_diffusion import (
    GaussianDiffusion,
    approx_standard_normal_cdf,
    discretized_gaussian_log_likelihood,
    normal_kl,
    space_timesteps,
)

T = 1000
BETAS = np.linspace(1e-4, 0.02, T)  # Ho et al.'s linear schedule
ABAR = np.cumprod(1 - BETAS)


def test_schedule_and_forward_process_moments():
    d = GaussianDiffusion()
    np.testing.assert_allclose(d.betas.numpy(), BETAS, rtol=1e-12)
    np.testing.assert_allclose(d.alphas_cumprod.numpy(), ABAR, rtol=1e-10)
    x0 = torch.tensor([[-0.8, 0.3]], dtype=torch.float64).expand(200_000, 2)
    t = torch.full((len(x0),), 300)
    xt = d.q_sample(x0, t, torch.randn(x0.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(0)))
    np.testing.assert_allclose(xt.mean(0).numpy(), math.sqrt(ABAR[300]) * x0[0].numpy(), atol=6e-3)
    np.testing.assert_allclose(xt.var(0).numpy(), [1 - ABAR[300]] * 2, rtol=1.5e-2)


@pytest.mark.parametrize('t', [1, 10, 500, 999])
def test_posterior_is_the_product_of_the_two_gaussians(t):
    """q(x_{t-1} | x_t, x_0) is proportional to N(x_{t-1}; sqrt(abar_{t-1}) x_0, 1 - abar_{t-1})
    N(x_t; sqrt(alpha_t) x_{t-1}, beta_t)."""
    d = GaussianDiffusion()
    x0, xt = torch.randn(3, 4, dtype=torch.float64), torch.randn(3, 4, dtype=torch.float64)
    tt = torch.full((3,), t)
    mean, var, log_var = d.q_posterior(x0, xt, tt)
    alpha, prev = 1 - BETAS[t], ABAR[t - 1]
    precision = 1 / (1 - prev) + alpha / BETAS[t]
    expected_mean = (math.sqrt(prev) * x0 / (1 - prev) + math.sqrt(alpha) * xt / BETAS[t]) / precision
    torch.testing.assert_close(mean, expected_mean, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(var, torch.full_like(var, 1 / precision), rtol=1e-9, atol=0)
    torch.testing.assert_close(log_var, torch.full_like(var, math.log(1 / precision)), rtol=1e-9, atol=0)


def test_posterior_log_variance_at_t0_takes_the_value_of_t1():
    d = GaussianDiffusion()
    assert d.posterior_variance[0] == 0
    assert d.posterior_log_variance_clipped[0] == d.posterior_log_variance_clipped[1]


def test_normal_kl_is_torchs():
    m1, m2 = torch.randn(50, dtype=torch.float64), torch.randn(50, dtype=torch.float64)
    lv1, lv2 = torch.randn(50, dtype=torch.float64), torch.randn(50, dtype=torch.float64)
    ref = kl_divergence(Normal(m1, (0.5 * lv1).exp()), Normal(m2, (0.5 * lv2).exp()))
    torch.testing.assert_close(normal_kl(m1, lv1, m2, lv2), ref, rtol=1e-10, atol=1e-12)


def test_discretised_likelihood_is_the_bin_mass_of_the_gaussian():
    """Up to the tanh approximation of the CDF (checked against the exact one): log of the mass of
    [x - 1/255, x + 1/255], the first and last bins extended to infinity."""
    grid = torch.linspace(-6, 6, 1001, dtype=torch.float64)
    torch.testing.assert_close(approx_standard_normal_cdf(grid), torch.special.ndtr(grid), rtol=0, atol=4e-4)
    x = torch.tensor([-1.0, -0.5, 0.0, 0.3, 1.0], dtype=torch.float64)
    means = torch.tensor([-0.9, -0.45, 0.02, 0.3, 0.95], dtype=torch.float64)
    log_scales = torch.full_like(x, math.log(0.05))
    s = 0.05
    upper, lower = torch.special.ndtr((x - means + 1 / 255) / s), torch.special.ndtr((x - means - 1 / 255) / s)
    exact = torch.log(upper - lower)
    exact[0], exact[-1] = torch.log(upper[0]), torch.log(1 - lower[-1])
    torch.testing.assert_close(discretized_gaussian_log_likelihood(x, means, log_scales), exact, rtol=2e-2, atol=0)


def test_respacing_keeps_the_cumulative_products_at_the_kept_steps():
    assert space_timesteps(10, '4') == space_timesteps(10, 4) == [0, 3, 6, 9]
    assert space_timesteps(1000, 'ddim50') == list(range(0, 1000, 20))
    assert space_timesteps(300, '10,15,20')[:3] == [0, 11, 22] and len(space_timesteps(300, '10,15,20')) == 45
    kept = space_timesteps(1000, '250')
    assert len(kept) == 250 and kept[0] == 0 and kept[-1] == 999 and kept[1] == 4
    spaced = GaussianDiffusion().respaced('250')
    assert spaced.timestep_map.tolist() == kept
    np.testing.assert_allclose(spaced.alphas_cumprod.numpy(), ABAR[kept], rtol=1e-10)
    np.testing.assert_allclose(spaced.betas.numpy()[1:], 1 - ABAR[kept][1:] / ABAR[kept][:-1], rtol=1e-10)
    with pytest.raises(ValueError, match='cannot divide'):
        space_timesteps(10, '11')


def test_hybrid_loss_terms():
    """mse: the noise error; vb: the KL of the true posterior and the model's Gaussian (mean from the detached noise
    prediction, log-variance interpolated by v), in bits, at t > 0; its gradient reaches v only."""
    d = GaussianDiffusion()
    torch.manual_seed(0)
    x0, noise = torch.randn(2, 1, 2, 2, dtype=torch.float64), torch.randn(2, 1, 2, 2, dtype=torch.float64)
    t = torch.tensor([3, 700])
    out = torch.randn(2, 2, 2, 2, dtype=torch.float64, requires_grad=True)
    terms = d.training_losses(lambda x, ts: out, x0, t, noise)
    eps, v = out[:, :1].detach(), out[:, 1:].detach()
    torch.testing.assert_close(terms['mse'], ((eps - noise) ** 2).mean((1, 2, 3)))
    vb = []
    for i, ti in enumerate(t.tolist()):
        xt = math.sqrt(ABAR[ti]) * x0[i] + math.sqrt(1 - ABAR[ti]) * noise[i]
        x0_hat = (xt - math.sqrt(1 - ABAR[ti]) * eps[i]) / math.sqrt(ABAR[ti])
        prev = ABAR[ti - 1]
        c1, c2 = BETAS[ti] * math.sqrt(prev) / (1 - ABAR[ti]), (1 - prev) * math.sqrt(1 - BETAS[ti]) / (1 - ABAR[ti])
        post_var = BETAS[ti] * (1 - prev) / (1 - ABAR[ti])
        log_var = (v[i] + 1) / 2 * math.log(BETAS[ti]) + (1 - v[i]) / 2 * math.log(post_var)
        kl = kl_divergence(Normal(c1 * x0[i] + c2 * xt, math.sqrt(post_var)),
                           Normal(c1 * x0_hat + c2 * xt, (0.5 * log_var).exp()))
        vb.append(kl.mean() / math.log(2))
    torch.testing.assert_close(terms['vb'], torch.stack(vb), rtol=1e-8, atol=1e-10)
    torch.testing.assert_close(terms['loss'], terms['mse'] + terms['vb'])
    (grad,) = torch.autograd.grad(terms['vb'].sum(), out)
    assert grad[:, :1].abs().max() == 0 and grad[:, 1:].abs().max() > 0


@pytest.mark.parametrize('steps', ['1000', '25'])
def test_ancestral_sampling_of_a_point_mass_with_its_optimal_denoiser(steps):
    """Data x_0 = c: the optimal noise prediction is (x_t - sqrt(abar_t) c) / sqrt(1 - abar_t), and v = -1 (the
    posterior variance) is the true reverse variance; the sampler then returns c."""
    c = torch.tensor([0.7, -0.2, 0.1])
    d = GaussianDiffusion().respaced(steps)
    abar = torch.as_tensor(ABAR, dtype=torch.float32)

    def model(x, t):  # t: the original timesteps
        a = abar[t].view(-1, 1)
        eps = (x - a.sqrt() * c) / (1 - a).sqrt()
        return torch.cat([eps, -torch.ones_like(eps)], 1)
    out = d.p_sample_loop(model, torch.randn(64, 3, generator=torch.Generator().manual_seed(0)),
                          torch.Generator().manual_seed(1))
    torch.testing.assert_close(out, c.expand_as(out), rtol=0, atol=1e-3)


def test_a_fixed_variance_model_and_a_wrong_output_width():
    d = GaussianDiffusion(learn_sigma=False)
    x = torch.randn(2, 3)
    out = d.p_mean_variance(torch.zeros(2, 3), x, torch.tensor([5, 900]))
    torch.testing.assert_close(out['log_variance'][1], torch.full((3,), math.log(BETAS[900]), dtype=torch.float32))
    with pytest.raises(ValueError, match='2 x 3 channels'):
        GaussianDiffusion().p_mean_variance(torch.zeros(2, 3), x, torch.tensor([5, 900]))
