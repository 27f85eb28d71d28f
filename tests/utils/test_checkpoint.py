"""Reading, writing and resuming checkpoints under weights-only loading (torch >= 2.6 with mmengine 0.10.7)."""
import os
import pickle

import numpy as np
import pytest
import torch
from mmengine.runner import CheckpointLoader

import mmwf  # noqa: F401  (registers the hooks of mmwf's configs)
from mmwf.utils import UnsafeCheckpointError, load_state_dict_file, load_weights_only, safe_checkpoint_globals
from tests.toy import ToyModel, make_runner


def test_runner_resumes_weights_only(tmp_path):
    """mmengine's own Runner with the hooks of mmwf's configs writes checkpoints that torch's default weights-only
    loading reads (no mmwf allow-list in this process), and resumes model, optimizer and logged history."""
    from mmengine.logging import HistoryBuffer
    first = make_runner(tmp_path, max_iters=6)
    first.train()
    ckpt = tmp_path / 'iter_6.pth'
    raw = torch.load(ckpt, weights_only=True)
    assert raw['meta']['iter'] == 6
    assert raw['message_hub']['log_scalars']['train/loss']['mmwf_history_buffer']['log']
    assert not set(safe_checkpoint_globals()) & set(torch.serialization.get_safe_globals())

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
    assert isinstance(history, HistoryBuffer)
    assert history.data[0].tolist() == first.message_hub.get_scalar('train/loss').data[0].tolist()
    second.train()
    assert second.iter == 8
    assert len(second.message_hub.get_scalar('train/loss').data[0]) == 8


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
    with pytest.raises(pickle.UnpicklingError, match='Weights only load failed'):
        CheckpointLoader.load_checkpoint(str(path), map_location='cpu')  # mmengine's own path: torch refuses it
    with pytest.raises(UnsafeCheckpointError, match='evil.pth.*weights-only loading refuses.*--trust-source'):
        load_weights_only(str(path))
    with pytest.raises(UnsafeCheckpointError, match='evil.pth.*weights-only loading refuses'):  # before a run loads
        make_runner(tmp_path / 'run', 1, load_from=str(path)).train()
    assert not marker.exists()


def test_plain_mmengine_buffer_is_refused_not_executed(tmp_path):
    """Plain mmengine pickles a buffer's statistics functions, which unpickle through builtins.getattr; that global
    stays refused, also by mmwf's reads, while the plain data mmwf's hook writes instead loads everywhere."""
    from mmengine.logging import HistoryBuffer

    from mmwf.utils.checkpoint import plain_checkpoint, restore_checkpoint
    buf = HistoryBuffer()
    buf.update(2.0)
    path = tmp_path / 'plain.pth'
    torch.save({'message_hub': {'log_scalars': {'loss': buf}}}, path)
    with pytest.raises(pickle.UnpicklingError, match='HistoryBuffer was not an allowed global'):
        torch.load(path, weights_only=True)
    with pytest.raises(UnsafeCheckpointError, match='getattr'):  # mmwf's reads allow the buffer, not its functions
        load_weights_only(str(path))
    checkpoint = {'message_hub': {'log_scalars': {'loss': buf}}, 'meta': {'seed': np.int64(3)}}
    plain_checkpoint(checkpoint)
    torch.save(checkpoint, path)
    loaded = torch.load(path, weights_only=True)
    assert loaded['meta']['seed'] == 3 and type(loaded['meta']['seed']) is int
    restore_checkpoint(loaded)
    assert loaded['message_hub']['log_scalars']['loss'].current() == 2.0


def test_missing_checkpoint_names_the_path(tmp_path):
    with pytest.raises(FileNotFoundError, match='nope.pth'):
        load_weights_only(str(tmp_path / 'nope.pth'))


def test_state_dict_unwrapping(tmp_path):
    sd = {'a': torch.ones(2)}
    for wrap in ('state_dict', 'model', None):
        path = tmp_path / f'{wrap}.pth'
        torch.save({wrap: sd} if wrap else sd, path)
        assert torch.equal(load_state_dict_file(str(path))['a'], sd['a'])


