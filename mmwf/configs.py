"""mmwf's configs as package data, and their export as self-contained files (what ``mim download --config`` does).

The package carries every config in OpenMMLab's layout, ``mmwf/.mim/configs`` (in a source checkout a link to the
repository's ``configs/``; in a wheel a copy). A config is named by its file name without ``.py``
(``cascade_wf_t_coco``, ``weightformer_t_in1k``, ...); exporting writes it with every ``_base_`` resolved, so a
project's own config can inherit it with ``_base_ = './NAME.py'``:

    python -m mmwf.configs --list
    python -m mmwf.configs cascade_wf_t_coco upernet_wf_t_ade20k --dest configs/
"""
from __future__ import annotations

import argparse
import difflib
from pathlib import Path
from typing import NamedTuple

import torch.nn as nn
from mmengine.config import Config, ConfigDict

CONFIG_ROOT = Path(__file__).resolve().parent / '.mim' / 'configs'
MODEL_INDEX = CONFIG_ROOT.parent / 'model-index.yml'


def config_files() -> dict[str, Path]:
    """Every config the package carries (``_base_`` folders excluded), by name."""
    if not CONFIG_ROOT.is_dir():
        raise FileNotFoundError(f'{CONFIG_ROOT} is missing: this mmwf install carries no configs; reinstall it '
                                '(pip install mmwf, or pip install -e . in a checkout)')
    files = {}
    for path in sorted(CONFIG_ROOT.rglob('*.py')):
        if '_base_' in path.relative_to(CONFIG_ROOT).parts:
            continue
        if path.stem in files:
            raise RuntimeError(f'two configs are named {path.stem}: {files[path.stem]} and {path}')
        files[path.stem] = path
    return files


def config_file(name: str) -> Path:
    """The file of config ``name`` (a name from ``--list``; a trailing ``.py`` is accepted)."""
    files = config_files()
    name = name.removesuffix('.py')
    if name not in files:
        close = difflib.get_close_matches(name, files, n=3)
        hint = f'did you mean {", ".join(close)}? ' if close else ''
        raise ValueError(f'no mmwf config named {name!r}; {hint}`python -m mmwf.configs --list` lists them')
    return files[name]


def metafile_models() -> dict[str, dict]:
    """Every model of the metafiles ``model-index.yml`` imports, by config name: the one home of each config's
    counts and of the paper's figures (``Metadata``: ``Input``, ``Parameters (M)``, ``GFLOPs``, ``Paper Parameters
    (M)``, ``Paper GFLOPs``, ...; ``Results`` with their ``Results Source``)."""
    import yaml
    models = {}
    for metafile in yaml.safe_load(MODEL_INDEX.read_text())['Import']:
        for model in yaml.safe_load((MODEL_INDEX.parent / metafile).read_text())['Models']:
            if model['Name'] in models:
                raise RuntimeError(f'{model["Name"]} is listed twice in the metafiles ({metafile})')
            models[model['Name']] = model
    return models


def paper_counts(name: str) -> dict[str, float]:
    """The paper's figures for config ``name`` as the paper prints them, by the metafile key they sit beside
    (``'Parameters (M)'``, ``'GFLOPs'``, ``'GFLOPs (backbone+neck)'``, ``'GFLOPs (no mask head)'``); empty if none.
    They hold at the metafile's ``Input``."""
    meta = metafile_models().get(name, {}).get('Metadata', {})
    return {k.removeprefix('Paper '): v for k, v in meta.items() if k.startswith('Paper ') and k != 'Paper Differences'}


# The fields an image size reaches that list their sides as (w, h), cv2's order, by the scope of the registry that
# builds the transform ('*': mmcv's transforms, which mmdet, mmseg and mmpretrain build or subclass in that order);
# every other field lists (h, w), as image_size does. mmdet's RandomCrop takes (w, h) with crop_type 'absolute' only:
# 'absolute_range' takes one (min, max) range for both sides, so it follows square sizes alone.
WIDTH_FIRST = {('*', 'Resize', 'scale'), ('*', 'RandomResize', 'scale'), ('*', 'CenterCrop', 'crop_size'),
               ('*', 'Pad', 'size'), ('mmdet', 'RandomCrop', 'crop_size'), ('mmdet', 'Mosaic', 'img_scale'),
               ('mmdet', 'CachedMosaic', 'img_scale'), ('mmdet', 'MixUp', 'img_scale'),
               ('mmdet', 'CachedMixUp', 'img_scale'), ('mmdet', 'RandomCenterCropPad', 'crop_size')}
