"""tools/cuda_check.sh --dry-run: every step of the prepared CUDA run at tiny sizes on the CPU, the CUDA-only steps
skipped with their reason, and the results file written; without a CUDA device a real run refuses, and a pytest step
whose every test was skipped reads "not run"."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
STEPS = ['suite', 'cuda-tests', 'table3', 'table3-compiled', 'train-imagenet-compiled', 'table3-bf16', 'table3-unfused',
         'train-imagenet', 'train-cascade-compiled', 'train-cascade', 'train-upernet', 'train-wf-dit-bf16',
         'train-wf-dit-fp16', 'generation', 'kernels', 'triton', 'train-imagenet-triton', 'profile', 'engine-split',
         'onnx-fp32', 'onnx-fp16', 'nccl']
# the suite on the device (on the CPU it is `make test`, which runs this), the Triton kernels' steps (the
# interpreter's minutes), ONNX Runtime's CUDA provider, NCCL
CUDA_ONLY = ['suite', 'triton', 'train-imagenet-triton', 'onnx-fp32', 'onnx-fp16', 'nccl']
DEIT_T = 'deit_tiny_patch16_224'


@pytest.fixture(scope='module')
def dry_run(tmp_path_factory):
    out = tmp_path_factory.mktemp('cuda_check')
    proc = subprocess.run(['bash', 'tools/cuda_check.sh', '--dry-run', '--out', str(out)], cwd=ROOT,
                          env=dict(os.environ, PYTHON=sys.executable), capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out, json.loads((out / 'results.json').read_text())


@pytest.mark.slow
def test_dry_run_runs_every_step_and_skips_the_cuda_ones_with_a_reason(dry_run):
    out, report = dry_run
    steps = {s['name']: s for s in report['steps']}
    assert list(steps) == STEPS and report['dry_run'] is True
    for name in CUDA_ONLY:
        assert steps[name]['status'] == 'skipped' and 'dry run: needs' in steps[name]['reason'], name
    for name in [n for n in STEPS if n not in CUDA_ONLY + ['cuda-tests']]:
        assert steps[name]['status'] == 'passed', (name, steps[name].get('reason'), steps[name].get('output_tail'))
        assert steps[name]['tables'], name  # each tool printed its table
    # the CUDA tests ran and were skipped for the want of a device, each named: the step did not run them
    assert len(report['tests']) > 20
    assert all(t['outcome'] == 'skipped' and 'CUDA' in t['message'] for t in report['tests'])
    assert steps['cuda-tests']['status'] == 'not run' and 'every test skipped' in steps['cuda-tests']['reason']
    markdown = (out / 'results.md').read_text()
    assert all(f'| {name} |' in markdown for name in STEPS)
    assert '| cuda-tests | tests/test_cuda.py (pytest -m cuda) | not run: every test skipped' in markdown
    assert 'mmengine' in markdown and (out / 'log.txt').stat().st_size > 0
    # each step of python forked from one interpreter, but the one whose environment changes what timm's import reads
    assert report['fork_server'] == 'on'
    ran = [name for name in STEPS if steps[name]['status'] != 'skipped']
    assert {name: steps[name]['started'] for name in ran} == {
        name: 'fresh' if name == 'table3-unfused' else 'forked' for name in ran}
    # in this test, not one of its own: xdist may tear a module fixture down between two tests and run the dry run
    # (two minutes) again
    check_the_tables_are_the_tools_own(report)


def check_the_tables_are_the_tools_own(report: dict) -> None:
    """The tables carry what each tool measured: the kernel table names the rule's pick among the evaluations timed,
    the profile's step is in milliseconds of the CPU here, and the paper's claims come from the metafile."""
    steps = {s['name']: s for s in report['steps']}
    kernels = steps['kernels']['tables'][0]
    rows = [dict(zip(kernels['columns'], row)) for row in kernels['rows']]
    assert {r['mode'] for r in rows} == {'inference', 'training'}
    for row in rows:
        assert row['rule picks'] in row['ms by evaluation'] and row['fastest'] in row['ms by evaluation']
    conv = next(r for r in rows if r['operation'].startswith('per-sample') and r['mode'] == 'inference')
    assert conv['rule picks'] == 'loop'  # the CPU's eager inference entry of the kernel table
    # the proposal beside it: each entry the fastest evaluation timed for it, and the table's value today
    proposal = steps['kernels']['tables'][1]
    assert proposal['title'].startswith('KERNELS entries this cpu device would choose')
    entries = {row[0]: dict(zip(proposal['columns'], row)) for row in proposal['rows']}
    assert set(entries) == {f'{op}_cpu{mode}' for op in ('depthwise_conv', 'adaptive_pool', 'dynamic_weight')
                            for mode in ('', '_autograd')}
    fastest = {(r['operation'].split()[0], r['mode']): r['fastest'] for r in rows}
    assert entries['depthwise_conv_cpu']['proposed'] == fastest['per-sample', 'inference']
    assert entries['depthwise_conv_cpu']['the table today'] == 'loop'
    claims = {c['claim']: c for c in report['paper']}
    assert claims['WF-T / DeiT-T throughput at 224']['paper'] == pytest.approx(3515 / 3661)
    assert claims['WF-T / DeiT-T throughput at 1248']['paper'] == 7.7
    assert claims['peak memory WF-T saves against DeiT-T at 1248 (%)']['paper'] == 91
    assert report['environment']['torch'] == torch.__version__ and report['environment']['commit']
    # the compiled steps ran both models compiled under one protocol, stated in their header
    for name in ('table3-compiled', 'table3-bf16', 'train-imagenet-compiled'):
        output = steps[name]['output_tail']
        assert 'torch.compile mode' in output and 'commit ' in output, name
        columns = steps[name]['tables'][0]['columns']
        assert 'compile s' in columns and 'GPU busy' in columns, name
    assert 'bf16 autocast' in steps['table3-bf16']['output_tail']
    inference = steps['table3-compiled']['tables'][0]
    rows = {row[0]: dict(zip(inference['columns'], row)) for row in inference['rows']}
    assert float(rows['weightformer_t']['FLOP ceiling'].rstrip('x')) > 0 and rows[DEIT_T]['FLOP ceiling'] == '1.00x'


def test_a_real_run_without_a_cuda_device_refuses():
    """Without --dry-run and without a CUDA device (hidden here, whatever the machine) the run stops before its
    first step with a non-zero status and says why: no results that could read as a GPU's."""
    out = ROOT / 'work_dirs' / 'never_written'
    proc = subprocess.run([sys.executable, 'tools/analysis/cuda_check.py', '--out', str(out)], cwd=ROOT,
                          env=dict(os.environ, CUDA_VISIBLE_DEVICES=''), capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    assert 'no CUDA device here' in proc.stderr and '--dry-run' in proc.stderr
    assert not (out / 'results.md').exists()


def test_a_pytest_step_whose_tests_all_skip_did_not_run(tmp_path):
    """run_step: a pytest step that exits 0 with every test skipped is 'not run' with the skip's reason; one with a
    test that passed is 'passed'."""
    from mmwf.analysis.check_steps import Step, run_step
    (tmp_path / 'test_skips.py').write_text('import pytest\n\n\n@pytest.mark.skip(reason="needs a CUDA device")\n'
                                            'def test_skipped():\n    pass\n')
    (tmp_path / 'test_passes.py').write_text('def test_passes():\n    pass\n')
    results = {}
    for name in ('skips', 'passes'):
        junit = tmp_path / f'{name}.xml'
        step = Step('cuda-tests', name, [sys.executable, '-m', 'pytest', str(tmp_path / f'test_{name}.py'),
                                         '-p', 'no:cacheprovider', '-q', '--junitxml', str(junit)], 120,
                    junit=str(junit))
        with open(tmp_path / 'log.txt', 'w') as log:
            results[name] = run_step(step, 120, log, str(ROOT))
    assert results['skips']['status'] == 'not run' and 'needs a CUDA device' in results['skips']['reason']
    assert results['passes']['status'] == 'passed'