def test_an_earlier_mmwf_checkpoint_with_an_empty_history_buffer_loads(tmp_path, monkeypatch):
    """Checkpoints written before the plain format pickled buffers as data (no statistics functions). Pickle protocol
    2 writes a zero-size array's data as ``bytes()``: mmwf's reads allow it (it can only make bytes)."""
    from mmengine.logging import HistoryBuffer
    monkeypatch.setattr(HistoryBuffer, '__getstate__', lambda self: {
        k: v for k, v in self.__dict__.items() if k != 'statistics_methods'}, raising=False)
    loss = HistoryBuffer()
    loss.update(1.0)
    scalars = {'train/loss': loss, 'val/mIoU': HistoryBuffer()}  # never updated: zero-size arrays
    path = tmp_path / 'iter_1.pth'
    torch.save({'meta': {'iter': 1}, 'message_hub': {'log_scalars': scalars}, 'state_dict': {'w': torch.ones(1)},
                'extra': np.zeros((0, 3))}, path)
    with torch.serialization.safe_globals([g for g in safe_checkpoint_globals() if g is not bytes]):
        with pytest.raises(pickle.UnpicklingError, match='GLOBAL bytes was not an allowed global'):
            torch.load(path, weights_only=True)
    loaded = load_weights_only(str(path))
    assert loaded['message_hub']['log_scalars']['val/mIoU'].data[0].size == 0
    assert loaded['extra'].shape == (0, 3)
    assert not set(safe_checkpoint_globals()) & set(torch.serialization.get_safe_globals())  # for that read only


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


TINY_WF = dict(embed_dims=32, depth=2, mlp_ratio=2)


def perturbed_state(model: torch.nn.Module) -> dict:
    """The model's state with every float tensor moved off its initial value (so that a load is visible)."""
    return {k: v + torch.randn_like(v) if v.is_floating_point() else v for k, v in model.state_dict().items()}