# the keys of a transform that hold transforms (RandomApply, Compose, KeyMapper: a list; RandomChoice, TestTimeAug,
# mmdet's AutoAugment: a list of lists), and those of a dataset that hold datasets (RepeatDataset,
# ClassBalancedDataset, MultiImageMixDataset: one; ConcatDataset: a list)
NESTED_TRANSFORMS = ('transforms', 'policies')
NESTED_DATASETS = ('dataset', 'datasets')
FOLLOWED_KEY = '_followed'  # in image_size_fields: what load_tool_config followed, for the runner's log


class FollowedField(NamedTuple):
    """A field :func:`follow_image_size` reached: where (``path``), the value it held (``old``) and the one the new
    image size gives (``new``). ``written``, what the factors give at the size the fields were written for, is set
    only where ``old`` was kept: it differs from ``written``, so a child config or an option set it explicitly."""
    path: str
    old: object
    new: object
    written: object = None

    @property
    def kept(self) -> bool:
        return self.written is not None

    def __str__(self) -> str:
        if not self.kept:
            return f'{self.path}: {self.old!r} -> {self.new!r}'
        return (f'{self.path}: {self.old!r} kept, set explicitly (image_size_fields gives {self.written!r} at the size '
                f'the config was written for, {self.new!r} at image_size); remove the setting to follow image_size')


class _Target(NamedTuple):
    """A place a declared field reaches: its path in the config, the dict holding it and its key there, and the order
    of the sides its value lists: 'hw', 'wh', or 'square' (a transform that cannot take a non-square size)."""
    path: str
    container: dict
    key: str
    order: str


def _scope_of(transform, scope: str | None) -> str | None:
    """The scope whose registry builds ``transform``: its ``scope.Type`` prefix, its ``_scope_``, else ``scope``."""
    type_ = str(transform.get('type', ''))
    return type_.partition('.')[0] if '.' in type_ else transform.get('_scope_', scope)


def _transforms(pipeline: list | dict, path: str, scope: str | None):
    """(path, transform, scope) of every transform of ``pipeline`` (a list, or one transform), those nested in a
    transform's ``transforms`` or ``policies`` (RandomChoice, RandomApply, TestTimeAug, AutoAugment) included; a
    nested one takes its wrapper's scope."""
    items = [(path, pipeline)] if hasattr(pipeline, 'get') else [(f'{path}[{i}]', t) for i, t in enumerate(pipeline)]
    for here, item in items:
        if isinstance(item, (list, tuple)):
            yield from _transforms(item, here, scope)
        elif hasattr(item, 'get'):
            own = _scope_of(item, scope)
            yield here, item, own
            for key in NESTED_TRANSFORMS:
                if isinstance(item.get(key), (list, tuple)) or hasattr(item.get(key), 'get'):
                    yield from _transforms(item[key], f'{here}.{key}', own)


def _dataset_pipelines(dataset, path: str):
    """(path, pipeline) of ``dataset`` and of every dataset it wraps (``dataset``, ``datasets``)."""
    if not hasattr(dataset, 'get'):
        return
    if isinstance(dataset.get('pipeline'), list):
        yield f'{path}.pipeline', dataset['pipeline']
    for key in NESTED_DATASETS:
        inner = dataset.get(key)
        if hasattr(inner, 'get'):
            yield from _dataset_pipelines(inner, f'{path}.{key}')
        elif isinstance(inner, (list, tuple)):
            for i, each in enumerate(inner):
                yield from _dataset_pipelines(each, f'{path}.{key}[{i}]')


def _pipelines(cfg: Config | ConfigDict):
    """(path, pipeline) of every pipeline of a config: its top-level ``*pipeline`` lists and the ``pipeline`` of each
    dataloader's dataset and of the datasets it wraps."""
    for key, value in cfg.items():
        if key.endswith('pipeline') and isinstance(value, list):
            yield key, value
        elif key.endswith('_dataloader') and hasattr(value, 'get'):
            yield from _dataset_pipelines(value.get('dataset'), f'{key}.dataset')


