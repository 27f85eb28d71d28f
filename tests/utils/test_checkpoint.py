"""Resume under weights-only loading (torch >= 2.6 with mmengine 0.10.7)."""
import os
import pickle

import pytest
import torch
import torch.nn as nn
from mmengine.model import BaseModel
from mmengine.runner import CheckpointLoader, Runner

import mmwf  # noqa: F401  (makes mmengine checkpoints load weights-only)
from mmwf.utils import (
    UnsafeCheckpointError,
    enable_safe_mmengine_checkpoints,
    load_state_dict_file,
    load_weights_only,
    safe_checkpoint_globals,
)


class ToyModel(BaseModel):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 1)

    def forward(self, inputs, data_samples=None, mode='tensor'):
        out = self.linear(inputs)
        if mode == 'loss':
            return dict(loss=((out - data_samples) ** 2).mean())
        return out


class ToyData(torch.utils.data.Dataset):
    def __init__(self):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(32, 4, generator=g)
        self.y = self.x.sum(1, keepdim=True)

    def __len__(self):
        return 32

    def __getitem__(self, i):
        return dict(inputs=self.x[i], data_samples=self.y[i])


def make_runner(work_dir, max_iters, **kwargs):
    return Runner(
        model=ToyModel(), work_dir=str(work_dir),
        train_dataloader=dict(dataset=ToyData(), sampler=dict(type='DefaultSampler', shuffle=True),
                              batch_size=4, num_workers=0, collate_fn=dict(type='default_collate')),
        optim_wrapper=dict(optimizer=dict(type='AdamW', lr=0.01)),
        train_cfg=dict(by_epoch=False, max_iters=max_iters),
        default_hooks=dict(checkpoint=dict(type='CheckpointHook', interval=3, by_epoch=False),
                           logger=dict(type='LoggerHook', interval=1)),
        randomness=dict(seed=0), default_scope='mmengine', **kwargs)


def test_runner_resumes_weights_only(tmp_path):
    first = make_runner(tmp_path, max_iters=6)
    first.train()
    ckpt = tmp_path / 'iter_6.pth'
    assert ckpt.is_file()
    # the file itself loads weights-only, message hub (HistoryBuffer) and numpy scalars included
    raw = torch.load(ckpt, weights_only=True)
    assert raw['meta']['iter'] == 6
    assert len(raw['message_hub']['log_scalars']['train/loss'].data[0]) > 0

    second = make_runner(tmp_path / 'resumed', max_iters=8, load_from=str(ckpt), resume=True)
    second.load_or_resume()
    assert second.iter == 6
    for p1, p2 in zip(first.model.parameters(), second.model.parameters()):
        assert torch.equal(p1, p2)
    s1 = first.optim_wrapper.optimizer.state_dict()['state']
    s2 = second.optim_wrapper.optimizer.state_dict()['state']
    assert s1.keys() == s2.keys() and len(s1) == 2
    for k in s1:
        for name in ('exp_avg', 'exp_avg_sq', 'step'):
            assert torch.equal(torch.as_tensor(s1[k][name]), torch.as_tensor(s2[k][name]))
    history = second.message_hub.get_scalar('train/loss')
    assert history.mean() == pytest.approx(first.message_hub.get_scalar('train/loss').mean())
    second.train()
    assert second.iter == 8


class Evil:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, 'w'))


def test_checkpoint_that_runs_code_is_refused(tmp_path):
    marker = tmp_path / 'pwned'
    path = tmp_path / 'evil.pth'
    with open(path, 'wb') as f:
        torch.save({'state_dict': {'w': torch.zeros(1)}, 'x': Evil(str(marker))}, f,
                   pickle_protocol=pickle.HIGHEST_PROTOCOL)
    with pytest.raises(UnsafeCheckpointError, match='evil.pth.*weights-only loading refuses.*--trust-source'):
        CheckpointLoader.load_checkpoint(str(path), map_location='cpu')  # mmengine's path: resume, load_from
    with pytest.raises(UnsafeCheckpointError, match='weights-only loading refuses'):
        load_weights_only(str(path))
    assert not marker.exists()


