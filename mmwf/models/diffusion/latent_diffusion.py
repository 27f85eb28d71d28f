"""Class-conditional (latent) diffusion as an mmengine model: DiT's training step and sampler around a denoiser
(:class:`~mmwf.models.diffusion.DiT` or :class:`~mmwf.models.diffusion.WeightFormerDiT`), trained and tested with
``tools/train.py`` / ``tools/test.py`` like every other config.

Batches are ``dict(inputs=..., labels=...)``: ``inputs`` are images (uint8 (B, 3, H, W), encoded by the VAE on the
fly, or the diffusion data itself without a VAE: pixel space) or cached latents (float (B, 4, h, w), already scaled);
``labels`` (B,) class indices. In ``predict`` mode the labels are the classes to sample; the results are uint8
images (B, 3, H, W) as DiT's sample_ddp.py writes them.
"""
from __future__ import annotations

import torch
from mmengine.model import BaseDataPreprocessor, BaseModel

from mmwf.registry import MODELS

from .gaussian_diffusion import GaussianDiffusion, index_generators, randn
from .schedulers import build_scheduler, scheduler_sample_loop
from .vae import LATENT_SCALE, FrozenVAE


@MODELS.register_module()
class GenerationDataPreprocessor(BaseDataPreprocessor):
    """Moves a batch to the device, stacks lists, and maps uint8 images to [-1, 1] (x / 127.5 - 1); float inputs
    (latents) pass unchanged; a sampling batch may hold labels only."""

    def forward(self, data: dict, training: bool = False) -> dict:
        data = self.cast_data(dict(data))
        inputs, labels, indices = data.get('inputs'), data.get('labels'), data.get('indices')
        if isinstance(inputs, (list, tuple)):
            inputs = torch.stack(list(inputs))
        if inputs is not None and inputs.dtype == torch.uint8:
            inputs = inputs.float() / 127.5 - 1
        if labels is not None:
            labels = torch.as_tensor(labels).to(self.device).long()
        out = dict(inputs=inputs, labels=labels)
        if indices is not None:
            out['indices'] = torch.as_tensor(indices).long()
        return out


