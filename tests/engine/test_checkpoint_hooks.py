"""The runner pieces of mmwf's configs under mmengine's own Runner: strict loading with an explicit opt-out
(StrictLoadHook), plain and atomic checkpoints that record their run (SafeCheckpointHook), and the resume rule
(resume_checkpoint). Their errors, with the words a user needs, are cases of tests/test_bad_inputs.py."""
import glob
import os
import struct
import subprocess
import sys
import zipfile

import pytest
import torch
import torch.nn as nn

import mmwf  # noqa: F401  (registers the hooks)
from mmwf.engine import resume_checkpoint
from mmwf.engine.hooks.strict_load import optimizer_state_mismatch
from mmwf.utils import CheckpointMismatchError
from mmwf.utils.checkpoint import CheckpointError, atomic_write, checkpoint_problem
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
    make_runner(work, 6).train()
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


def test_resume_takes_the_current_run_not_a_newer_file_of_an_earlier_one(tmp_path):
    make_runner(tmp_path, 4, interval=2).train()  # an earlier run: iter_2, iter_4
    make_runner(tmp_path, 2, interval=1).train()  # a fresh run in the same folder: iter_1, iter_2
    path, notes = resume_checkpoint(str(tmp_path), schedulers=False)
    assert path == str(tmp_path / 'iter_2.pth') and notes == []
    runner = make_runner(tmp_path, 3, interval=1, load_from=path, resume=True)
    runner.train()
    assert 'resumed epoch: 0, iter: 2' in log_text(tmp_path)


@pytest.mark.parametrize('how', ['truncated', 'corrupt member'])
def test_a_damaged_last_checkpoint_falls_back_within_its_run(tmp_path, how):
    make_runner(tmp_path, 4, interval=2).train()  # an earlier run: iter_2, iter_4
    make_runner(tmp_path, 2, interval=1).train()  # the current run: iter_1, iter_2 (overwriting)
    fresh_run = torch.load(tmp_path / 'iter_1.pth', weights_only=True)['meta']['run_id']
    earlier_run = torch.load(tmp_path / 'iter_4.pth', weights_only=True)['meta']['run_id']
    assert fresh_run != earlier_run
    damage(tmp_path / 'iter_2.pth', how)
    path, notes = resume_checkpoint(str(tmp_path), schedulers=False)
    assert path == str(tmp_path / 'iter_1.pth')  # not the earlier run's complete, higher iter_4
    assert notes[0].startswith(f'cannot resume from {tmp_path / "iter_2.pth"}: ')
    runner = make_runner(tmp_path, 3, interval=1, load_from=path, resume=True)
    runner.train()
    assert torch.load(tmp_path / 'iter_3.pth', weights_only=True)['meta']['run_id'] == fresh_run


def test_no_fallback_outside_the_run(tmp_path):
    make_runner(tmp_path, 2, interval=2).train()  # an earlier run: iter_2
    make_runner(tmp_path, 1, interval=1).train()  # the current run: iter_1 only
    damage(tmp_path / 'iter_1.pth', 'truncated')
    with pytest.raises(CheckpointError, match='no other complete resume point of that run is left .*iter_2.pth'):
        resume_checkpoint(str(tmp_path), schedulers=False)


def test_no_fallback_without_a_record_of_the_run(trained, tmp_path):
    for name in ('iter_3.pth', 'iter_6.pth'):
        (tmp_path / name).write_bytes((trained / name).read_bytes())
    (tmp_path / 'last_checkpoint').write_text(str(tmp_path / 'iter_6.pth'))
    damage(tmp_path / 'iter_6.pth', 'truncated')
    with pytest.raises(CheckpointError, match=r'\.mmwf_run is missing.*--resume PATH'):
        resume_checkpoint(str(tmp_path), schedulers=False)


def test_nothing_saved_means_nothing_to_resume(tmp_path):
    assert resume_checkpoint(str(tmp_path), schedulers=False) == (None, [
        f'resume: nothing to resume in {tmp_path}: no last_checkpoint (no checkpoint was saved there). Training '
        'from scratch.'])


def without_crcs(path, state):
    torch.serialization.set_crc32_options(False)
    try:
        torch.save(state, path)
    finally:
        torch.serialization.set_crc32_options(True)