def _order(transform, scope: str | None, key: str) -> str:
    """The order of the sides ``transform``'s field ``key`` lists (:data:`WIDTH_FIRST`)."""
    type_ = str(transform.get('type', '')).rpartition('.')[2]
    if (scope, type_, key) == ('mmdet', 'RandomCrop', 'crop_size') and transform.get('crop_type',
                                                                                    'absolute') != 'absolute':
        return 'square'
    return 'wh' if {(scope, type_, key), ('*', type_, key)} & WIDTH_FIRST else 'hw'


def _field_targets(node, keys: list[str], path: str = '', scope: str | None = None,
                   transform=None) -> list[_Target]:
    """Every place ``keys`` reach from ``node``: a key ``name[Type]`` is the list under ``name`` narrowed to its
    transforms of that ``type``, nested ones included (a pipeline); ``pipelines[Type]`` those of every pipeline of the
    config. A key the node lacks reaches nothing (a child config without the field, e.g. a whole-image test instead of
    a sliding one)."""
    key, rest = keys[0], keys[1:]
    name, _, type_ = key.partition('[')
    type_ = type_.rstrip(']')
    if not type_:
        if not hasattr(node, 'keys') or name not in node:
            return []
        here = f'{path}.{name}'.lstrip('.')
        if rest:
            return _field_targets(node[name], rest, here, scope)
        order = _order(transform, scope, name) if transform is not None else 'hw'
        return [_Target(here, node, name, order)]
    if not rest:
        raise ValueError(f'image_size_fields: {".".join(keys)} names transforms, not a field of them: add the '
                         "field, e.g. 'pipelines[Resize].scale'")
    if not path and name == 'pipelines':
        pipelines = list(_pipelines(node))
    elif hasattr(node, 'keys') and isinstance(node.get(name), list):
        pipelines = [(f'{path}.{name}'.lstrip('.'), node[name])]
    else:
        return []
    return [hit for where, pipeline in pipelines for at, t, own in _transforms(pipeline, where, scope)
            if str(t.get('type', '')).rpartition('.')[2] == type_
            for hit in _field_targets(t, rest, at, own, t if len(rest) == 1 else None)]


def _changed_size(cfg: Config | ConfigDict) -> tuple[int, int] | None:
    """``cfg.image_size`` as (H, W) where it is not the size the declared ``image_size_fields`` hold, else None."""
    size = cfg.get('image_size')
    if size is None:
        return None
    size = _pair(size)
    if len(size) != 2 or not all(isinstance(v, int) and v > 0 for v in size):
        raise ValueError(f'image_size={cfg.image_size!r}: give H, W (positive ints) or one int for a square')
    declared = cfg.get('image_size_fields')
    if declared is None:
        return None
    if declared.get('written_for') is None:
        source = getattr(cfg, 'filename', None) or 'the config'
        raise ValueError(f'image_size_fields of {source} has no written_for: give the size its fields hold, '
                         "e.g. image_size_fields = dict(written_for=image_size, fields={...})")
    return None if size == _pair(declared['written_for']) else size


def _pair(size: int | tuple | list) -> tuple:
    """An image size as (H, W): one int is a square."""
    return (size, size) if isinstance(size, int) else tuple(size)


def _size_value(factors, size: tuple[int, int], order: str, held):
    """The value of a field with ``factors`` at ``size`` (H, W), each rounded down (past the float error of a factor
    such as 256 / 224): one factor is of H alone (a count, e.g. a pad divisor); two are of the field's sides in the
    order it lists them, (h, w) or (w, h). A field holding one int keeps one int where the value is square."""
    if isinstance(factors, (int, float)):
        return int(factors * size[0] + 1e-6)
    sides = size[::-1] if order == 'wh' else size
    value = tuple(int(f * side + 1e-6) for f, side in zip(factors, sides))
    return value[0] if isinstance(held, int) and len(set(value)) == 1 else value


def _same(held, value) -> bool:
    """Whether a field's value is ``value``: a list is its tuple, one int a square pair."""
    def norm(v):
        return tuple(v) if isinstance(v, (list, tuple)) else v
    held, value = norm(held), norm(value)
    if isinstance(held, int) and isinstance(value, tuple):
        held = (held,) * len(value)
    return held == value


