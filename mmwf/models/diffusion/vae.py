"""The frozen image autoencoder of latent diffusion: diffusers' ``AutoencoderKL`` (Stable Diffusion's
``sd-vae-ft-ema`` / ``sd-vae-ft-mse``, as DiT uses them) read from a local folder."""
from __future__ import annotations

import functools
import os.path as osp

import torch

LATENT_SCALE = 0.18215  # Stable Diffusion's latent scaling, DiT's too

VAE_SOURCES = 'https://huggingface.co/stabilityai/sd-vae-ft-ema (or sd-vae-ft-mse)'


@functools.lru_cache(maxsize=4)
def load_vae(path: str, device: str = 'cpu') -> torch.nn.Module:
    """diffusers' AutoencoderKL from the folder ``path`` (``config.json`` + weights) on ``device``, frozen, eval
    mode; one instance per folder, device and process (the model, its EMA copy and the tools share it, and nobody
    moves it: another device gets its own; it is never part of a checkpoint)."""
    if not osp.isfile(osp.join(path, 'config.json')):
        raise FileNotFoundError(
            f'no VAE at {path!r} (a folder with config.json and diffusion_pytorch_model.safetensors). Download it '
            f'once from {VAE_SOURCES}, e.g. `huggingface-cli download stabilityai/sd-vae-ft-ema --local-dir {path}`, '
            'or set model.vae_path')
    from diffusers import AutoencoderKL
    vae = AutoencoderKL.from_pretrained(path, local_files_only=True).eval().to(device)
    for p in vae.parameters():
        p.requires_grad = False
    return vae


class FrozenVAE:
    """Encode images in [-1, 1] (B, 3, H, W) to scaled latents (B, 4, H/8, W/8) and back; not an nn.Module on
    purpose (its weights stay out of the model's state dict and EMA).

    Args:
        path (str): the local diffusers folder.
        scale (float): latent scaling. Defaults to 0.18215.
    """

    def __init__(self, path: str, scale: float = LATENT_SCALE) -> None:
        self.path, self.scale = path, scale

    @property
    def vae(self) -> torch.nn.Module:
        """The autoencoder on the CPU."""
        return load_vae(self.path)

    def on(self, device: torch.device | str) -> torch.nn.Module:
        """The autoencoder on ``device``."""
        return load_vae(self.path, str(torch.device(device)))

    @torch.no_grad()
    def encode(self, images: torch.Tensor, sample: bool = True,
               generator: torch.Generator | list[torch.Generator] | None = None) -> torch.Tensor:
        """DiT's ``vae.encode(x).latent_dist.sample() * 0.18215`` (``sample=False``: the mean); the sample's noise
        from ``generator``, one or one per image (diffusers' ``randn_tensor``), torch's by default."""
        vae = self.on(images.device)
        dist = vae.encode(images.to(vae.dtype)).latent_dist
        return (dist.sample(generator) if sample else dist.mean).float() * self.scale

    @torch.no_grad()
    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """``vae.decode(z / 0.18215).sample``: images in about [-1, 1]."""
        vae = self.on(latents.device)
        return vae.decode((latents / self.scale).to(vae.dtype)).sample.float()
