"""MkDocs hooks of the documentation site (mkdocs.yml): the model zoo page generated from the metafiles, and the
changelog page from CHANGELOG.md, so that neither is written twice."""
from __future__ import annotations

from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
MODEL_INDEX = '<!-- the metafiles of model-index.yml -->'
CHANGELOG = '<!-- CHANGELOG.md -->'


def cell(value: object) -> str:
    return '-' if value is None else str(value)


def metafile_tables() -> str:
    """One table per metafile of ``model-index.yml``: each config with its input, counts, the paper's counts, the
    results (the paper's, or ours for the demos, as the metafile's ``Results Source`` says) and the link to its
    released weights where it has them."""
    parts = []
    for metafile in yaml.safe_load((ROOT / 'model-index.yml').read_text())['Import']:
        data = yaml.safe_load((ROOT / metafile).read_text())
        rows = ['| config | input | params (M) | GFLOPs | paper: params (M) / GFLOPs | results | weights |',
                '|---|---|---|---|---|---|---|']
        for model in data['Models']:
            meta = model.get('Metadata', {})
            paper = f'{cell(meta.get("Paper Parameters (M)"))} / {cell(meta.get("Paper GFLOPs"))}'
            results = '; '.join(
                f'{r["Dataset"]}: ' + ', '.join(f'{k} {v}' for k, v in r.get('Metrics', {}).items())
                for r in model.get('Results', []))
            weights = f'[released]({model["Weights"]})' if model.get('Weights') else '-'
            rows.append(f'| `{model["Config"]}` | {cell(meta.get("Input"))} | {cell(meta.get("Parameters (M)"))} | '
                        f'{cell(meta.get("GFLOPs"))} | {paper} | {results or "-"} | {weights} |')
        parts.append(f'## `{metafile}`\n\n' + '\n'.join(rows) + '\n')
    return '\n'.join(parts)


def changelog() -> str:
    """CHANGELOG.md without its title, its sections one level down."""
    lines = (ROOT / 'CHANGELOG.md').read_text().splitlines()[1:]
    return '\n'.join('#' + line if line.startswith('#') else line for line in lines) + '\n'


def on_page_markdown(markdown: str, page, config, files) -> str:
    return markdown.replace(MODEL_INDEX, metafile_tables()).replace(CHANGELOG, changelog())