def unfollowed_image_size(cfg: Config | ConfigDict) -> str | None:
    """What is wrong with a config whose ``image_size`` is not the size its declared fields hold (the tool that read
    it did not call :func:`follow_image_size` after a child config or an option changed the size), else None."""
    size = _changed_size(cfg)
    if size is None:
        return None
    return (f'image_size={size}, but the crops, pads and test scales of image_size_fields still hold '
            f'{_pair(cfg.image_size_fields.written_for)}: the tool that read this config did not apply the new size '
            "(mmengine resolves a config's variables when it reads the file). Run it with mmwf's tools, keep the "
            "config's runner_type='ImageSizeRunner' for another project's tools that build it, give a tool that does "
            "not (mmseg's test.py) the config a run wrote into its work folder, or call "
            'mmwf.configs.follow_image_size(cfg) before building the runner.')


def check_image_size_option(cfg: Config | ConfigDict, options: dict, source: str) -> None:
    """Refuse an ``image_size`` override (``--cfg-options image_size=S``) that nothing in the config ``source``
    follows: one without ``image_size_fields`` keeps the sizes its pipelines and model were written with, so the
    option would change nothing the run uses."""
    if 'image_size' not in (options or {}) or cfg.get('image_size_fields'):
        return
    held = f'its image_size ({cfg.image_size}) is' if 'image_size' in cfg else 'it has no image_size:'
    raise ValueError(f'--cfg-options image_size={options["image_size"]}: nothing in {source} follows it ({held} '
                     'not declared in image_size_fields), so its pipelines and model would keep their sizes. Set '
                     'those fields in a child config, or start from a config that follows image_size (the Cascade and '
                     'UperNet configs, the ImageNet classifiers and their demos: python -m mmwf.configs --list)')


def follow_image_size(cfg: Config | ConfigDict) -> list[FollowedField]:
    """Set what depends on the image size from ``cfg.image_size`` where a child config or ``--cfg-options
    image_size=S`` changed it (mmengine resolves a config's variables when it reads the file, so its crops, pads and
    test scales keep the size they were written with). A config declares them in ``image_size_fields``:
    ``written_for`` (the size its fields hold) and ``fields``, a dotted path -> its factors. ``name[Type]`` in a path
    picks the transforms of that type in the list ``name``, nested ones included (RandomChoice, RandomApply,
    TestTimeAug); ``pipelines[Type]``, those of every pipeline: the top-level ones and each dataloader's, through
    dataset wrappers. Two factors are of the field's sides in the order it lists them ((h, w); (w, h) for the
    transforms of :data:`WIDTH_FIRST`, mmcv's Resize among them), e.g. ``'model.test_cfg.stride': (2 / 3, 2 / 3)``;
    one factor is of H alone (a pad divisor). A value is the product rounded down.

    A field that does not hold what its factors give at ``written_for`` was set explicitly (an option, or a child
    config's own pipeline): it is kept, as mmengine keeps the last value given, and reported. Returns what it did,
    ``image_size`` first (:class:`FollowedField`: its ``str`` is the log line); nothing where the size is unchanged
    or the config declares no fields. A transform that cannot take a non-square size is refused by name."""
    size = _changed_size(cfg)
    if size is None:
        return []
    declared = cfg.image_size_fields
    written = _pair(declared.written_for)
    followed, plan, seen = [FollowedField('image_size', written, size)], [], set()
    for path, factors in declared.get('fields', {}).items():
        for target in _field_targets(cfg, path.split('.'), scope=cfg.get('default_scope')):
            if (id(target.container), target.key) in seen:  # one dict reached twice (a pipeline two loaders share)
                continue
            seen.add((id(target.container), target.key))
            held = target.container[target.key]
            new = _size_value(factors, size, target.order, held)
            if _same(held, new):
                continue
            before = _size_value(factors, written, target.order, held)
            if not _same(held, before):
                followed.append(FollowedField(target.path, held, new, before))
                continue
            if target.order == 'square' and size[0] != size[1]:
                raise ValueError(
                    f'image_size={size} reaches {target.path} ({path} in image_size_fields), a RandomCrop whose '
                    f"crop_type={target.container.get('crop_type')!r} takes one (min, max) range for both sides, "
                    "so it crops squares only: give a square image_size, or set that transform's "
                    "crop_type='absolute' in a child config (its crop_size is then (w, h))")
            plan.append((target, new))
            followed.append(FollowedField(target.path, held, new))
    for target, new in plan:
        target.container[target.key] = new
    cfg.image_size = size
    declared.written_for = size
    return followed


def record_followed(cfg: Config | ConfigDict, followed: list[FollowedField]) -> None:
    """Keep on ``cfg`` what :func:`follow_image_size` did, for the runner built from it to log
    (:func:`take_followed`): a tool that loads a config follows its size before the runner, and its log, exist."""
    if followed:
        cfg.image_size_fields[FOLLOWED_KEY] = [*cfg.image_size_fields.get(FOLLOWED_KEY, []), *map(list, followed)]


