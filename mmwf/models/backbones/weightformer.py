"""WeightFormer: global visual modelling by dynamically predicted weights instead of attention.

He, Han and Huang, "Linear-Time Global Visual Modeling without Explicit Attention"; docs/weightformer.md. The
default settings reproduce the released ImageNet models exactly (checkpoint keys included); the paper's Table 1
strategy space is reachable through ``dynamic_linear``, ``dynamic_dwc``, ``dynamic_mlp`` and ``dynamic_blocks``.
The released models and the ImageNet variants of Tables 2 and 6 are timm models too (``weightformer_t``, ...;
:data:`TIMM_VARIANTS`).
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn as nn
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from timm.layers import DropPath
from timm.models import generate_default_cfgs

from mmwf.models.frontends import register_timm_models
from mmwf.models.layers import (
    StaticDWConv,
    StaticLinear,
    build_token_norm,
    dynamic_block_ids,
    ffn_widths,
    gelu_linear,
    map_to_tokens,
    swiglu,
)
from mmwf.models.layers.implementation import BlockFusion
from mmwf.registry import MODELS

from .base import PlainBackbone

__all__ = ['WeightFormer', 'WeightFormerBlock', 'TIMM_VARIANTS']  # and the timm entry points registered below


class WeightFormerBlock(nn.Module):
    """One block on tokens x (B, H*W, C) of grid ``hw``.

    Static (released): ``x = x + dwc(x)``; ``x = x + drop_path(drop(linear2(drop(act(linear1(norm2(x)))))))``.
    Dynamic (released): first ``x = norm1(x)`` (the stream itself is normalised, a release quirk), then the
    same with a dynamic ``dwc`` and/or dynamic ``linear1`` / ``linear2``. With ``ffn_type='swiglu'``, SwiGLU on
    ``linear1``'s packed [gate | up] output replaces ``act`` (``layers/ffn.py``). Without forward hooks
    (:class:`~mmwf.models.layers.implementation.BlockFusion`), the conv adds the shortcut in its own evaluation, the
    GELU MLP with a static ``linear2`` follows the blocks' memory rule (:func:`~mmwf.models.layers.gelu_linear`: GELU
    recomputed in the backward pass in training, in place at inference), and at inference the activation and the
    residual adds run in place on fresh branch outputs (saving 4C-wide buffers); with hooks every module's output
    stays as it returned it. Each layer picks its kernels itself
    (:func:`~mmwf.models.layers.implementation.choose_kernel`).

    Args:
        dim (int): channels C.
        mlp_ratio (float): hidden width of the MLP, in C.
        dwc (dict): config of the token mixer (a depthwise conv, static or dynamic).
        linear1 (dict): config of the MLP's first linear (static or dynamic).
        linear2 (dict): config of the MLP's second linear.
        norm_stream (bool): normalise the stream first (dynamic blocks of the release).
        drop (float): dropout in the MLP. Defaults to 0.
        drop_path (float): stochastic depth of the MLP branch. Defaults to 0.
        linear2_context (bool): a dynamic ``linear2`` predicts its update from the MLP's C-wide input
            ``norm2(x)``, not from its own 4C-wide input. Defaults to False.
        norm_cfg (dict): the token norms (``layers.build_token_norm``). Defaults to ``dict(type='LN')``.
        ffn_type (str): ``'mlp'`` (GELU, released) or ``'swiglu'``. Defaults to ``'mlp'``.
    """

    def __init__(self, dim: int, mlp_ratio: float, dwc: dict, linear1: dict, linear2: dict,
                 norm_stream: bool, drop: float = 0.0, drop_path: float = 0.0, linear2_context: bool = False,
                 norm_cfg: dict = dict(type='LN'), ffn_type: str = 'mlp') -> None:
        super().__init__()
        first, hidden = ffn_widths(dim, mlp_ratio, ffn_type)
        self.norm1 = build_token_norm(norm_cfg, dim) if norm_stream else nn.Identity()
        self.dwc = MODELS.build(dict(dwc, dim=dim))
        self.norm2 = build_token_norm(norm_cfg, dim)
        self.linear1 = MODELS.build(dict(linear1, in_features=dim, out_features=first))
        self.swiglu = ffn_type == 'swiglu'
        self.act = None if self.swiglu else nn.GELU()
        self.drop = nn.Dropout(drop)
        self.linear2_context = linear2_context
        context = dict(context_features=dim) if linear2_context else {}
        self.linear2 = MODELS.build(dict(linear2, in_features=hidden, out_features=dim, **context))
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        # the MLP's fused evaluations these modules allow, decided once: GELU in linear1's kernel (its epilogue), or
        # GELU recomputed in a static linear2's backward where nothing drops linear2's input
        self.gelu_in_linear1 = not self.swiglu and getattr(self.linear1, 'gelu_epilogue', False)
        self.gelu_in_linear2 = not self.swiglu and type(self.linear2) is StaticLinear and not drop

    def forward(self, x: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
        """The paper's block on tokens x (B, H*W, C): token mixing by the (dynamic) depthwise conv and channel mixing
        by the MLP of (dynamic) linears, each added to the stream, after ``norm1`` (dynamic blocks of the release).
        How the sums and the MLP are evaluated for this call is :class:`BlockFusion`'s."""
        fusion = BlockFusion.of(self)
        x = self.norm1(x)
        x = fusion.shortcut(self.dwc, x, hw)  # x + dwc(x)
        return fusion.add(self.drop_path(self.channel_mixer(self.norm2(x), hw, fusion)), x)  # x + mlp(norm2(x))

    def channel_mixer(self, z: torch.Tensor, hw: tuple[int, int], fusion: BlockFusion | None = None) -> torch.Tensor:
        """The MLP on its normalised input z (B, H*W, C), before stochastic depth and the residual:
        drop(linear2(drop(act(linear1(z))))), evaluated as ``fusion`` allows (None: each module as it is): GELU in
        linear1's own kernel (``gelu_in_linear1``: the Triton kernel's epilogue) at inference, GELU recomputed in
        linear2's backward (``gelu_in_linear2``: :func:`~mmwf.models.layers.gelu_linear`), activations in place at
        inference."""
        fusion = fusion or BlockFusion()
        context = (z,) if self.linear2_context else ()
        if fusion.inplace and self.gelu_in_linear1:
            return self.drop(self.linear2(self.drop(self.linear1(z, hw, gelu=True)), hw, *context))
        y = self.linear1(z, hw)
        if fusion.across and self.gelu_in_linear2:
            return gelu_linear(y, self.linear2, inplace=fusion.inplace)
        y = swiglu(y, fusion.inplace) if self.swiglu else torch.ops.aten.gelu_(y) if fusion.inplace else self.act(y)
        return self.drop(self.linear2(self.drop(y), hw, *context))


