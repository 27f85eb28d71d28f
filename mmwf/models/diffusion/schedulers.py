"""Sampling our denoisers with diffusers' schedulers.

Table 7's protocol is IDDPM's ancestral sampler (:class:`~mmwf.models.diffusion.GaussianDiffusion`). diffusers'
``DDPMScheduler`` with ``variance_type='learned_range'`` and ``clip_sample=False`` on the same betas and the same
(respaced) steps computes the same update in a float32 schedule; DDIM, DPM-Solver and the other diffusers schedulers
sample in fewer steps from the noise prediction alone (the learned variance unused): faster, and not Table 7's
protocol. Shapes: x (B, C, H, W); the model returns C channels, or 2C with a learned variance.
"""
from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence

import torch

# the schedule comes from the model (LatentDiffusion's num_timesteps and linear betas), never from the scheduler dict
MODEL_OWNED = ('num_train_timesteps', 'trained_betas', 'beta_schedule', 'beta_start', 'beta_end')


def build_scheduler(cfg: dict, betas: torch.Tensor):
    """A diffusers scheduler from ``cfg`` (``type``: its class name, e.g. ``'DDPMScheduler'``, ``'DDIMScheduler'``,
    ``'DPMSolverMultistepScheduler'``; the rest: its arguments) on the training schedule ``betas``."""
    import diffusers
    cfg = dict(cfg)
    name = cfg.pop('type', None)
    cls = getattr(diffusers, str(name), None)
    if not (isinstance(cls, type) and issubclass(cls, diffusers.SchedulerMixin)):
        raise ValueError(f'scheduler type {name!r} is not a diffusers scheduler: name one, e.g. DDPMScheduler, '
                         'DDIMScheduler or DPMSolverMultistepScheduler')
    owned = sorted(set(cfg) & set(MODEL_OWNED))
    if owned:
        raise ValueError(f'scheduler {owned} come from the model (num_timesteps and its linear betas): remove them '
                         'from the scheduler dict')
    return cls(num_train_timesteps=len(betas), trained_betas=betas.tolist(), **cfg)


def uses_learned_variance(scheduler) -> bool:
    """Whether ``scheduler.step`` reads the model's variance channels (DDPMScheduler with a learned variance)."""
    from diffusers import DDPMScheduler
    return isinstance(scheduler, DDPMScheduler) and scheduler.config.variance_type in ('learned', 'learned_range')


@torch.no_grad()
def scheduler_sample_loop(scheduler, model: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], noise: torch.Tensor,
                          steps: Sequence[int], generator: torch.Generator | Sequence[torch.Generator] | None = None,
                          progress: Callable[[int], None] | None = None) -> torch.Tensor:
    """Sampling from x_T = ``noise`` with ``scheduler``: at the timesteps ``steps`` (ascending, the respaced process's
    original timesteps) where its ``set_timesteps`` takes them (DDPM, DPM-Solver), else at its own spacing of as many
    steps (DDIM); ``model`` (x, t) gets the scheduler's timesteps; step noise from ``generator`` (one, or one per
    sample as diffusers' ``randn_tensor`` draws it). Returns x_0."""
    device = noise.device
    if 'timesteps' in inspect.signature(scheduler.set_timesteps).parameters:
        scheduler.set_timesteps(timesteps=sorted(steps, reverse=True), device=device)
    else:
        scheduler.set_timesteps(len(steps), device=device)
    takes_generator = 'generator' in inspect.signature(scheduler.step).parameters
    learned, channels = uses_learned_variance(scheduler), noise.shape[1]
    x = noise * scheduler.init_noise_sigma
    for i, t in enumerate(scheduler.timesteps):
        out = model(scheduler.scale_model_input(x, t), t.to(device).long().expand(len(x)))
        out = out if learned else out[:, :channels]
        x = scheduler.step(out, t, x, **({'generator': generator} if takes_generator else {})).prev_sample
        if progress is not None:
            progress(i + 1)
    return x
