"""MkDocs hooks of the documentation site (mkdocs.yml): the model zoo page from the metafiles
(:func:`mmwf.model_zoo.model_zoo_tables`), and the changelog page from CHANGELOG.md, so that neither is written
twice."""
from __future__ import annotations

from pathlib import Path

from mmwf.model_zoo import model_zoo_tables

ROOT = Path(__file__).resolve().parents[2]
MODEL_INDEX = '<!-- the metafiles of model-index.yml -->'
CHANGELOG = '<!-- CHANGELOG.md -->'


def changelog() -> str:
    """CHANGELOG.md without its title, its sections one level down."""
    lines = (ROOT / 'CHANGELOG.md').read_text().splitlines()[1:]
    return '\n'.join('#' + line if line.startswith('#') else line for line in lines) + '\n'


def on_page_markdown(markdown: str, page, config, files) -> str:
    return markdown.replace(MODEL_INDEX, model_zoo_tables()).replace(CHANGELOG, changelog())