def test_plain_mmengine_buffer_is_refused_not_executed(tmp_path):
    """Plain mmengine pickles a buffer's statistics functions, which unpickle through builtins.getattr;
    that global must stay refused, while mmwf's buffers pickle as data."""
    from mmengine.logging import HistoryBuffer
    path = tmp_path / 'plain.pth'
    torch.save({'statistics_methods': {'min': HistoryBuffer.min}}, path)
    with pytest.raises(pickle.UnpicklingError, match='getattr'):
        torch.load(path, weights_only=True)
    buf = HistoryBuffer()
    buf.update(2.0)
    torch.save({'buf': buf}, path)
    assert torch.load(path, weights_only=True)['buf'].current() == 2.0


def test_missing_checkpoint_names_the_path(tmp_path):
    with pytest.raises(FileNotFoundError, match='nope.pth'):
        load_weights_only(str(tmp_path / 'nope.pth'))


def test_state_dict_unwrapping(tmp_path):
    sd = {'a': torch.ones(2)}
    for wrap in ('state_dict', 'model', None):
        path = tmp_path / f'{wrap}.pth'
        torch.save({wrap: sd} if wrap else sd, path)
        assert torch.equal(load_state_dict_file(str(path))['a'], sd['a'])


def test_no_weights_only_override_warns_at_import_and_loading_stays_weights_only(monkeypatch, tmp_path):
    """TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD does not break ``import mmwf``; every load still refuses code."""
    import subprocess
    import sys
    marker, path = tmp_path / 'pwned', tmp_path / 'evil.pth'
    torch.save({'x': Evil(str(marker))}, path)
    script = ('import mmwf\nfrom mmengine.runner import CheckpointLoader\n'
              f'CheckpointLoader.load_checkpoint({str(path)!r})')
    res = subprocess.run([sys.executable, '-c', script], capture_output=True, text=True,
                         env=dict(os.environ, TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD='1'))
    assert 'TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD is set' in res.stderr
    assert res.returncode != 0 and 'UnsafeCheckpointError' in res.stderr and not marker.exists()


def test_mmengine_checkpoint_with_an_empty_history_buffer_loads(tmp_path):
    """Pickle protocol 2 writes a zero-size array's data as ``bytes()``: allowed, it can only make bytes."""
    import numpy as np
    from mmengine.logging import HistoryBuffer
    loss = HistoryBuffer()
    loss.update(1.0)
    scalars = {'train/loss': loss, 'val/mIoU': HistoryBuffer()}  # never updated: zero-size arrays
    path = tmp_path / 'iter_1.pth'
    torch.save({'meta': {'iter': 1}, 'message_hub': {'log_scalars': scalars}, 'state_dict': {'w': torch.ones(1)},
                'extra': np.zeros((0, 3))}, path)
    torch.serialization.clear_safe_globals()  # every global mmwf allows but bytes: refused
    torch.serialization.add_safe_globals([g for g in safe_checkpoint_globals() if g is not bytes])
    try:
        with pytest.raises(pickle.UnpicklingError, match='GLOBAL bytes was not an allowed global'):
            torch.load(path, weights_only=True)
    finally:
        enable_safe_mmengine_checkpoints()
    loaded = load_weights_only(str(path))
    assert loaded['message_hub']['log_scalars']['val/mIoU'].data[0].size == 0
    assert loaded['extra'].shape == (0, 3)


class NaNAtThirdIteration(ToyModel):
    def __init__(self):
        super().__init__()
        self.calls = 0

    def forward(self, inputs, data_samples=None, mode='tensor'):
        out = super().forward(inputs, data_samples, mode)
        if mode == 'loss':
            self.calls += 1
            if self.calls == 3:
                out = dict(loss=out['loss'] * float('nan'))
        return out


def test_non_finite_loss_stops_training_before_its_checkpoint(tmp_path):
    runner = make_runner(tmp_path, max_iters=6, custom_hooks=[dict(type='NonFiniteLossHook')])
    runner.model = NaNAtThirdIteration()
    with pytest.raises(FloatingPointError, match=r'iteration 3: non-finite loss \(loss=nan'):
        runner.train()
    assert not (tmp_path / 'iter_3.pth').exists()
