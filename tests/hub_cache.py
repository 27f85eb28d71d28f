"""A Hugging Face hub cache laid out as ``huggingface_hub`` lays it out, for offline tests of hub downloads."""
from pathlib import Path

import pytest


def offline_hub_repo(cache: Path, repo_id: str, files: dict[str, bytes], monkeypatch: pytest.MonkeyPatch) -> Path:
    """``files`` as the ``main`` snapshot of the model repository ``repo_id`` in the hub cache ``cache``
    (``models--<owner>--<name>/refs/main`` naming the snapshot's commit), made the process's default cache
    (``HF_HUB_CACHE``) in offline mode for the test. Returns the snapshot folder."""
    import huggingface_hub
    commit = '0123456789abcdef0123456789abcdef01234567'
    repo = cache / f'models--{repo_id.replace("/", "--")}'
    (repo / 'refs').mkdir(parents=True, exist_ok=True)
    (repo / 'refs' / 'main').write_text(commit)
    snapshot = repo / 'snapshots' / commit
    snapshot.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (snapshot / name).write_bytes(data)
    monkeypatch.setattr(huggingface_hub.constants, 'HF_HUB_OFFLINE', True)
    monkeypatch.setattr(huggingface_hub.constants, 'HF_HUB_CACHE', str(cache))
    return snapshot