@MODELS.register_module()
class WeightFormer(PlainBackbone):
    """WeightFormer backbone (and ImageNet classifier when ``num_classes > 0``).

    Args:
        arch (str | dict): 't', 's', 'b', 't18' (Table 2's 18-block networks) or a dict with ``embed_dims``, ``depth``,
            ``mlp_ratio``. Defaults to 't'.
        in_channels (int): image channels. Defaults to 3.
        patch_size (int): stem conv kernel and stride. Defaults to 16.
        out_indices (int | Sequence[int]): blocks whose outputs are returned (negative from the end). Defaults
            to -1.
        final_norm (bool): apply the final LayerNorm ``norm`` to the last block's output. Defaults to True.
        drop_rate (float): dropout in the MLPs. Defaults to 0.
        drop_path_rate (float): stochastic depth, rising linearly over the blocks. Defaults to 0.
        dynamic_blocks (dict | Sequence[int]): which blocks are dynamic: ``dict(every=k, offset=o)`` (block i is
            dynamic when i % k == o) or a list of indices (``[]``: Table 2's static baseline CNN). Defaults to
            ``dict(every=3, offset=1)``, the release's blocks 1, 4, ..., 16.
        dynamic_linear (dict): the dynamic linear strategy (a ``type`` of ``layers.dynamic_linear``). Defaults to
            ``dict(type='BilateralDynamicLinear')`` (eq. 8, released).
        dynamic_dwc (dict, optional): the dynamic depthwise-conv strategy, or None for a static DWC in dynamic
            blocks. Defaults to ``dict(type='AdaptiveDynamicDWConv')`` (eq. 11, released).
        dynamic_mlp (str): which MLP linear is dynamic in dynamic blocks: 'first', 'second', 'both' or 'none'.
            Defaults to 'first' (released).
        linear2_context (str): what a dynamic second linear predicts its update from: ``'input'``, the MLP's
            C-wide input (the paper's Table 2 counts: Dynamic Linear 2 costs what Dynamic Linear 1 costs), or
            ``'hidden'``, its own 4C-wide input. Defaults to ``'input'``.
        frozen_stages (int): -1 freezes nothing; 0 the stem; i > 0 the stem and blocks 0..i-1 (and ``norm`` when
            i == depth). Defaults to -1.
        norm_cfg (dict): every norm: ``dict(type='LN')`` (released) or ``dict(type='RMSNorm')`` (the modern
            block), optionally with ``eps`` (1e-6). Defaults to ``dict(type='LN')``.
        ffn_type (str): the blocks' feed-forward: ``'mlp'`` (GELU, released) or ``'swiglu'`` (``layers/ffn.py``).
            Defaults to ``'mlp'``.
        with_cp (bool): activation checkpointing of every block while training. Defaults to False.
        num_classes (int): > 0 adds the ImageNet head (final norm, mean over tokens, Linear) for
            :meth:`forward_classifier`. Defaults to 0.
        global_pool (str, optional): the classifier's pooling, ``'avg'`` or ``''`` (none). Defaults to None
            (``'avg'``).
        out_type (str): ``'featmap'`` (dense maps), ``'logits'`` (classifier logits, for mmpretrain) or ``'timm'``
            (timm's contract). Defaults to ``'featmap'``.
        init_cfg (dict | list[dict], optional): ``dict(type='Pretrained', checkpoint=PATH)`` loads a released or
            mmwf checkpoint strictly. Defaults to None.

    Input (B, in_channels, H, W) with H, W >= 2 * patch_size; outputs a tuple of (B, C, H/p, W/p) maps
    (floor division), one per ``out_indices``. :meth:`forward_features` gives timm's (B, H/p, W/p, C) map
    (``output_fmt`` 'NHWC', as timm's Swin), which ``global_pool='avg'`` averages.
    """

    ARCH_SETTINGS = {
        't': dict(embed_dims=192, depth=17, mlp_ratio=4),
        't18': dict(embed_dims=192, depth=18, mlp_ratio=4),  # Table 2's networks: one more static block
        's': dict(embed_dims=384, depth=17, mlp_ratio=4),
        'b': dict(embed_dims=384, depth=17, mlp_ratio=4),  # WeightFormer-S trained and run at 448 x 448
    }
    MIN_GRID = 2
    output_fmt = 'NHWC'
    WEIGHTS_HINT = ('Released ImageNet weights: model.safetensors of the Hugging Face models '
                    'RuizeHe/weightformer-{t,s,b}, or the training checkpoints linked from the LeapLabTHU/WeightFormer '
                    'repository (clean those with tools/model_converters/clean_checkpoint.py).')

    def __init__(self,
                 arch: str | dict = 't',
                 in_channels: int = 3,
                 patch_size: int = 16,
                 out_indices: int | Sequence[int] = -1,
                 final_norm: bool = True,
                 drop_rate: float = 0.0,
                 drop_path_rate: float = 0.0,
                 dynamic_blocks: dict | Sequence[int] = dict(every=3, offset=1),
                 dynamic_linear: dict = dict(type='BilateralDynamicLinear'),
                 dynamic_dwc: dict | None = dict(type='AdaptiveDynamicDWConv'),
                 dynamic_mlp: str = 'first',
                 linear2_context: str = 'input',
                 frozen_stages: int = -1,
                 norm_cfg: dict = dict(type='LN'),
                 ffn_type: str = 'mlp',
                 with_cp: bool = False,
                 num_classes: int = 0,
                 global_pool: str | None = None,
                 out_type: str = 'featmap',
                 init_cfg: dict | list | None = None) -> None:
        super().__init__(arch, in_channels, patch_size, out_indices, final_norm, with_cp, out_type, init_cfg,
                         norm_cfg)
        self.dynamic_ids = dynamic_block_ids(dynamic_blocks, self.depth)
        if dynamic_mlp not in ('first', 'second', 'both', 'none'):
            raise ValueError(f"dynamic_mlp must be 'first', 'second', 'both' or 'none', got {dynamic_mlp!r}")
        if linear2_context not in ('input', 'hidden'):
            raise ValueError(f"linear2_context must be 'input' or 'hidden', got {linear2_context!r}")
        self.init_norm = build_token_norm(norm_cfg, self.embed_dims)
        static_linear, static_dwc = dict(type=StaticLinear), dict(type=StaticDWConv)
        dpr = torch.linspace(0, drop_path_rate, self.depth, device='cpu').tolist()
        blocks = []
        for i in range(self.depth):
            dyn = i in self.dynamic_ids
            blocks.append(WeightFormerBlock(
                self.embed_dims, self.arch['mlp_ratio'],
                dwc=dynamic_dwc if dyn and dynamic_dwc is not None else static_dwc,
                linear1=dynamic_linear if dyn and dynamic_mlp in ('first', 'both') else static_linear,
                linear2=dynamic_linear if dyn and dynamic_mlp in ('second', 'both') else static_linear,
                norm_stream=dyn, drop=drop_rate, drop_path=dpr[i],
                linear2_context=dyn and dynamic_mlp in ('second', 'both') and linear2_context == 'input',
                norm_cfg=norm_cfg, ffn_type=ffn_type))
        self.blocks = nn.ModuleList(blocks)
        self.init_head(num_classes, global_pool)
        self._init_released()
        self.freeze_stages(frozen_stages)

    # the arguments of the release's hub models (model/hub_models.py), which their config.json records
    RELEASE_HUB_KEYS = frozenset({'img_size', 'patch_size', 'in_chans', 'num_classes', 'embed_dim', 'depth',
                                  'mlp_ratio', 'qkv_bias', 'representation_size', 'distilled', 'drop_rate',
                                  'attn_drop_rate', 'drop_path_rate'})

    @classmethod
    def hub_arguments(cls, config: dict) -> dict:
        """A ``config.json`` of ours as it is; one of the release's hub repositories (``RuizeHe/weightformer-t``,
        ...) as the classifier it describes, whose forward gives the logits as the release's does
        (``out_type='timm'``; pass ``out_type='featmap'`` and ``num_classes=0`` for a dense backbone)."""
        if 'embed_dim' not in config:
            return super().hub_arguments(config)
        unknown = sorted(set(config) - cls.RELEASE_HUB_KEYS)
        if unknown or config.get('distilled') or config.get('representation_size'):
            raise ValueError(f'WeightFormer.from_pretrained: config.json looks like the release\'s but has '
                             f'{unknown or "a distillation token or a representation layer"}, which WeightFormer '
                             'does not have')
        num_classes = config.get('num_classes', 1000)
        return dict(arch=dict(embed_dims=config['embed_dim'], depth=config['depth'], mlp_ratio=config['mlp_ratio']),
                    patch_size=config.get('patch_size', 16), in_channels=config.get('in_chans', 3),
                    num_classes=num_classes, drop_rate=config.get('drop_rate', 0.0),
                    drop_path_rate=config.get('drop_path_rate', 0.0), out_type='timm' if num_classes else 'featmap')

    def _init_released(self) -> None:
        """The release's init: Linear trunc_normal(0.02) with zero bias, LayerNorm (1, 0), convs and the
        dynamic layers' raw parameters as their modules set them."""
        self.init_linears()
        for m in self.modules():
            if isinstance(m, nn.LayerNorm):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)

    def stem(self) -> list[nn.Module | nn.Parameter]:
        return [self.patch_embed, self.init_norm]

    def embed(self, x: torch.Tensor, classify: bool) -> tuple[torch.Tensor, tuple[int, int], int]:
        """Images -> normalised patch tokens (B, H*W, C) (stem: patch conv, ``init_norm``), no prefix token."""
        hw = self.grid(x)
        return self.init_norm(map_to_tokens(self.patch_embed(x))), hw, 0

    def features(self, x: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
        """Normed tokens (B, H*W, C) -> the (B, H, W, C) map (a view)."""
        return x.unflatten(1, hw)

    def pool(self, x: torch.Tensor) -> torch.Tensor:
        """(B, H, W, C) -> the mean over the tokens (B, C), as the release's mean over its token axis."""
        return x.flatten(1, 2).mean(1)


def _cfg(**kwargs) -> dict:
    """A WeightFormer ``pretrained_cfg``: the release's evaluation (bicubic square resize to 256 / 224 of the input,
    centre crop, ImageNet mean and std; its data/build.py), any input of at least 2 x 2 patches."""
    return dict(dict(num_classes=1000, input_size=(3, 224, 224), pool_size=(14, 14), min_input_size=(3, 32, 32),
                     crop_pct=0.875, crop_mode='squash', interpolation='bicubic', mean=IMAGENET_DEFAULT_MEAN,
                     std=IMAGENET_DEFAULT_STD, first_conv='patch_embed.proj', classifier='head', license='mit',
                     paper_ids='arXiv:2605.01711', origin_url='https://github.com/LeapLabTHU/WeightFormer'), **kwargs)


# timm names: the released models, then the ImageNet variants of Table 2 (t18: 18 blocks) and Table 6 (how many
# blocks are dynamic), each named after its config (configs/imagenet/<name with - for _>_in1k.py)
_T18 = dict(arch='t18', dynamic_dwc=None)  # Table 2's networks with a static DWConv in the dynamic blocks
TIMM_VARIANTS = {
    'weightformer_t': dict(arch='t'),
    'weightformer_s': dict(arch='s'),
    'weightformer_b': dict(arch='b'),
    'weightformer_t_static': dict(arch='t18', dynamic_blocks=[]),
    'weightformer_t_dyn_linear1_dwc': dict(arch='t18'),
    'weightformer_t_dyn_linear1': _T18,
    'weightformer_t_dyn_linear2': dict(_T18, dynamic_mlp='second'),
    'weightformer_t_dyn_linear12': dict(_T18, dynamic_mlp='both'),
    'weightformer_t_dyn_dwc': dict(arch='t18', dynamic_mlp='none'),
    'weightformer_t_dwc_gap': dict(arch='t18', dynamic_mlp='none', dynamic_dwc=dict(type='GAPDynamicDWConv')),
    'weightformer_t_dwc_conv': dict(arch='t18', dynamic_mlp='none', dynamic_dwc=dict(type='ConvDynamicDWConv')),
    'weightformer_t_dwc_ampdir': dict(arch='t18', dynamic_mlp='none', dynamic_dwc=dict(type='AmpDirDynamicDWConv')),
    'weightformer_t_linear_gap': dict(_T18, dynamic_linear=dict(type='GAPDynamicLinear')),
    'weightformer_t_linear_linear': dict(_T18, dynamic_linear=dict(type='LinearDynamicLinear')),
    'weightformer_t_linear_linear_nopool': dict(_T18, dynamic_linear=dict(type='LinearDynamicLinear', pool=False)),
    'weightformer_t_linear_nonlinear': dict(_T18, dynamic_linear=dict(type='NonlinearDynamicLinear')),
    'weightformer_t_linear_deep': dict(_T18, dynamic_linear=dict(type='DeepDynamicLinear')),
    'weightformer_t_dynamic_4': dict(arch='t', dynamic_blocks=dict(every=4, offset=1)),
    'weightformer_t_dynamic_8': dict(arch='t', dynamic_blocks=dict(every=2, offset=1)),
    'weightformer_t_dynamic_11': dict(arch='t', dynamic_blocks=[i for i in range(17) if i % 3]),
    'weightformer_t_dynamic_14': dict(arch='t', dynamic_blocks=[i for i in range(17) if i % 6]),
    'weightformer_t_dynamic_17': dict(arch='t', dynamic_blocks=dict(every=1, offset=0)),
}

# the release's ImageNet weights on the Hugging Face hub (model/hub_models.py; model.safetensors, release keys)
default_cfgs = generate_default_cfgs({
    **{f'weightformer_{size}.in1k': _cfg(hf_hub_id=f'RuizeHe/weightformer-{size}') for size in 'ts'},
    'weightformer_b.in1k': _cfg(hf_hub_id='RuizeHe/weightformer-b', input_size=(3, 448, 448), pool_size=(28, 28)),
    **{name: _cfg() for name in TIMM_VARIANTS if name not in ('weightformer_t', 'weightformer_s', 'weightformer_b')},
})


register_timm_models(WeightFormer, TIMM_VARIANTS, globals())
