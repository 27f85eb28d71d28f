"""A tool of the repository run in a fresh interpreter, as a user runs it, for the tests."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_tool(*args: object, cwd: Path = ROOT, env: dict | None = None, ok: bool | None = True,
             timeout: float | None = None) -> subprocess.CompletedProcess:
    """``python ARGS`` from ``cwd`` (the repository), output captured as text. ``ok=True``: a non-zero exit fails the
    test with the tail of the output; ``ok=False``: so does a zero exit (the tool must refuse); None: either."""
    res = subprocess.run([sys.executable, *map(str, args)], cwd=cwd, capture_output=True, text=True, env=env,
                         timeout=timeout)
    if ok is not None:
        assert (res.returncode == 0) == ok, res.stdout[-2000:] + res.stderr[-3000:]
    return res
