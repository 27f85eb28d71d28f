"""The skeleton shared by mmwf's plain (single-scale, ViT-like) backbones.

A plain backbone is a patch-embedding stem, a stack of blocks on one token grid, and an optional final norm and
ImageNet head. :class:`PlainBackbone` holds all of that except what a family differs in: its extra stem
(:meth:`PlainBackbone.embed`), its blocks and its pooling for classification. As detectron2's ``vit.py`` /
``utils.py`` and timm's ``vision_transformer.py`` split the same pieces.

The same class has timm's model API (``forward_features``, ``forward_head``, ``forward_intermediates``,
``reset_classifier``, ``feature_info``, ...); :mod:`mmwf.models.frontends` makes it a timm and a Hugging Face hub
model.
"""
from __future__ import annotations

from collections import deque
from collections.abc import Sequence

import torch
import torch.nn as nn
from mmengine.logging import print_log
from mmengine.model import BaseModule

from mmwf.models.frontends.hub import HubModel
from mmwf.models.initializers import init_weights_pretrained_last
from mmwf.models.layers import PatchEmbed, build_token_norm, resolve_arch, run_blocks, tokens_to_map


def resolve_out_indices(out_indices: int | Sequence[int], depth: int, name: str) -> list[int]:
    """``out_indices`` as block indices in [0, depth) (negative ones count from the end); out of range is an
    error, not a silent wrap-around."""
    indices = [out_indices] if isinstance(out_indices, int) else list(out_indices)
    bad = [i for i in indices if not -depth <= i < depth]
    if bad:
        raise ValueError(f'out_indices {bad} out of range for a {name} of {depth} blocks: use 0..{depth - 1} '
                         f'(or -{depth}..-1 from the end)')
    return [i % depth for i in indices]


def take_indices(indices: int | Sequence[int] | None, depth: int, name: str) -> tuple[list[int], int]:
    """timm's block selection for ``forward_intermediates``: None, all blocks; an int n, the last n; a list, those
    blocks (negative from the end). Returns the sorted block indices and the largest."""
    if indices is None or isinstance(indices, int):
        n = depth if indices is None else indices
        if not 0 < n <= depth:
            raise ValueError(f'{name} has {depth} blocks: cannot take the last {n}')
        indices = range(depth - n, depth)
    taken = sorted(set(resolve_out_indices(list(indices), depth, name)))
    return taken, taken[-1]


def image_grid(x: torch.Tensor, stem: nn.Conv2d, min_grid: int, name: str) -> tuple[int, int]:
    """The patch grid (H/p, W/p) of images ``x`` (B, C, H, W) for a backbone whose stem is ``stem`` (a conv with
    kernel = stride = p); a clear error when the batch is not images the stem can take."""
    p = stem.stride[0]
    if x.dim() != 4 or x.shape[1] != stem.in_channels:
        raise ValueError(f'{name} needs images (B, {stem.in_channels}, H, W); got a tensor of shape '
                         f'{tuple(x.shape)}. Add the batch dimension or convert the images to '
                         f'{stem.in_channels} channels.')
    h, w = x.shape[-2] // p, x.shape[-1] // p
    if h < min_grid or w < min_grid:
        raise ValueError(f'{name} needs images with H, W >= {min_grid * p} ({min_grid} x {min_grid} patches of {p}); '
                         f'got shape {tuple(x.shape)}. Resize or pad the input.')
    dtype = stem.weight.dtype
    if x.dtype != dtype and not (x.is_floating_point() and torch.is_autocast_enabled(x.device.type)):
        raise ValueError(f'{name} has {dtype} weights but got {x.dtype} images. Normalise the images to floats '
                         f'of the weights\' dtype, or run under mixed precision (torch.autocast; in a config '
                         "optim_wrapper.type='AmpOptimWrapper') instead of casting the input.")
    return h, w


