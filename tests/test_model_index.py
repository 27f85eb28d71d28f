"""model-index.yml and the metafiles: every config listed once, every listed config present, and the params / FLOPs
equal to what tools/analysis/get_flops.py counts."""
import importlib.util
import json
from pathlib import Path

import pytest
import yaml

from mmwf.analysis.inputs import task_model_config
from mmwf.configs import CONFIG_ROOT, config_files

ROOT = Path(__file__).resolve().parents[1]
INDEX = CONFIG_ROOT.parent / 'model-index.yml'


def metafile_models() -> list[dict]:
    models = []
    for metafile in yaml.safe_load(INDEX.read_text())['Import']:
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


def get_flops_module():
    spec = importlib.util.spec_from_file_location('get_flops', ROOT / 'tools/analysis/get_flops.py')
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_params_and_flops_are_what_get_flops_counts():
    """Every model's counts at its listed input, and the paper's figures where the metafile gives them; configs that
    build the same network (transfer recipes, with or without distillation: the teacher is not counted) are counted
    once."""
    get_flops = get_flops_module()
    counted, exact = {}, {}
    for model in metafile_models():
        path = str(INDEX.parent / model['Config'])
        meta = model['Metadata']
        shape = tuple(int(v) for v in meta['Input'].split('x'))
        cfg, network = task_model_config(path)
        key = json.dumps(network.to_dict(), sort_keys=True, default=str) + meta['Input']
        if key not in counted:
            if cfg.default_scope == 'mmpretrain':
                params, flops = get_flops.count_classifier(path, shape, our_order=False)['classifier']
                counted[key] = {'Parameters (M)': round(params, 2), 'GFLOPs': round(flops, 2)}
                exact[key] = {'Parameters (M)': params, 'GFLOPs': flops}
            else:
                parts = get_flops.count(path, shape, our_order=False)
                counted[key] = {'Parameters (M)': round(parts['whole'][0], 2), 'GFLOPs': round(parts['whole'][1], 1),
                                'GFLOPs (backbone+neck)': round(parts['backbone+neck'][1], 1)}
        listed = {k: meta[k] for k in counted[key]}
        assert listed == counted[key], model['Name']
        # the paper's figures (Tables 2, 3, 6) at the paper's rounding, except where Paper Differences says not
        differences = meta.get('Paper Differences', {})
        for k in ('Parameters (M)', 'GFLOPs'):
            if f'Paper {k}' in meta:
                paper = meta[f'Paper {k}']
                assert (at_papers_rounding(exact[key][k], paper) == paper) == (k not in differences), (
                    model['Name'], k, exact[key][k], paper)