@MODELS.register_module()
class LatentDiffusion(BaseModel):
    """DiT's diffusion training and sampling.

    Args:
        denoiser (dict): the diffusion transformer's config.
        vae_path (str, optional): a local diffusers AutoencoderKL folder; images are encoded on the fly (not needed
            with cached latents, :class:`~mmwf.datasets.LatentCacheDataset`) and samples decoded. None: pixel space
            (samples are the diffusion data). Defaults to None.
        latent_scale (float): the VAE latent scaling. Defaults to 0.18215.
        num_timesteps (int): training steps of the linear schedule. Defaults to 1000.
        sampling_steps (int | str): respacing for sampling (:func:`~mmwf.models.diffusion.space_timesteps`). Defaults
            to ``'250'`` (DiT's FID runs).
        cfg_scale (float): classifier-free guidance at sampling; 1.0 is none (Table 7). Defaults to 1.0.
        scheduler (dict, optional): sample with a diffusers scheduler instead of IDDPM's ancestral sampler: ``type``
            its class name, the rest its arguments; the training schedule (``num_timesteps``, linear betas) is
            the model's (:func:`~mmwf.models.diffusion.schedulers.build_scheduler`). ``dict(type='DDPMScheduler',
            variance_type='learned_range', clip_sample=False)`` is IDDPM's update on the same steps in a float32
            schedule; DDIM / DPM-Solver (``'DDIMScheduler'``, ``'DPMSolverMultistepScheduler'``) sample in fewer
            steps from the noise prediction alone, not Table 7's protocol. Training is unchanged (the hybrid loss).
            Defaults to None.
        sample_seed (int): the noise of sample i (its index in the test set, or its position among the samples this
            model drew) comes from a generator seeded with ``sample_seed`` and i alone (:meth:`sample_generators`), so a
            sample set is the same for any batch size and number of processes. Defaults to 0.
        data_preprocessor (dict, optional): Defaults to :class:`GenerationDataPreprocessor`.
        init_cfg (dict, optional): mmengine init config. Defaults to None.
    """

    def __init__(self, denoiser: dict, vae_path: str | None = None, latent_scale: float = LATENT_SCALE,
                 num_timesteps: int = 1000, sampling_steps: int | str = '250', cfg_scale: float = 1.0,
                 scheduler: dict | None = None, sample_seed: int = 0, data_preprocessor: dict | None = None,
                 init_cfg: dict | None = None) -> None:
        super().__init__(data_preprocessor=data_preprocessor or dict(type='GenerationDataPreprocessor'),
                         init_cfg=init_cfg)
        self.denoiser = MODELS.build(denoiser)
        self.vae = FrozenVAE(vae_path, latent_scale) if vae_path else None
        self.diffusion = GaussianDiffusion(num_timesteps=num_timesteps, learn_sigma=self.denoiser.learn_sigma)
        self.sampler = self.diffusion.respaced(sampling_steps)
        self.scheduler = build_scheduler(scheduler, self.diffusion.betas) if scheduler else None
        if cfg_scale < 1.0:
            raise ValueError(f'cfg_scale {cfg_scale} < 1: 1.0 samples without guidance, > 1 with it')
        self.cfg_scale, self.sample_seed, self.num_sampled = cfg_scale, sample_seed, 0

    def to_diffusion_data(self, inputs: torch.Tensor) -> torch.Tensor:
        """Images in [-1, 1] -> latents through the VAE; latents (or pixel-space data) as they are."""
        if self.vae is not None and inputs.shape[1] == 3 and self.denoiser.in_channels != 3:
            return self.vae.encode(inputs)
        if inputs.shape[1] != self.denoiser.in_channels:
            raise ValueError(f'inputs have {inputs.shape[1]} channels, the denoiser takes {self.denoiser.in_channels}:'
                             ' give images with vae_path set, or the latent cache of this VAE')
        return inputs

    def check_labels(self, labels: torch.Tensor | None) -> torch.Tensor:
        n = self.denoiser.num_classes
        if labels is None or labels.numel() and not (0 <= int(labels.min()) and int(labels.max()) < n):
            got = 'none' if labels is None else f'{int(labels.min())}..{int(labels.max())}'
            raise ValueError(f'class labels must lie in [0, {n}) for this denoiser (num_classes={n}; {n} is the '
                             f'unconditional label of guidance), got {got}: give the dataset num_classes={n}')
        return labels

    def loss(self, inputs: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        labels = self.check_labels(labels)
        x = self.to_diffusion_data(inputs)
        t = torch.randint(0, self.diffusion.num_timesteps, (x.shape[0],), device=x.device)
        # the loss in fp32 whatever the denoiser computes in (mixed precision: the configs' *_bf16 / *_fp16)
        terms = self.diffusion.training_losses(lambda xt, ts: self.denoiser(xt, ts, labels).float(), x, t)
        losses = dict(loss_mse=terms['mse'].mean())
        if 'vb' in terms:
            losses['loss_vb'] = terms['vb'].mean()
        return losses

    def sample_generators(self, indices: torch.Tensor, device: torch.device | str) -> list[torch.Generator]:
        """One generator per sample index, from ``sample_seed`` and the index alone
        (:func:`~mmwf.models.diffusion.gaussian_diffusion.index_generators`)."""
        return index_generators(self.sample_seed, indices, device)

    @torch.no_grad()
    def sample(self, labels: torch.Tensor,
               generator: torch.Generator | list[torch.Generator] | None = None) -> torch.Tensor:
        """Samples of ``labels`` (B,) as diffusion data (latents, or pixels without a VAE), (B, C, s, s); the noise
        from ``generator`` (one, or one per sample: :func:`~mmwf.models.diffusion.gaussian_diffusion.randn`); the
        denoiser runs in eval mode (no label dropout) and is left in the mode it had."""
        d = self.denoiser
        z = randn((len(labels), d.in_channels, d.input_size, d.input_size), generator, labels.device)
        if self.cfg_scale == 1.0:
            def model(x, t):
                return d(x, t, labels)
        else:  # the conditional and unconditional halves in one batch; the samples follow the conditional half
            both = torch.cat([labels, torch.full_like(labels, d.num_classes)])

            def model(x, t):
                return d.forward_with_cfg(torch.cat([x, x]), torch.cat([t, t]), both, self.cfg_scale)[:len(x)]
        training, _ = d.training, d.eval()  # no label dropout while sampling, even from a model in training mode
        try:
            if self.scheduler is None:
                return self.sampler.p_sample_loop(model, z, generator)
            return scheduler_sample_loop(self.scheduler, model, z, self.sampler.timestep_map.tolist(), generator)
        finally:
            d.train(training)

    def to_images(self, x: torch.Tensor) -> torch.Tensor:
        """Diffusion data -> uint8 images (B, 3, H, W): decoded by the VAE, then clamp(127.5 x + 128)."""
        if self.vae is not None:
            x = self.vae.decode(x)
        return torch.clamp(127.5 * x + 128.0, 0, 255).to(torch.uint8)

    def predict(self, labels: torch.Tensor, indices: torch.Tensor | None = None) -> list[dict]:
        """Samples of ``labels`` (B,) as uint8 images, sample k's noise from its index ``indices[k]`` (default: the
        next B positions among the samples this model drew)."""
        labels = self.check_labels(labels)
        if indices is None:
            indices = torch.arange(self.num_sampled, self.num_sampled + len(labels))
            self.num_sampled += len(labels)
        images = self.to_images(self.sample(labels, self.sample_generators(indices, labels.device)))
        return [dict(fake_img=img, label=int(y), index=int(i)) for img, y, i in zip(images, labels, indices)]

    def forward(self, inputs: torch.Tensor | None = None, labels: torch.Tensor | None = None, mode: str = 'tensor',
                indices: torch.Tensor | None = None):
        if mode == 'loss':
            return self.loss(inputs, labels)
        if mode == 'predict':
            return self.predict(labels, indices)
        if mode == 'tensor':
            t = torch.zeros(inputs.shape[0], dtype=torch.long, device=inputs.device)
            return self.denoiser(self.to_diffusion_data(inputs), t, labels)
        raise ValueError(f"mode must be 'loss', 'predict' or 'tensor', got {mode!r}")
