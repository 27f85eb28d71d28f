"""model-index.yml and the metafiles: every config listed once, every listed config present, and the params / FLOPs
equal to what mmwf.analysis counts (and tools/analysis/get_flops.py prints).

Counting re-traces every network (four minutes of the suite); the counts depend only on the network's config, the
code that builds and counts it and the installed stack. ``tests/data/counts/<metafile>.json`` keeps them with a
digest of that code and stack (:func:`counting_source`): where the digest is today's, the counts are taken from there,
else counted again. ``MMWF_WRITE_COUNTS=1 python -m pytest tests/test_model_index.py`` writes them after a change.
"""
import hashlib
import importlib.metadata
import json
import os
from pathlib import Path

import pytest
import yaml
from mmengine.config import Config

from mmwf.analysis import classifier_counts, generator_counts, task_model_config, task_model_counts
from mmwf.configs import CONFIG_ROOT, config_files

ROOT = Path(__file__).resolve().parents[1]
INDEX = CONFIG_ROOT.parent / 'model-index.yml'


METAFILES = yaml.safe_load(INDEX.read_text())['Import']
COUNTS = ROOT / 'tests' / 'data' / 'counts'
# what the counts depend on besides the network's config: the code that builds and counts networks, and the stack
COUNTED_BY = ('mmwf/models', 'mmwf/analysis/complexity.py', 'mmwf/analysis/task_models.py', 'mmwf/analysis/models.py',
              'mmwf/registry.py', 'mmwf/configs.py')
STACK = ('torch', 'mmengine', 'mmcv', 'mmdet', 'mmsegmentation', 'mmpretrain', 'timm')


def counting_source() -> str:
    """sha256 of the counting code (:data:`COUNTED_BY`) and the versions of the stack (:data:`STACK`)."""
    digest = hashlib.sha256()
    for entry in COUNTED_BY:
        path = ROOT / entry
        for file in sorted(path.rglob('*.py')) if path.is_dir() else [path]:
            digest.update(str(file.relative_to(ROOT)).encode() + b'\0' + file.read_bytes())
    for package in STACK:
        digest.update(f'{package}=={importlib.metadata.version(package)}'.encode())
    return digest.hexdigest()


def cached_counts(metafile: str) -> tuple[Path, dict]:
    """The kept counts of a metafile's networks (empty where the code or the stack changed since they were kept)."""
    path = COUNTS / f'{metafile.replace("/", "_").removesuffix(".yml")}.json'
    kept = json.loads(path.read_text()) if path.is_file() else {}
    return path, kept.get('counts', {}) if kept.get('source') == counting_source() else {}


def metafile_models(metafiles: list[str] = METAFILES) -> list[dict]:
    models = []
    for metafile in metafiles:
        meta = yaml.safe_load((INDEX.parent / metafile).read_text())
        collections = {c['Name'] for c in meta['Collections']}
        for model in meta['Models']:
            assert model['In Collection'] in collections, (metafile, model['Name'])
            models.append(model)
    return models


def test_every_config_is_listed_once_and_every_listed_config_exists():
    models = metafile_models()
    names = [m['Name'] for m in models]
    assert sorted(names) == sorted(set(names))
    assert set(names) == set(config_files())
    for model in models:
        assert (INDEX.parent / model['Config']).is_file(), model['Config']
        assert Path(model['Config']).stem == model['Name']
        assert ('Results' in model) == ('Results Source' in model), model['Name']


def at_papers_rounding(value: float, paper: float) -> float:
    """``value`` rounded (half up) to as many decimals as the paper prints ``paper`` with (7 -> 0, 6.9 -> 1)."""
    from decimal import ROUND_HALF_UP, Decimal
    places = Decimal(str(paper)).as_tuple().exponent
    return float(Decimal(repr(value)).quantize(Decimal(1).scaleb(places), rounding=ROUND_HALF_UP))


@pytest.mark.slow
@pytest.mark.parametrize('metafile', [pytest.param(m, marks=pytest.mark.xdist_group(f'model-index:{m}'))
                                      for m in METAFILES])  # each its own unit of work: they share no fixture
def test_params_and_flops_are_what_get_flops_counts(metafile):
    """Every model's counts at its listed input (what tools/analysis/get_flops.py prints), and the paper's figures
    where the metafile gives them; configs that build the same network (transfer recipes, with or without
    distillation: the teacher is not counted) are counted once."""
    counted, exact = {}, {}
    cache_path, cache = cached_counts(metafile)
    for model in metafile_models([metafile]):
        path = str(INDEX.parent / model['Config'])
        meta = model['Metadata']
        shape = tuple(int(v) for v in meta['Input'].split('x'))
        cfg = Config.fromfile(path)
        generation = cfg.model.type == 'LatentDiffusion'
        network = cfg.model.denoiser if generation else task_model_config(path)[1]
        key = json.dumps(network.to_dict(), sort_keys=True, default=str) + meta['Input']
        digest = hashlib.sha256(key.encode()).hexdigest()
        if key not in counted and digest in cache:
            exact[key] = cache[digest]
        elif key not in counted:
            if generation:
                params, flops = generator_counts(path)
                exact[key] = {'Parameters (M)': params, 'GFLOPs': flops}
            elif cfg.default_scope == 'mmpretrain':
                params, flops = classifier_counts(path, shape)
                exact[key] = {'Parameters (M)': params, 'GFLOPs': flops}
            else:
                parts = task_model_counts(path, shape)
                exact[key] = {'Parameters (M)': parts['whole'][0], 'GFLOPs': parts['whole'][1],
                              'GFLOPs (backbone+neck)': parts['backbone+neck'][1]}
                if 'whole (no mask head)' in parts:
                    exact[key]['GFLOPs (no mask head)'] = parts['whole (no mask head)'][1]
        if key not in counted:
            counted[key] = {k: round(v, 2 if k == 'Parameters (M)' or generation or cfg.default_scope == 'mmpretrain'
                                     else 1)
                            for k, v in exact[key].items()}
            cache[digest] = exact[key]
        optional = {'GFLOPs (no mask head)'}  # listed where the paper's figure needs it
        assert set(counted[key]) - optional <= set(meta), model['Name']
        listed = {k: meta[k] for k in counted[key] if k in meta}
        assert listed == {k: counted[key][k] for k in listed}, model['Name']
        # the paper's figures (Tables 2-6) at the paper's rounding, except where Paper Differences says not
        differences = meta.get('Paper Differences', {})
        assert set(differences) <= {k.removeprefix('Paper ') for k in meta if k.startswith('Paper ')}, model['Name']
        for k, paper in meta.items():
            if k.startswith('Paper ') and k != 'Paper Differences':
                ours = exact[key][k.removeprefix('Paper ')]
                agrees = at_papers_rounding(ours, paper) == paper
                assert agrees == (k.removeprefix('Paper ') not in differences), (model['Name'], k, ours, paper)
    if os.environ.get('MMWF_WRITE_COUNTS') == '1':
        COUNTS.mkdir(parents=True, exist_ok=True)
        cache_path.write_text(json.dumps(dict(source=counting_source(), counts=cache), indent=1, sort_keys=True))


def test_kept_counts_are_used_only_for_the_code_and_stack_that_counted_them(monkeypatch):
    """A change to the counting code or the stack (another digest) means counting again."""
    import tests.test_model_index as this
    assert cached_counts('configs/imagenet/metafile.yml')[1], 'no kept counts: MMWF_WRITE_COUNTS=1 writes them'
    monkeypatch.setattr(this, 'counting_source', lambda: 'another digest')
    assert this.cached_counts('configs/imagenet/metafile.yml')[1] == {}
