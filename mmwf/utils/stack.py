"""Check that the installed MMLab stack is one mmwf supports, without importing mmcv / mmdet / mmseg."""
from __future__ import annotations

import configparser
import importlib.metadata
import importlib.util
import warnings
from functools import cache
from pathlib import Path

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

STACK = ('torch', 'mmengine', 'mmcv', 'mmdet', 'mmsegmentation', 'mmpretrain')
FIX = ('Run `make install` in the mmwf repository (it builds mmcv with ops and installs the verified stack, '
       'requirements/stack.txt).')


@cache
def supported() -> dict[str, SpecifierSet]:
    """The range of each package of :data:`STACK` that mmwf supports, as its package metadata declares it
    (``install_requires`` and the ``mmlab`` extra): from the checkout's setup.cfg where mmwf runs from one, else
    from the installed distribution."""
    setup_cfg = Path(__file__).resolve().parents[2] / 'setup.cfg'
    if setup_cfg.is_file():
        cfg = configparser.ConfigParser()
        cfg.read(setup_cfg)
        lines = [cfg['options']['install_requires'], *cfg['options.extras_require'].values()]
        requirements = [line for text in lines for line in text.splitlines()]
    else:
        requirements = importlib.metadata.requires('mmwf') or []
    parsed = [Requirement(line) for line in requirements if line.strip()]
    return {r.name: r.specifier for r in parsed if r.name in STACK}


class StackError(RuntimeError):
    """The installed packages cannot run mmwf; the message says what is wrong and how to fix it."""


def installed_version(package: str) -> Version | None:
    try:
        return Version(importlib.metadata.version(package))
    except importlib.metadata.PackageNotFoundError:
        return None


def mmcv_has_ops() -> bool:
    """True when mmcv's compiled extension ``mmcv._ext`` is present (checked on disk, not imported)."""
    spec = importlib.util.find_spec('mmcv')
    if spec is None or not spec.submodule_search_locations:
        return False
    return any(any(Path(p).glob('_ext*.so')) or any(Path(p).glob('_ext*.pyd'))
               for p in spec.submodule_search_locations)


def stack_problems(require_mmcv_ops: bool = False) -> list[str]:
    """List what is wrong with the installed stack (empty when it is fine).

    Packages that are not installed are fine (the backbones need only torch, timm and mmengine), except
    mmcv when ``require_mmcv_ops`` is set. An installed package must be in its :func:`supported` range.
    """
    problems = []
    for package, specifier in supported().items():
        version = installed_version(package)
        if version is not None and not specifier.contains(Version(version.base_version)):
            problems.append(f'{package} {version} is installed; mmwf supports {package}{specifier}')
    if installed_version('mmcv-lite') is not None:
        problems.append('mmcv-lite is installed; it has no compiled ops (mmdet RoIAlign / NMS need them). '
                        'Uninstall it and install full mmcv')
    if installed_version('mmcv') is not None and not mmcv_has_ops():
        problems.append('mmcv is installed without its compiled ops (mmcv._ext is missing); it was built '
                        'without MMCV_WITH_OPS=1')
    elif require_mmcv_ops and installed_version('mmcv') is None:
        problems.append('mmcv (with ops) is not installed; mmdet and mmseg need it')
    return problems


def check_stack(require_mmcv_ops: bool = False, warn: bool = False) -> None:
    """Raise :class:`StackError` (or, with ``warn``, warn) naming every problem with the stack and the one command
    that fixes it. ``import mmwf`` warns; the train / test tools raise."""
    problems = stack_problems(require_mmcv_ops)
    if problems:
        lines = '\n'.join(f'  - {p}' for p in problems)
        message = f'mmwf cannot run on this software stack:\n{lines}\n{FIX}'
        if not warn:
            raise StackError(message)
        warnings.warn(message, stacklevel=2)