def refuse_a_load_without_weights(module: nn.Module, incompatible) -> None:
    """A load-state-dict post-hook of the backbones: a load that gave the backbone none of its tensors is a
    :class:`~mmwf.utils.CheckpointMismatchError`, whoever loaded it and however leniently (mmpretrain's
    ``get_model(pretrained=FILE)``, mmengine's ``load_checkpoint``): such a load leaves a random network behind a
    warning. Where the state dict holds the backbone's own keys at its root (a backbone or release file given to
    the model around it), the error gives the load that takes them."""
    from mmwf.utils.checkpoint import CheckpointMismatchError
    from mmwf.utils.checkpoint.strict import in_checked_load
    missing = set(incompatible.missing_keys)
    # mmwf's own loads name every mismatch themselves; a run's partial_load=True opts out, logged by StrictLoadHook
    if not missing or in_checked_load() or module.partial_load:
        return
    own = list(module.state_dict())
    first = own[0]
    prefixes = {k[:-len(first)] for k in missing if k == first or k.endswith('.' + first)}
    prefix = next((p for p in sorted(prefixes) if all(p + k in missing for k in own)), None)
    if not prefix:  # some of its tensors loaded, or the backbone itself loaded (torch's strictness applies)
        return
    where = f' (the model\'s {prefix[:-1]!r})'
    unexpected = list(incompatible.unexpected_keys)
    given = f'it holds {", ".join(unexpected[:4])}{" ..." if len(unexpected) > 4 else ""}' if unexpected else \
        'it holds nothing else either'
    lines = [f'{type(module).__name__}{where} was given none of its {len(own)} tensors ({given}); a lenient load '
             'would leave it random.']
    # the backbone's keys at the state dict's root (the unexpected ones: those under the wrapper's other modules,
    # e.g. a head named like the backbone's, are counted later, so most, not all)
    if 2 * len(set(own) & set(unexpected)) > len(own):
        lines.append(f'The state dict holds {type(module).__name__}\'s own keys at its root (a backbone or release '
                     f'file): load the file into the backbone, mmwf.utils.load_strict(model.{prefix[:-1]}, '
                     'mmwf.utils.load_state_dict_file(FILE), FILE), or give it as the backbone\'s '
                     "init_cfg=dict(type='Pretrained', checkpoint=FILE).")
    raise CheckpointMismatchError('\n'.join(lines))


