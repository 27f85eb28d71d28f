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
