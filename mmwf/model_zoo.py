"""The model zoo as the documentation site shows it: one table per metafile of ``model-index.yml``, generated from
the metafiles (the one home of each config's counts, the paper's figures and the weights' links), so that the page
never states them a second time."""
from __future__ import annotations

import yaml

from mmwf.configs import MODEL_INDEX


def _cell(value: object) -> str:
    return '-' if value is None else str(value)


def model_zoo_tables() -> str:
    """One markdown table per metafile: each config with its input, counts, the paper's counts, the results (the
    paper's, or ours for the demos, as the metafile's ``Results Source`` says) and the link to its released weights
    where it has them."""
    parts = []
    for metafile in yaml.safe_load(MODEL_INDEX.read_text())['Import']:
        data = yaml.safe_load((MODEL_INDEX.parent / metafile).read_text())
        rows = ['| config | input | params (M) | GFLOPs | paper: params (M) / GFLOPs | results | weights |',
                '|---|---|---|---|---|---|---|']
        for model in data['Models']:
            meta = model.get('Metadata', {})
            paper = f'{_cell(meta.get("Paper Parameters (M)"))} / {_cell(meta.get("Paper GFLOPs"))}'
            results = '; '.join(
                f'{r["Dataset"]}: ' + ', '.join(f'{k} {v}' for k, v in r.get('Metrics', {}).items())
                for r in model.get('Results', []))
            weights = f'[released]({model["Weights"]})' if model.get('Weights') else '-'
            rows.append(f'| `{model["Config"]}` | {_cell(meta.get("Input"))} | {_cell(meta.get("Parameters (M)"))} | '
                        f'{_cell(meta.get("GFLOPs"))} | {paper} | {results or "-"} | {weights} |')
        parts.append(f'## `{metafile}`\n\n' + '\n'.join(rows) + '\n')
    return '\n'.join(parts)
