"""mmwf's diffusion transformers as a diffusers model, for diffusers' ``DiTPipeline`` and its schedulers.

:class:`MMWFTransformer2DModel` holds a :class:`~mmwf.models.diffusion.WeightFormerDiT` or
:class:`~mmwf.models.diffusion.DiT` (``denoiser``, state-dict keys ``denoiser.*``) and has the interface of
diffusers' ``DiTTransformer2DModel`` that ``DiTPipeline`` uses: ``config.sample_size`` / ``in_channels`` /
``out_channels`` and ``forward(hidden_states, timestep, class_labels).sample``; ``save_pretrained`` /
``from_pretrained`` write and read ``config.json`` and ``diffusion_pytorch_model.safetensors``.

    from diffusers import DiTPipeline, DPMSolverMultistepScheduler
    transformer = MMWFTransformer2DModel.from_denoiser(model.denoiser)   # a trained LatentDiffusion's
    pipe = DiTPipeline(transformer, vae, DPMSolverMultistepScheduler(num_train_timesteps=1000))
    images = pipe(class_labels=[207, 360], num_inference_steps=25).images
"""
from __future__ import annotations

import logging

import torch
from diffusers import ConfigMixin, ModelMixin
from diffusers.configuration_utils import register_to_config
from diffusers.models.modeling_outputs import Transformer2DModelOutput

from mmwf.registry import MODELS

FAMILIES = ('WeightFormerDiT', 'DiT')
PIPELINE_NULL = 1000  # DiTPipeline's label of the unconditional half of guidance, whatever the model's classes