class PlainBackbone(BaseModule, HubModel):
    """Stem, blocks on one token grid, final norm and ImageNet head; a family adds its stem extras, its blocks
    and its pooling.

    A Hugging Face hub model too (:class:`mmwf.models.frontends.HubModel`), and a timm model through the names each
    family registers (:mod:`mmwf.models.frontends.timm`).

    Args:
        arch (str | dict): a name of the family's ``ARCH_SETTINGS`` or a dict with exactly their keys
            (:func:`mmwf.models.layers.resolve_arch`).
        in_channels (int): image channels. Defaults to 3.
        patch_size (int): stem conv kernel and stride p. Defaults to 16.
        out_indices (int | Sequence[int]): blocks whose patch-token outputs :meth:`forward` returns (negative
            from the end). Defaults to -1.
        final_norm (bool): apply ``norm`` to the last block's output. Defaults to True.
        with_cp (bool): activation checkpointing of every block while training. Defaults to False.
        out_type (str): what :meth:`forward` returns: ``'featmap'``, the (B, C, H/p, W/p) maps of ``out_indices``
            (dense prediction); ``'logits'``, the ImageNet classifier's (B, num_classes) logits as a one-tuple
            (an mmpretrain ``ImageClassifier`` with a parameter-free ``ClsHead``; needs ``num_classes`` > 0, and
            released checkpoints load with their head); or ``'timm'``, timm's contract,
            ``forward_head(forward_features(x))`` (logits, or pooled features when ``num_classes`` is 0).
            Defaults to ``'featmap'``.
        init_cfg (dict | list[dict], optional): mmengine init config. ``Pretrained`` entries keep mmengine's
            contract (applied after the others; ``prefix`` with or without its dot; ``map_location``; local files,
            URLs and mmengine's named checkpoints) and load strictly
            (:class:`mmwf.models.initializers.StrictPretrained`): a whole detector / segmentor / classifier /
            distiller checkpoint gives its backbone's tensors. Defaults to None.
        norm_cfg (dict): the final norm's type (``layers.build_token_norm``; the family uses it in its blocks).
            Defaults to ``dict(type='LN')``.

    A subclass calls ``super().__init__`` (which builds ``patch_embed``), builds its own stem tensors and
    ``blocks``, then :meth:`init_head`; it implements :meth:`embed` and :meth:`pool`, and may extend
    :meth:`checkpoint_filter_fn` to convert another release's keys.
    """

    ARCH_SETTINGS: dict[str, dict] = {}
    MIN_GRID = 1  # smallest token grid side the blocks accept
    WEIGHTS_HINT = ''  # where to get the released weights, for the not-found error

    OUT_TYPES = ('featmap', 'logits', 'timm')

    def __init__(self, arch: str | dict, in_channels: int = 3, patch_size: int = 16,
                 out_indices: int | Sequence[int] = -1, final_norm: bool = True, with_cp: bool = False,
                 out_type: str = 'featmap', init_cfg: dict | list | None = None,
                 norm_cfg: dict = dict(type='LN')) -> None:
        super().__init__(init_cfg=init_cfg)
        self.register_load_state_dict_post_hook(refuse_a_load_without_weights)
        self.partial_load = False  # set by a run's partial_load=True (StrictLoadHook): loads may leave it untouched
        self.norm_cfg = norm_cfg
        name = type(self).__name__
        if out_type not in self.OUT_TYPES:
            raise ValueError(f'{name} out_type must be one of {self.OUT_TYPES}, got {out_type!r}')
        self.out_type = out_type
        self.arch = resolve_arch(arch, self.ARCH_SETTINGS, name)
        self.embed_dims, self.depth = self.arch['embed_dims'], self.arch['depth']
        self.patch_size, self.final_norm, self.with_cp, self.in_chans = patch_size, final_norm, with_cp, in_channels
        self.out_indices = resolve_out_indices(out_indices, self.depth, name)
        self.patch_embed = PatchEmbed(in_channels, self.embed_dims, patch_size)

    def init_linears(self) -> None:
        """timm's and the release's init of every nn.Linear: weights trunc_normal(std 0.02), biases zero."""
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.trunc_normal_(m.weight, std=0.02)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)

    def stem(self) -> list[nn.Module | nn.Parameter]:
        """What ``frozen_stages >= 0`` freezes before the blocks: the patch embedding (a family adds its stem
        extras)."""
        return [self.patch_embed]

    def freeze_stages(self, frozen_stages: int) -> None:
        """Freeze (no gradients, eval mode) the stem for ``frozen_stages`` >= 0, and blocks 0..frozen_stages-1
        (and ``norm`` when all of them are); -1 freezes nothing. Applied again by :meth:`train`."""
        self.frozen_stages = frozen_stages
        if frozen_stages < 0:
            return
        frozen = [*self.stem(), *self.blocks[:frozen_stages]]
        if frozen_stages >= self.depth:
            frozen.append(self.norm)
        for part in frozen:
            if isinstance(part, nn.Parameter):
                part.requires_grad = False
                continue
            part.eval()
            for p in part.parameters():
                p.requires_grad = False

    def train(self, mode: bool = True) -> PlainBackbone:
        super().train(mode)
        self.freeze_stages(getattr(self, 'frozen_stages', -1))
        return self

    def init_weights(self) -> None:
        """mmengine's ``init_weights`` with ``Pretrained`` (and ``SoftmaxTransfer``) entries applied last and
        strictly (:func:`mmwf.models.initializers.init_weights_pretrained_last`)."""
        init_weights_pretrained_last(self, super().init_weights)

    def init_head(self, num_classes: int, global_pool: str | None = None) -> None:
        """The final LayerNorm ``norm`` (when used), the pooling ``global_pool`` (None: the family's default) and,
        for ``num_classes > 0``, the ImageNet ``head`` (with ``out_type='timm'`` and no classes, an identity);
        timm's ``num_features``, ``head_hidden_size`` and ``feature_info`` (every block, stride p)."""
        if self.out_type == 'logits' and num_classes <= 0:
            raise ValueError(f"{type(self).__name__} with out_type='logits' needs num_classes > 0 (e.g. 1000)")
        self.num_features = self.head_hidden_size = self.embed_dims
        self.feature_info = [dict(module=f'blocks.{i}', num_chs=self.embed_dims, reduction=self.patch_size)
                             for i in range(self.depth)]
        with_norm = self.final_norm or num_classes
        self.norm = build_token_norm(self.norm_cfg, self.embed_dims) if with_norm else nn.Identity()
        self.set_pool(self.pools()[0] if global_pool is None else global_pool)
        self.set_head(num_classes)  # initialised with the family's other linears

    def set_pool(self, global_pool: str) -> None:
        """Pool by ``global_pool`` (one of :meth:`pools`, or ``''``: no pooling)."""
        if global_pool not in (*self.pools(), ''):
            raise ValueError(f'{type(self).__name__} global_pool must be one of {self.pools()} or \'\' (no '
                             f'pooling), got {global_pool!r}')
        self.global_pool = global_pool

    def set_head(self, num_classes: int) -> None:
        """A ``head`` for ``num_classes`` on the model's device and dtype, in its mode (PyTorch's default init);
        0: none, or an identity with ``out_type='timm'``."""
        self.num_classes = num_classes
        ref = self.patch_embed.proj.weight
        if num_classes > 0:
            self.head = nn.Linear(self.embed_dims, num_classes, device=ref.device, dtype=ref.dtype)
        else:
            self.head = nn.Identity() if self.out_type == 'timm' else None
        if self.head is not None:
            self.head.train(self.training)

    def record(self, **arguments) -> None:
        """Keep the constructor arguments the hub mixin saves (``config.json``) true to the model after a change
        made after construction."""
        if isinstance(self._hub_mixin_config, dict):
            self._hub_mixin_config.update(arguments)

    def reset_classifier(self, num_classes: int, global_pool: str | None = None) -> None:
        """timm's ``reset_classifier``: a new ``head`` for ``num_classes`` (trunc_normal(0.02) weights, zero bias;
        0: none, or an identity with ``out_type='timm'``) and the pooling ``global_pool`` (None keeps it)."""
        if global_pool is not None:
            self.set_pool(global_pool)
        self.set_head(num_classes)
        if isinstance(self.head, nn.Linear):
            nn.init.trunc_normal_(self.head.weight, std=0.02)
            nn.init.zeros_(self.head.bias)
        self.record(num_classes=num_classes, global_pool=self.global_pool)

    def get_classifier(self) -> nn.Module | None:
        """The ImageNet head (timm's API)."""
        return self.head

    def grid(self, x: torch.Tensor) -> tuple[int, int]:
        """Token grid (H/p, W/p) of an image batch, with a clear error for bad input."""
        return image_grid(x, self.patch_embed.proj, self.MIN_GRID, type(self).__name__)

    def embed(self, x: torch.Tensor, classify: bool) -> tuple[torch.Tensor, tuple[int, int], int]:
        """Images (B, C, H, W) -> tokens (B, prefix + H*W, C) entering the blocks, the grid, and the number of
        prefix (class) tokens; ``classify`` for :meth:`forward_features`."""
        raise NotImplementedError

    def features(self, x: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
        """The normed tokens (B, N, C) of grid ``hw`` as :meth:`forward_features` returns them: as they are (a
        family with another layout overrides this and :meth:`pool`)."""
        return x

    def pools(self) -> tuple[str, ...]:
        """The ``global_pool`` types this model takes, its default first (``''``, no pooling, always)."""
        return ('avg',)

    def pool(self, x: torch.Tensor) -> torch.Tensor:
        """:meth:`forward_features`'s output -> image features (B, C) by ``global_pool``."""
        raise NotImplementedError

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...] | torch.Tensor:
        """Images (B, C, H, W) -> tuple of (B, C', H/p, W/p) maps of the patch tokens, one per ``out_indices``
        (with ``out_type='logits'``, the one-tuple of classifier logits; with ``'timm'``, the logits)."""
        if self.out_type == 'timm':
            return self.forward_classifier(x)
        if self.out_type == 'logits':
            return (self.forward_classifier(x),)
        x, hw, prefix = self.embed(x, classify=False)
        feats = [self.norm(feat) if i == self.depth - 1 and self.final_norm else feat
                 for i, feat in run_blocks(self.blocks, x, hw, with_cp=self.with_cp) if i in self.out_indices]
        return tuple(tokens_to_map(f[:, prefix:] if prefix else f, hw).contiguous() for f in feats)

    def forward_classifier(self, x: torch.Tensor) -> torch.Tensor:
        """Images (B, C, H, W) -> ImageNet logits (B, num_classes): :meth:`forward_features` then
        :meth:`forward_head`."""
        if self.head is None:
            raise RuntimeError(f'this {type(self).__name__} has no classification head; build it with '
                               'num_classes=1000')
        return self.forward_head(self.forward_features(x))

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """Images (B, C, H, W) -> the last block's tokens after ``norm``, in the family's layout
        (:meth:`features`), with the class token where classification uses one (timm's ``forward_features``)."""
        x, hw, _ = self.embed(x, classify=True)
        _, x = deque(run_blocks(self.blocks, x, hw, with_cp=self.with_cp), maxlen=1)[0]  # the last output, none kept
        return self.features(self.norm(x), hw)

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        """:meth:`forward_features`'s output -> logits (B, num_classes): pooled by ``global_pool`` (``''``: not
        pooled), then ``head`` unless ``pre_logits`` (timm's ``forward_head``)."""
        x = self.pool(x) if self.global_pool else x
        return x if pre_logits or self.head is None else self.head(x)

    def forward_intermediates(self, x: torch.Tensor, indices: int | Sequence[int] | None = None, norm: bool = False,
                              stop_early: bool = False, output_fmt: str = 'NCHW', intermediates_only: bool = False
                              ) -> list[torch.Tensor] | tuple[torch.Tensor, list[torch.Tensor]]:
        """timm's ``forward_intermediates``: the patch tokens after the blocks ``indices`` (None: all; n: the last n;
        a list: those), as (B, C, H/p, W/p) maps (``output_fmt='NCHW'``) or (B, H/p, W/p, C) (``'NHWC'``), after
        ``norm`` when ``norm``; with them (unless ``intermediates_only``) the :meth:`forward_features` output of
        the last block run (``stop_early``: the last one taken)."""
        if output_fmt not in ('NCHW', 'NHWC'):
            raise ValueError(f"output_fmt must be 'NCHW' or 'NHWC', got {output_fmt!r}")
        taken, last = take_indices(indices, len(self.blocks), type(self).__name__)
        x, hw, prefix = self.embed(x, classify=True)
        blocks = self.blocks[:last + 1] if stop_early else self.blocks
        intermediates = []
        for i, out in run_blocks(blocks, x, hw, with_cp=self.with_cp):
            if i in taken:
                y = (self.norm(out) if norm else out)[:, prefix:]
                intermediates.append(tokens_to_map(y, hw).contiguous() if output_fmt == 'NCHW' else y.unflatten(1, hw))
        if intermediates_only:
            return intermediates
        return self.features(self.norm(out), hw), intermediates

    def prune_intermediate_layers(self, indices: int | Sequence[int] = 1, prune_norm: bool = False,
                                  prune_head: bool = True) -> list[int]:
        """Drop the blocks after the last of ``indices`` (and ``norm`` with ``prune_norm``, the head and pooling
        with ``prune_head``), as timm's feature wrapper does; returns the block indices taken."""
        taken, last = take_indices(indices, len(self.blocks), type(self).__name__)
        before = self.depth
        if last + 1 < before:  # the kept blocks' outputs stay as they were: no final norm on the new last one
            self.final_norm = False
        self.blocks = self.blocks[:last + 1]
        self.depth = len(self.blocks)
        self.arch = dict(self.arch, depth=self.depth)
        self.out_indices = [i for i in self.out_indices if i < self.depth] or [self.depth - 1]
        self.feature_info = self.feature_info[:self.depth]
        config = self._hub_mixin_config if isinstance(self._hub_mixin_config, dict) else {}
        kept = {key: [i % before for i in config[key] if i % before < self.depth]  # block lists, as absolute indices
                for key in ('dynamic_blocks', 'window_block_indexes') if isinstance(config.get(key), list)}
        self.record(arch=self.arch, out_indices=self.out_indices, final_norm=self.final_norm, **kept)
        if prune_norm:
            self.norm = nn.Identity()
        if prune_head:
            self.reset_classifier(0, '')
        return taken

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        """timm's switch for ``with_cp`` (activation checkpointing of every block while training)."""
        self.with_cp = enable

    def stem_names(self) -> list[str]:
        """The attribute names of :meth:`stem`'s modules and parameters."""
        parts = [*self.named_children(), *self.named_parameters(recurse=False)]
        return [name for name, part in parts if any(part is s for s in self.stem())]

    def group_matcher(self, coarse: bool = False) -> dict:
        """Parameter groups for timm's layer-wise lr decay and optimizer factory: the stem, each block, the final
        norm after them; the head is left to timm."""
        return dict(stem=rf'^(?:{"|".join(self.stem_names())})',
                    blocks=[(r'^blocks\.(\d+)', None), (r'^norm', (99999,))])

    def no_weight_decay(self) -> set[str]:
        """The stem's free parameters (a position table, a class token), which timm's optimizer factory leaves
        undecayed."""
        stem = self.stem_names()
        return {name for name, _ in self.named_parameters(recurse=False) if name in stem}

    def checkpoint_filter_fn(self, state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """A released checkpoint -> this model's keys: the tensors of modules this model was built without (a
        1000-class ``head`` in a dense backbone, ``norm`` with ``final_norm=False``, a class token) are dropped
        and logged. A family with other key names converts them here."""
        own = {k.split('.')[0] for k in self.state_dict()}
        skipped = [k for k in state_dict if k.split('.')[0] not in own]
        if skipped:
            print_log(f'{type(self).__name__}: skipped {len(skipped)} checkpoint tensors of modules this model omits: '
                      f'{", ".join(skipped[:5])}{" ..." if len(skipped) > 5 else ""}', logger='current')
        return {k: v for k, v in state_dict.items() if k.split('.')[0] in own}
