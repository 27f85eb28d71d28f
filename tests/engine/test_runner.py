"""StrictRunner: strict loading with an explicit opt-out, resume past damaged checkpoints, atomic checkpoint writes.
(Its errors, with the words a user needs, are cases of tests/test_bad_inputs.py.)"""
import glob
import os
import struct
import zipfile

import pytest
import torch
import torch.nn as nn

import mmwf  # noqa: F401  (atomic writes, weights-only loading)
from mmwf.engine import StrictRunner
from mmwf.engine.runner import checkpoint_problem, newest_complete_checkpoint
from tests.toy import ToyModel, make_runner


class TwoLayers(ToyModel):
    def __init__(self, out_features=1):
        super().__init__()
        self.extra = nn.Linear(4, out_features)


def log_text(work_dir) -> str:
    return ''.join(open(f).read() for f in glob.glob(os.path.join(work_dir, '*', '*.log')))


@pytest.fixture(scope='module')
def trained(tmp_path_factory):
    """A toy run of 6 iterations with checkpoints at 3 and 6."""
    work = tmp_path_factory.mktemp('trained')
    make_runner(work, 6, StrictRunner).train()
    return work


def damage(path, how):
    data = bytearray(path.read_bytes())
    if how == 'truncated':  # a run killed while writing in place
        path.write_bytes(bytes(data[:len(data) // 2]))
    else:  # the bytes of the pickle flipped: the archive opens, a member's CRC fails
        with zipfile.ZipFile(path) as archive:
            info = next(i for i in archive.infolist() if i.filename.endswith('data.pkl'))
        name_len, extra_len = struct.unpack('<HH', data[info.header_offset + 26:info.header_offset + 30])
        start = info.header_offset + 30 + name_len + extra_len
        data[start:start + 8] = bytes(b ^ 0xFF for b in data[start:start + 8])
        path.write_bytes(bytes(data))


@pytest.mark.parametrize('how', ['truncated', 'corrupt member'])
def test_auto_resume_falls_back_past_a_damaged_last_checkpoint(trained, tmp_path, how):
    work = tmp_path / 'run'
    work.mkdir()
    for name in ('iter_3.pth', 'iter_6.pth'):
        (work / name).write_bytes((trained / name).read_bytes())
    (work / 'last_checkpoint').write_text(str(work / 'iter_6.pth'))
    damage(work / 'iter_6.pth', how)
    assert checkpoint_problem(str(work / 'iter_6.pth')) is not None
    assert checkpoint_problem(str(work / 'iter_3.pth')) is None
    runner = make_runner(work, 8, StrictRunner, resume=True)
    runner.train()
    log = log_text(work)
    assert f'cannot resume from {work / "iter_6.pth"}' in log
    assert f'resuming from {work / "iter_3.pth"}' in log and 'resumed epoch: 0, iter: 3' in log
    assert runner.iter == 8


def test_newest_complete_checkpoint_is_the_highest_complete_iteration(trained, tmp_path):
    """mmengine writes last_checkpoint after the file: a run killed in between names iter_3 while iter_6 is whole."""
    for name in ('iter_3.pth', 'iter_6.pth'):
        (tmp_path / name).write_bytes((trained / name).read_bytes())
    (tmp_path / 'last_checkpoint').write_text(str(tmp_path / 'iter_3.pth'))
    (tmp_path / 'iter_9.pth').write_bytes(b'')
    path, skipped = newest_complete_checkpoint(str(tmp_path))
    assert path == str(tmp_path / 'iter_6.pth')
    assert skipped == [(str(tmp_path / 'iter_9.pth'), 'the file is empty (0 bytes)')]


def test_checkpoint_written_without_crcs_is_complete(tmp_path):
    torch.serialization.set_crc32_options(False)
    try:
        torch.save({'state_dict': {'w': torch.ones(64)}}, tmp_path / 'iter_1.pth')
    finally:
        torch.serialization.set_crc32_options(True)
    assert checkpoint_problem(str(tmp_path / 'iter_1.pth')) is None


def test_factored_optimizer_state_fits(tmp_path):
    """Adafactor keeps row / column statistics of other shapes than the parameter: not a mismatch."""
    from mmwf.engine.runner import optimizer_state_mismatch
    param = torch.nn.Parameter(torch.randn(8, 4))
    optimizer = torch.optim.Adafactor([param])
    param.grad = torch.randn(8, 4)
    optimizer.step()
    assert optimizer_state_mismatch(optimizer, optimizer.state_dict(), {id(param): 'w'}) == []
    other = torch.optim.AdamW([torch.nn.Parameter(torch.randn(8, 5))])
    other.param_groups[0]['params'][0].grad = torch.randn(8, 5)
    other.step()
    assert optimizer_state_mismatch(torch.optim.AdamW([param]), other.state_dict(), {id(param): 'w'}) == [
        'state shape mismatches (2): w (exp_avg): checkpoint (8, 5) vs parameter (8, 4), w (exp_avg_sq): checkpoint '
        '(8, 5) vs parameter (8, 4)']


class Renamed(ToyModel):
    """A model whose load hook converts an older key layout (as mmpretrain's and mmdet's models do)."""

    def __init__(self):
        super().__init__()
        self.register_load_state_dict_pre_hook(self.rename)

    @staticmethod
    def rename(module, state, prefix, *args):
        for key in [k for k in state if k.startswith(prefix + 'old_linear.')]:
            state[key.replace('old_linear.', 'linear.')] = state.pop(key)


def test_load_hooks_of_the_model_run_before_the_strict_check(trained, tmp_path):
    saved = torch.load(trained / 'iter_6.pth', weights_only=True)
    saved['state_dict'] = {k.replace('linear.', 'old_linear.'): v for k, v in saved['state_dict'].items()}
    torch.save(saved, tmp_path / 'old_layout.pth')
    runner = make_runner(tmp_path / 'run', 1, StrictRunner, model=Renamed(), load_from=str(tmp_path / 'old_layout.pth'))
    runner.load_or_resume()
    assert torch.equal(runner.model.linear.weight, saved['state_dict']['old_linear.weight'])


def test_training_removes_what_a_killed_save_left(tmp_path):
    stale = tmp_path / '.iter_3.pth.0123abcd.tmp'
    stale.write_bytes(b'half a checkpoint')
    other = tmp_path / '.notes.tmp'  # not ours: kept
    other.write_text('x')
    make_runner(tmp_path, 1, StrictRunner).train()
    assert not stale.exists() and other.exists()
    assert f'removed {stale}' in log_text(tmp_path)


def test_resume_with_nothing_to_resume_trains_from_scratch_and_says_so(tmp_path):
    runner = make_runner(tmp_path, 3, StrictRunner, resume=True)
    runner.train()
    assert runner.iter == 3
    assert f'resume: nothing to resume in {tmp_path}: no complete checkpoint. Training from scratch.' in log_text(
        tmp_path)


def test_partial_load_loads_the_matching_tensors_and_logs_the_rest(trained, tmp_path):
    runner = make_runner(tmp_path, 1, StrictRunner, model=TwoLayers(), load_from=str(trained / 'iter_6.pth'),
                         cfg=dict(partial_load=True))
    runner.load_or_resume()
    saved = torch.load(trained / 'iter_6.pth', weights_only=True)['state_dict']
    assert torch.equal(runner.model.linear.weight, saved['linear.weight'])
    log = log_text(tmp_path)
    assert f'partial_load=True: loading only the tensors of {trained / "iter_6.pth"} that match the model' in log
    assert 'missing keys in source state_dict: extra.weight, extra.bias' in log


def test_matching_checkpoint_loads_every_tensor(trained, tmp_path):
    runner = make_runner(tmp_path, 1, StrictRunner, load_from=str(trained / 'iter_6.pth'))
    runner.load_or_resume()
    saved = torch.load(trained / 'iter_6.pth', weights_only=True)['state_dict']
    assert all(torch.equal(v, saved[k]) for k, v in runner.model.state_dict().items())


def test_checkpoint_write_killed_before_its_rename_leaves_the_previous_file(trained, tmp_path, monkeypatch):
    """The runner saves through mmengine's local backend, which mmwf makes atomic: a crash after the bytes are
    written but before the rename leaves the old iter_6.pth whole (mmengine's own backend writes in place)."""
    runner = make_runner(tmp_path, 6, StrictRunner)
    runner.train()
    before = (tmp_path / 'iter_6.pth').read_bytes()

    def crash(fd):
        raise KeyboardInterrupt('killed')
    monkeypatch.setattr(os, 'fsync', crash)
    with pytest.raises(KeyboardInterrupt):
        runner.save_checkpoint(str(tmp_path), 'iter_6.pth', by_epoch=False)
    assert (tmp_path / 'iter_6.pth').read_bytes() == before
    assert not [p for p in os.listdir(tmp_path) if p.endswith('.tmp')]