class MMWFTransformer2DModel(ModelMixin, ConfigMixin):
    """A WF-DiT or DiT denoiser for diffusers.

    Args:
        denoiser_type (str): ``'WeightFormerDiT'`` or ``'DiT'``. Defaults to ``'WeightFormerDiT'``.
        arch (str | dict): the family's arch (``'S'``, ``'B'``, ... or a dict). Defaults to ``'S'``.
        patch_size (int): Defaults to 2.
        sample_size (int): latent side (the denoiser's ``input_size``). Defaults to 32.
        in_channels (int): latent channels. Defaults to 4.
        out_channels (int, optional): 2 x in_channels with a learned variance, else in_channels; given only to
            be checked (diffusers' config carries it). Defaults to None.
        num_classes (int): classes; label ``num_classes`` is the unconditional one (DiTPipeline uses 1000).
            Defaults to 1000.
        learn_sigma (bool): Defaults to True.
        mlp_ratio (float): Defaults to 4.0.
        class_dropout_prob (float): Defaults to 0.1.
        denoiser_kwargs (dict, optional): further arguments of the denoiser (e.g. WF-DiT's ``dynamic_blocks``).
            Defaults to None.
    """

    @register_to_config
    def __init__(self, denoiser_type: str = 'WeightFormerDiT', arch: str | dict = 'S', patch_size: int = 2,
                 sample_size: int = 32, in_channels: int = 4, out_channels: int | None = None,
                 num_classes: int = 1000, learn_sigma: bool = True, mlp_ratio: float = 4.0,
                 class_dropout_prob: float = 0.1, denoiser_kwargs: dict | None = None) -> None:
        super().__init__()
        if denoiser_type not in FAMILIES:
            raise ValueError(f'denoiser_type {denoiser_type!r} is not one of {FAMILIES}')
        expected = in_channels * 2 if learn_sigma else in_channels
        if out_channels is not None and out_channels != expected:
            raise ValueError(f'out_channels {out_channels} does not fit in_channels {in_channels} with learn_sigma='
                             f'{learn_sigma} ({expected})')
        self.register_to_config(out_channels=expected)
        self.denoiser = MODELS.build(dict(
            type=denoiser_type, arch=arch, patch_size=patch_size, input_size=sample_size, in_channels=in_channels,
            num_classes=num_classes, learn_sigma=learn_sigma, mlp_ratio=mlp_ratio,
            class_dropout_prob=class_dropout_prob, **(denoiser_kwargs or {})))

    @classmethod
    def from_pretrained(cls, *args, strict: bool = True, **kwargs):
        """diffusers' ``from_pretrained``, strict where diffusers is lenient (it leaves missing, unexpected and
        mis-shaped keys to a warning or to random weights): any of them is a ``CheckpointMismatchError`` naming the
        folder and the keys; ``strict=False`` loads what fits and logs the rest. ``DiTPipeline.from_pretrained``
        loads its transformer through this."""
        from mmengine.logging import print_log

        from mmwf.utils.checkpoint import CheckpointMismatchError
        wanted = kwargs.pop('output_loading_info', False)
        model, info = super().from_pretrained(*args, output_loading_info=True, **kwargs)
        faults = [f'{kind.replace("_", " ")} ({len(keys)}): {", ".join(map(str, keys[:8]))}'
                  for kind, keys in info.items() if keys]
        if faults and strict:
            source = args[0] if args else kwargs.get('pretrained_model_name_or_path')
            raise CheckpointMismatchError('\n'.join([
                f'{source} does not match {cls.__name__} as its config.json builds it:', *faults,
                'Save the model again with save_pretrained, or pass strict=False to load what fits on purpose '
                '(logged).']))
        if faults:
            print_log('\n'.join(['strict=False: loaded what fits; left out:', *faults]), logger='current',
                      level=logging.WARNING)
        return (model, info) if wanted else model

    @classmethod
    def from_denoiser(cls, denoiser: torch.nn.Module, **denoiser_kwargs) -> MMWFTransformer2DModel:
        """The diffusers model of a built (trained) denoiser, its weights copied, in eval mode;
        ``denoiser_kwargs``: further arguments of the denoiser (WF-DiT's ``dynamic_blocks`` is taken from it)."""
        name = type(denoiser).__name__
        if name not in FAMILIES:
            raise ValueError(f'{name} is not one of {FAMILIES}')
        blocks = denoiser.blocks
        arch = dict(hidden_size=denoiser.hidden_size, depth=len(blocks))
        if name == 'DiT':
            arch['num_heads'] = blocks[0].attn.num_heads
        mlp_ratio = (blocks[0].mlp.fc1.out_features if name == 'DiT' else blocks[0].linear2.in_features) / arch[
            'hidden_size']
        if name == 'WeightFormerDiT':
            denoiser_kwargs.setdefault('dynamic_blocks', sorted(denoiser.dynamic_ids))
        model = cls(name, arch, denoiser.patch_size, denoiser.input_size, denoiser.in_channels,
                    num_classes=denoiser.num_classes, learn_sigma=denoiser.learn_sigma, mlp_ratio=mlp_ratio,
                    class_dropout_prob=denoiser.y_embedder.dropout_prob, denoiser_kwargs=denoiser_kwargs or None)
        model.denoiser.load_state_dict(denoiser.state_dict())
        return model.eval()  # as from_pretrained returns it: no label dropout

    def forward(self, hidden_states: torch.Tensor, timestep: torch.Tensor | int, class_labels: torch.Tensor,
                return_dict: bool = True) -> Transformer2DModelOutput | tuple[torch.Tensor]:
        """hidden_states (B, C, H, W), timestep (B,) or one for all, class_labels (B,) -> ``sample``
        (B, out_channels, H, W). A label is one of the model's classes, or ``DiTPipeline``'s unconditional label
        1000 (:data:`PIPELINE_NULL`), which becomes this model's own (``num_classes``); any other label is an
        error naming it (an index past the classes would embed another class, or the unconditional one)."""
        t = torch.as_tensor(timestep, device=hidden_states.device)
        t = t.expand(len(hidden_states)) if t.dim() == 0 else t
        labels = torch.as_tensor(class_labels, device=hidden_states.device)
        classes = self.config.num_classes
        wrong = sorted({int(v) for v in labels.flatten().tolist() if not (0 <= v < classes or v == PIPELINE_NULL)})
        if wrong:
            raise ValueError(f'class labels {wrong} are not classes of this model ({classes}: 0 to {classes - 1}); '
                             f'{PIPELINE_NULL} is DiTPipeline\'s unconditional label')
        out = self.denoiser(hidden_states, t, labels.masked_fill(labels == PIPELINE_NULL, classes))
        return Transformer2DModelOutput(sample=out) if return_dict else (out,)
