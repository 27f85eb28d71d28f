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


def _field_targets(node, keys: list[str]) -> list[tuple[dict | list, str | int]]:
    """(container, key) of every place ``keys`` reach from ``node``: a key ``name[Type]`` is the list under ``name``
    narrowed to its dicts of that ``type`` (a pipeline's transforms); a key the node lacks reaches nothing (a child
    config without the field, e.g. a whole-image test instead of a sliding one)."""
    key, rest = keys[0], keys[1:]
    name, _, type_ = key.partition('[')
    if not hasattr(node, 'keys') or name not in node:
        return []
    if not type_:
        return _field_targets(node[name], rest) if rest else [(node, name)]
    items = node[name] if isinstance(node[name], list) else []
    found = [t for t in items if isinstance(t, dict) and t.get('type') == type_.rstrip(']')]
    return [hit for t in found for hit in (_field_targets(t, rest) if rest else [])]


def _pipelines(cfg: Config | ConfigDict) -> list[list]:
    """Every pipeline of a config: its top-level ``*pipeline`` lists and the ``pipeline`` of each dataloader's
    dataset, through dataset wrappers (``dataset.dataset``)."""
    found = [v for k, v in cfg.items() if k.endswith('pipeline') and isinstance(v, list)]
    for key, loader in cfg.items():
        dataset = loader.get('dataset') if key.endswith('_dataloader') and hasattr(loader, 'get') else None
        while hasattr(dataset, 'get'):
            if isinstance(dataset.get('pipeline'), list):
                found.append(dataset['pipeline'])
            dataset = dataset.get('dataset')
    return found


def _changed_size(cfg: Config | ConfigDict) -> tuple[int, int] | None:
    """``cfg.image_size`` as (H, W) where it is not the size the declared ``image_size_fields`` hold, else None."""
    size = cfg.get('image_size')
    if size is None:
        return None
    size = _pair(size)
    if len(size) != 2 or not all(isinstance(v, int) and v > 0 for v in size):
        raise ValueError(f'image_size={cfg.image_size!r}: give H, W (positive ints) or one int for a square')
    declared = cfg.get('image_size_fields')
    return None if declared is None or size == _pair(declared['written_for']) else size


def _pair(size: int | tuple | list) -> tuple:
    """An image size as (H, W): one int is a square."""
    return (size, size) if isinstance(size, int) else tuple(size)


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


def follow_image_size(cfg: Config | ConfigDict) -> list[str]:
    """Set what depends on the image size from ``cfg.image_size`` where a child config or ``--cfg-options
    image_size=S`` changed it (mmengine resolves a config's variables when it reads the file, so its crops, pads and
    test scales keep the size they were written with). A config declares them in ``image_size_fields``:
    ``written_for`` (the size its fields hold) and ``fields``, a dotted path (``name[Type]`` picks a pipeline's
    transforms of that type; ``pipelines[Type]``, those of every pipeline: the top-level ones and each dataloader's)
    -> the factors of (H, W) its value is (an int factor: of H alone), e.g. ``'model.test_cfg.stride': (2 / 3,
    2 / 3)``; a value is the product rounded down. Returns the paths it set; a config without the declaration is
    left as it is."""
    size = _changed_size(cfg)
    if size is None:
        return []
    changed = []
    every = {'pipelines': [t for pipeline in _pipelines(cfg) for t in pipeline]}
    for path, factors in cfg.image_size_fields.get('fields', {}).items():
        keys = path.split('.')
        targets = _field_targets(every if keys[0].startswith('pipelines[') else cfg, keys)
        for container, key in targets:  # rounded down, past the float error of a factor such as 256 / 224
            container[key] = (int(factors * size[0] + 1e-6) if isinstance(factors, (int, float)) else
                              tuple(int(f * v + 1e-6) for f, v in zip(factors, size)))
        if targets:
            changed.append(path)
    cfg.image_size = size
    cfg.image_size_fields.written_for = size
    return changed


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