def test_checkpoint_written_without_crcs_is_complete_or_damaged_by_loading(tmp_path):
    without_crcs(tmp_path / 'whole.pth', {'state_dict': {'w': torch.ones(64)}})
    assert checkpoint_problem(str(tmp_path / 'whole.pth')) is None
    data = (tmp_path / 'whole.pth').read_bytes()
    (tmp_path / 'cut.pth').write_bytes(data[:len(data) // 2])
    assert 'truncated or damaged' in checkpoint_problem(str(tmp_path / 'cut.pth')).what
    flipped = tmp_path / 'flipped.pth'
    flipped.write_bytes(data)
    damage(flipped, 'corrupt member')  # no CRC to catch it: only loading does
    assert checkpoint_problem(str(flipped)) is not None


def test_factored_optimizer_state_fits():
    """Adafactor keeps row / column statistics of other shapes than the parameter: not a mismatch."""
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
    runner = make_runner(tmp_path / 'run', 1, model=Renamed(), load_from=str(tmp_path / 'old_layout.pth'))
    runner.load_or_resume()
    assert torch.equal(runner.model.linear.weight, saved['state_dict']['old_linear.weight'])


def test_a_write_removes_what_killed_writers_of_this_machine_left(tmp_path):
    from mmwf.utils.checkpoint.write import _HOST
    ended = subprocess.run([sys.executable, '-c', 'import os; print(os.getpid())'], capture_output=True, text=True)
    dead = tmp_path / f'.iter_3.pth.{_HOST}.{int(ended.stdout)}.0123abcd.tmp'
    live = tmp_path / f'.iter_4.pth.{_HOST}.{os.getpid()}.0123abcd.tmp'  # a save in progress in this process
    remote = tmp_path / f'.iter_5.pth.another-host.{int(ended.stdout)}.0123abcd.tmp'
    other = tmp_path / '.notes.tmp'  # not ours
    for path in (dead, live, remote, other):
        path.write_bytes(b'half a checkpoint')
    atomic_write(str(tmp_path / 'iter_6.pth'), lambda f: f.write(b'whole'))
    assert not dead.exists() and live.exists() and remote.exists() and other.exists()
    assert (tmp_path / 'iter_6.pth').read_bytes() == b'whole'


def test_partial_load_loads_the_matching_tensors_and_logs_the_rest(trained, tmp_path):
    runner = make_runner(tmp_path, 1, model=TwoLayers(), load_from=str(trained / 'iter_6.pth'),
                         cfg=dict(partial_load=True))
    runner.load_or_resume()
    saved = torch.load(trained / 'iter_6.pth', weights_only=True)['state_dict']
    assert torch.equal(runner.model.linear.weight, saved['linear.weight'])
    log = log_text(tmp_path)
    assert f'partial_load=True: loaded only the tensors of {trained / "iter_6.pth"} that match the model' in log
    assert 'missing keys (2): extra.bias, extra.weight' in log


class ToyWithBackbone(ToyModel):
    """The toy model with a small WeightFormer beside its linear (which its forward alone uses)."""

    def __init__(self):
        super().__init__()
        from mmwf.models.backbones import WeightFormer
        self.backbone = WeightFormer(dict(embed_dims=16, depth=2, mlp_ratio=2))


def test_partial_load_holds_for_a_checkpoint_without_the_backbone(trained, tmp_path):
    """A run's partial_load=True also opts out of the backbones' own guard: mmengine's lenient load after
    StrictLoadHook may leave the backbone untouched (its tensors are listed as left out); without the opt-out the
    run stops before the first batch."""
    runner = make_runner(tmp_path / 'partial', 1, model=ToyWithBackbone(), load_from=str(trained / 'iter_6.pth'),
                         cfg=dict(partial_load=True))
    runner.load_or_resume()
    assert runner.model.backbone.partial_load
    saved = torch.load(trained / 'iter_6.pth', weights_only=True)['state_dict']
    assert torch.equal(runner.model.linear.weight, saved['linear.weight'])
    assert 'under backbone' in log_text(tmp_path / 'partial')
    strict = make_runner(tmp_path / 'strict', 1, model=ToyWithBackbone(), load_from=str(trained / 'iter_6.pth'))
    with pytest.raises(CheckpointMismatchError, match='missing keys'):
        strict.load_or_resume()


def test_matching_checkpoint_loads_every_tensor(trained, tmp_path):
    runner = make_runner(tmp_path, 1, load_from=str(trained / 'iter_6.pth'))
    runner.load_or_resume()
    saved = torch.load(trained / 'iter_6.pth', weights_only=True)['state_dict']
    assert all(torch.equal(v, saved[k]) for k, v in runner.model.state_dict().items())


def test_checkpoint_write_killed_before_its_rename_leaves_the_previous_file(trained, tmp_path, monkeypatch):
    """mmwf's hooks give the run's CheckpointHook the atomic backend (mmengine's own writes into the target): a
    crash after the bytes are written but before the rename leaves the old iter_6.pth whole."""
    from mmengine.hooks import CheckpointHook
    runner = make_runner(tmp_path, 6)
    runner.train()
    hook = next(h for h in runner.hooks if isinstance(h, CheckpointHook))
    assert hook.backend_args == {'backend': 'mmwf_atomic_local'}
    before = (tmp_path / 'iter_6.pth').read_bytes()

    def crash(fd):
        raise KeyboardInterrupt('killed')
    monkeypatch.setattr(os, 'fsync', crash)
    with pytest.raises(KeyboardInterrupt):
        runner.save_checkpoint(str(tmp_path), 'iter_6.pth', by_epoch=False, backend_args=hook.backend_args)
    assert (tmp_path / 'iter_6.pth').read_bytes() == before
    assert not [p for p in os.listdir(tmp_path) if p.endswith('.tmp')]


def validated_runner(work_dir, **kwargs):
    """6 iterations with a linear lr decay, checkpoints every 2 and the best by a validation score at each; the same
    initial weights in every call."""
    from mmengine.evaluator import Evaluator

    from tests.toy import ToyData, ToyMetric
    torch.manual_seed(0)
    return make_runner(
        work_dir, 6, model=ToyModel(), interval=2,
        hooks=dict(checkpoint=dict(type='CheckpointHook', interval=2, by_epoch=False, save_best='score',
                                   rule='greater')),
        train_cfg=dict(by_epoch=False, max_iters=6, val_interval=2), val_cfg=dict(),
        val_dataloader=dict(dataset=ToyData(), sampler=dict(type='DefaultSampler', shuffle=False), batch_size=8,
                            num_workers=0, collate_fn=dict(type='default_collate')),
        val_evaluator=Evaluator([ToyMetric()]),
        param_scheduler=dict(type='LinearLR', start_factor=1.0, end_factor=0.1, end=6, by_epoch=False),
        **kwargs)


def test_resume_falls_back_to_a_resume_point_not_a_best_checkpoint(tmp_path):
    """The run's last save half-written: the fallback skips the newer best checkpoint (no optimizer, no schedulers)
    for iter_4.pth, and the resumed run ends with the weights and lr of the run that was never interrupted."""
    whole = validated_runner(tmp_path / 'whole')
    whole.train()
    interrupted = tmp_path / 'interrupted'
    validated_runner(interrupted).train()
    best = str(interrupted / 'best_score_iter_6.pth')  # the score improves at every validation
    assert set(torch.load(best, weights_only=True)) == {'meta', 'message_hub', 'state_dict'}
    damage(interrupted / 'iter_6.pth', 'truncated')
    path, notes = resume_checkpoint(str(interrupted), schedulers=True)
    assert path == str(interrupted / 'iter_4.pth')
    assert any(n.startswith(f'not resuming from {best}: it is not a resume point') for n in notes)
    assert 'the newest complete resume point of the same run' in notes[-1]
    resumed = validated_runner(interrupted, load_from=path, resume=True)
    resumed.train()
    for a, b in zip(whole.model.parameters(), resumed.model.parameters()):
        torch.testing.assert_close(a, b)
    assert whole.optim_wrapper.get_lr() == resumed.optim_wrapper.get_lr()


def test_a_best_checkpoint_is_refused_as_a_resume_point(tmp_path):
    validated_runner(tmp_path / 'run').train()
    best = glob.glob(str(tmp_path / 'run' / 'best_score_iter_*.pth'))[0]
    runner = validated_runner(tmp_path / 'again', load_from=best, resume=True)
    with pytest.raises(CheckpointError, match=r'not a resume point: it lacks the optimizer, parameter schedulers '
                                              r'state .*load_from=PATH'):
        runner.train()