def take_followed(cfg: Config | ConfigDict) -> list[FollowedField]:
    """What :func:`record_followed` kept on ``cfg``, removed from it (so that the config a run writes holds none)."""
    fields = cfg.get('image_size_fields')
    return [FollowedField(*item) for item in (fields.pop(FOLLOWED_KEY, []) if fields else [])]


class FormattedOnceConfig(Config):
    """mmengine's ``Config`` that formats its ``pretty_text`` once for each content. A runner asks for the text seven
    times in a short run (its log, the dumped config, the visualizer, the message hub, each checkpoint's meta), and
    yapf takes about 0.5 s a time for a Cascade config on one core. The text is mmengine's own; it is formatted
    again whenever the dict (its ``repr``), the file name or the format flag changed since."""

    @property
    def pretty_text(self) -> str:
        key = (self.filename, self._format_python_code, repr(self._cfg_dict))
        held = self.__dict__.get('_pretty_text_held')
        if held is None or held[0] != key:
            held = (key, Config.pretty_text.fget(self))
            object.__setattr__(self, '_pretty_text_held', held)  # Config's own __setattr__ writes into the dict
        return held[1]


def formatted_once(cfg: Config | ConfigDict | dict) -> FormattedOnceConfig:
    """``cfg`` as a :class:`FormattedOnceConfig` holding the same dict, file name, text and variables (a plain dict is
    wrapped as ``Config(cfg)`` would)."""
    if isinstance(cfg, FormattedOnceConfig):
        return cfg
    out = FormattedOnceConfig.__new__(FormattedOnceConfig)
    out.__setstate__((cfg if isinstance(cfg, Config) else Config(cfg)).__getstate__())
    return out


def export_config(name: str, dest: str | Path) -> Path:
    """Write config ``name`` with its ``_base_`` files resolved to ``dest/NAME.py``; return that path."""
    dest = Path(dest)
    if dest.exists() and not dest.is_dir():
        raise NotADirectoryError(f'--dest {dest} is a file; give a folder (it is created if missing)')
    dest.mkdir(parents=True, exist_ok=True)
    source = config_file(name)
    out = dest / source.name
    cfg = Config.fromfile(str(source))
    follow_image_size(cfg)
    cfg.dump(str(out))
    return out


def task_model_config(config: str):
    """An mmdet / mmseg / mmpretrain config file adapted to this device (:func:`mmwf.utils.adapt_to_device`) and the
    config of the network it tests, with random backbone weights (``init_cfg`` dropped): ``model``, or its
    ``student`` under AttentionDistiller (the teacher is training-only). Returns ``(cfg, model_cfg)``."""
    from mmwf.utils import adapt_to_device
    cfg = Config.fromfile(config)
    adapt_to_device(cfg)
    model_cfg = cfg.model.get('student', cfg.model)
    model_cfg.backbone.pop('init_cfg', None)
    return cfg, model_cfg


def build_task_model(scope: str, model_cfg) -> nn.Module:
    """``model_cfg`` built by the registry of ``scope`` (``'mmdet'``, ``'mmseg'``), that scope the default while it
    builds (the process's current scope is left as it was)."""
    from importlib import import_module

    from mmengine.registry import DefaultScope
    registry = import_module(f'{scope}.registry').MODELS
    with DefaultScope.overwrite_default_scope(scope):
        return registry.build(model_cfg)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog='python -m mmwf.configs', description=__doc__.split('\n\n')[0])
    parser.add_argument('names', nargs='*', help='configs to export (names from --list)')
    parser.add_argument('--dest', default='.', help='folder to write them to. Defaults to the current one')
    parser.add_argument('--list', action='store_true', help='list the config names, with their folders')
    args = parser.parse_args(argv)
    if args.list:
        for name, path in config_files().items():
            print(f'{name:45s} {path.relative_to(CONFIG_ROOT).parent}')
        return
    if not args.names:
        parser.error('give config names to export, or --list')
    for name in args.names:
        try:
            print(f'wrote {export_config(name, args.dest)}')
        except (ValueError, FileNotFoundError, NotADirectoryError) as err:
            raise SystemExit(f'error: {err}') from None


if __name__ == '__main__':
    main()
