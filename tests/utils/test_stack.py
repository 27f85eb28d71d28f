import re
from pathlib import Path

import pytest
from packaging.version import Version

from mmwf.utils import StackError, check_stack, stack
from mmwf.utils.stack import mmcv_has_ops


def test_installed_stack_is_supported():
    check_stack(require_mmcv_ops=True)
    assert mmcv_has_ops()


def test_wrong_versions_are_named_with_the_fix(monkeypatch):
    versions = {'torch': '2.14.1', 'mmengine': '0.10.7', 'mmcv': '2.2.0', 'mmdet': '3.3.0',
                'mmsegmentation': '1.2.2'}
    monkeypatch.setattr(stack, 'installed_version',
                        lambda p: Version(versions[p]) if p in versions else None)
    with pytest.raises(StackError) as err:
        check_stack()
    msg = str(err.value)
    assert 'mmcv 2.2.0 is installed' in msg and '<2.2.0' in msg and 'make install' in msg
    with pytest.warns(UserWarning, match='mmcv 2.2.0 is installed'):  # what `import mmwf` does
        check_stack(warn=True)


def test_mmcv_without_ops_is_named(monkeypatch):
    monkeypatch.setattr(stack, 'mmcv_has_ops', lambda: False)
    with pytest.raises(StackError, match='mmcv._ext is missing'):
        check_stack()


def test_missing_mmcv_only_matters_when_required(monkeypatch):
    real = stack.installed_version
    monkeypatch.setattr(stack, 'installed_version', lambda p: None if p == 'mmcv' else real(p))
    check_stack()
    with pytest.raises(StackError, match='mmcv \\(with ops\\) is not installed'):
        check_stack(require_mmcv_ops=True)


def test_versions_are_declared_once_and_read_elsewhere():
    """The supported ranges are the package metadata's (setup.cfg, what the check reads), the verified versions
    requirements/stack.txt's and lie inside them; the install scripts write no version of their own, and the
    environment page states the verified ones."""
    root = Path(__file__).resolve().parents[2]
    pins = dict(line.split('==') for line in (root / 'requirements/stack.txt').read_text().splitlines()
                if line and not line.startswith('#'))
    ranges = stack.supported()
    assert set(ranges) == set(stack.STACK) and set(stack.STACK) < set(pins)
    assert all(Version(pins[package]) in specifier for package, specifier in ranges.items())
    for script in ('tools/install.sh', 'tools/cuda_check.sh', 'requirements.txt'):
        text = (root / script).read_text()
        pinned = r'\b(torch|torchvision|mmengine|mmcv|mmdet|mmsegmentation|mmpretrain)[=<>~]=?\d'
        assert not re.search(pinned, text), script
        assert not [version for version in pins.values() if version in text], script
    rows = [[c.strip() for c in line.split('|')[1:3]] for line in
            (root / 'docs/environment.md').read_text().splitlines() if line.startswith('| ')]
    for package, version in pins.items():
        assert any(package in piece and version in stated for piece, stated in rows), (package, version)