@pytest.fixture()
def http_server(tmp_path, monkeypatch):
    """Serve ``tmp_path / 'www'`` on 127.0.0.1; downloads go to a fresh torch hub cache."""
    import functools
    import http.server
    import threading
    root = tmp_path / 'www'
    root.mkdir()
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    handler.log_message = lambda *args: None
    server = http.server.ThreadingHTTPServer(('127.0.0.1', 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv('TORCH_HOME', str(tmp_path / 'torch_home'))
    yield root, f'http://127.0.0.1:{server.server_address[1]}'
    server.shutdown()


def test_pretrained_from_a_url_with_prefix_without_dot(http_server):
    """A detector checkpoint served over HTTP, given as mmengine writes it: prefix='backbone' (no dot)."""
    from mmwf.models.backbones import WeightFormer
    root, url = http_server
    state = perturbed_state(WeightFormer(TINY_WF))
    torch.save({'state_dict': {**{f'backbone.{k}': v for k, v in state.items()}, 'neck.w': torch.ones(1)}},
               root / 'det.pth')
    model = WeightFormer(TINY_WF, init_cfg=dict(type='Pretrained', checkpoint=f'{url}/det.pth', prefix='backbone',
                                                map_location='cpu'))
    model.init_weights()
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())


def test_downloads_are_read_weights_only(http_server, tmp_path):
    root, url = http_server
    marker = tmp_path / 'pwned'
    torch.save({'x': Evil(str(marker))}, root / 'evil.pth')
    with pytest.raises(UnsafeCheckpointError, match='evil.pth.*weights-only loading refuses'):
        load_state_dict_file(f'{url}/evil.pth')
    assert not marker.exists()


def test_downloads_are_cached_by_their_whole_address_and_safetensors_read_as_such(http_server):
    """Two hub links that both end in model.safetensors are two files (the model index's WF-T and WF-S weights)."""
    from safetensors.torch import save_file
    root, url = http_server
    for name, value in (('t', 1.0), ('s', 2.0)):
        (root / name).mkdir()
        save_file({'w': torch.full((2,), value)}, str(root / name / 'model.safetensors'))
    assert load_state_dict_file(f'{url}/t/model.safetensors')['w'].tolist() == [1.0, 1.0]
    assert load_state_dict_file(f'{url}/s/model.safetensors')['w'].tolist() == [2.0, 2.0]
    (root / 't' / 'model.safetensors').unlink()  # the second read of an address is the cached file
    assert load_state_dict_file(f'{url}/t/model.safetensors')['w'].tolist() == [1.0, 1.0]


@pytest.mark.parametrize('scheme,table', [('torchvision://', 'get_torchvision_models'),
                                          ('open-mmlab://', 'get_external_models')])
def test_named_checkpoints_resolve_through_mmengines_tables(http_server, monkeypatch, scheme, table):
    import mmengine.runner.checkpoint as mm_checkpoint
    root, url = http_server
    torch.save({'w': torch.arange(3.0)}, root / 'tiny-0123.pth')
    monkeypatch.setattr(mm_checkpoint, table, lambda: {'tiny': f'{url}/tiny-0123.pth'})
    assert torch.equal(load_state_dict_file(f'{scheme}tiny')['w'], torch.arange(3.0))


def test_pretrained_is_applied_after_the_other_init_cfg_entries(tmp_path):
    """mmengine applies Pretrained last, wherever it sits in a list: a Constant init of the LayerNorms listed after
    it must not overwrite the loaded weights."""
    from mmwf.models.backbones import WeightFormer
    state = perturbed_state(WeightFormer(TINY_WF))
    torch.save(state, tmp_path / 'wf.pth')
    model = WeightFormer(TINY_WF, init_cfg=[dict(type='Pretrained', checkpoint=str(tmp_path / 'wf.pth')),
                                            dict(type='Constant', layer='LayerNorm', val=0.0)])
    model.init_weights()
    assert torch.equal(model.norm.weight, state['norm.weight'])
    assert model.init_cfg[0]['type'] == 'Pretrained'  # the config is left as given


def test_pretrained_map_location_is_used(tmp_path):
    from mmwf.models.backbones import WeightFormer
    torch.save(WeightFormer(TINY_WF).state_dict(), tmp_path / 'wf.pth')
    seen = []

    def to_cpu(storage, location):
        seen.append(location)
        return storage
    WeightFormer(TINY_WF, init_cfg=dict(type='Pretrained', checkpoint=str(tmp_path / 'wf.pth'),
                                        map_location=to_cpu)).init_weights()
    assert seen and set(seen) == {'cpu'}


@pytest.mark.parametrize('kind', ['segmentor', 'distiller'])
def test_whole_model_checkpoint_gives_its_backbone(tmp_path, kind):
    """A segmentor's (backbone., decode_head.) or a distiller's (student.backbone., student.neck., teacher.)
    checkpoint initialises a backbone, and a distiller's gives the student's backbone, not the teacher's."""
    from mmwf.analysis import build_backbone
    from mmwf.models.backbones import WeightFormer
    state = perturbed_state(WeightFormer(TINY_WF))
    other = perturbed_state(WeightFormer(TINY_WF))
    if kind == 'segmentor':
        whole = {**{f'backbone.{k}': v for k, v in state.items()}, 'decode_head.conv_seg.weight': torch.ones(4, 8)}
    else:
        whole = {**{f'student.backbone.{k}': v for k, v in state.items()}, 'student.neck.w': torch.ones(1),
                 **{f'teacher.{k}': v for k, v in other.items()}}
    torch.save({'state_dict': whole, 'meta': {'iter': 4}}, tmp_path / 'iter_4.pth')
    model = build_backbone(dict(type='WeightFormer', arch=TINY_WF), str(tmp_path / 'iter_4.pth'))
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())


def test_atomic_write_keeps_the_old_file_when_writing_fails(tmp_path):
    from mmengine.fileio import get_file_backend

    from mmwf.utils.checkpoint import ATOMIC_BACKEND, AtomicLocalBackend, atomic_write, register_atomic_backend
    path = tmp_path / 'iter_4.pth'
    path.write_bytes(b'old checkpoint')

    def half_then_crash(f):
        f.write(b'new, half')
        raise OSError('No space left on device')
    with pytest.raises(OSError, match='No space left'):
        atomic_write(str(path), half_then_crash)
    assert path.read_bytes() == b'old checkpoint' and os.listdir(tmp_path) == ['iter_4.pth']
    atomic_write(str(path), lambda f: f.write(b'new'))
    assert path.read_bytes() == b'new'
    assert not isinstance(get_file_backend(str(path)), AtomicLocalBackend)  # mmengine's local backend is its own
    register_atomic_backend()
    assert isinstance(get_file_backend(str(path), backend_args=dict(backend=ATOMIC_BACKEND)), AtomicLocalBackend)
