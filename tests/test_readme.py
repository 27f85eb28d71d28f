"""The README as a newcomer reads it: short, its links resolve, its model zoo is the metafiles', and every code
block of its quick start runs as it stands (the commands at a small size: one iteration on a few demo images)."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from mmwf.configs import metafile_models
from tests.tool_runner import run_python, typed_words

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / 'README.md').read_text()
# what the test appends to a command of the README to run it small (the command's own text is kept)
# one iteration, no validation of it (the test command evaluates), and 20 detections an image to evaluate (a random
# detector's 100 cost the CPU a second an image in the mask head)
SMALL = {
    'tools/generate_demo_data.py': ['--train', '8', '--val', '4'],
    'tools/train.py': ['--cfg-options', 'train_cfg.max_iters=1', 'train_cfg.val_begin=2',
                       'default_hooks.checkpoint.interval=1', 'train_dataloader.batch_size=2'],
    'tools/test.py': ['--cfg-options', 'model.test_cfg.rcnn.max_per_img=20'],
}


def code_blocks(language: str, section: str) -> list[str]:
    """The ``language`` blocks of the README section whose heading is ``section``."""
    text = README.split(f'\n## {section}\n', 1)[1].split('\n## ', 1)[0]
    return re.findall(rf'```{language}\n(.*?)```', text, flags=re.S)


def test_readme_is_a_front_door():
    assert len(README.splitlines()) <= 200
    links = re.findall(r'\]\(([^)#:]+)(?:#[^)]*)?\)', README)
    assert links and not [link for link in links if not (ROOT / link).exists()]


def test_readme_model_zoo_is_the_metafiles():
    """Each count of the README's tables is its metafile's (params in M, GFLOPs), the results the paper's there."""
    models = metafile_models()
    section = README.split('\n## Model zoo\n', 1)[1].split('\n## ', 1)[0]
    rows = [[c.strip() for c in r.split('|')[1:-1]] for r in section.splitlines() if r.startswith('| ')]
    names = {'WeightFormer-T': 'weightformer_t_in1k', 'WeightFormer-S': 'weightformer_s_in1k',
             'WeightFormer-B': 'weightformer_b_in1k'}
    checked = 0
    for row in rows:
        name = names.get(row[0]) or row[0].strip('`').removesuffix('.py')
        if name not in models:
            continue
        meta = models[name]['Metadata']
        metrics = [str(v) for r in models[name].get('Results', []) for v in r['Metrics'].values()]
        if row[0] in names:
            _, size, params, flops, top1 = row
            assert size == meta['Input'].split('x')[0] and top1 in metrics
            assert params == f'{meta["Parameters (M)"]:.2f}M' and flops == f'{meta["GFLOPs"]:.2f}G'
        else:
            _, params, flops, result = row
            assert params == f'{meta["Parameters (M)"]:.2f}M'
            whole, backbone = (float(f.rstrip('G')) for f in flops.split(' / '))
            assert backbone == meta['GFLOPs (backbone+neck)']
            assert whole == meta.get('GFLOPs (no mask head)', meta['GFLOPs'])
            assert all(number in metrics for number in re.findall(r'\d+\.\d', result))
        checked += 1
    assert checked == 7


@pytest.mark.slow
def test_quick_start_commands_run(tmp_path):
    """The quick start's commands, each as written with only ``SMALL``'s options appended, in a folder of the
    user's own (``tools`` and ``configs`` linked in), one after the other as a user types them: bash reads each
    line into words, and the python command they make runs."""
    (block,) = code_blocks('bash', 'Quick start')
    for name in ('tools', 'configs'):
        (tmp_path / name).symlink_to(ROOT / name)
    env = dict(os.environ, OMP_NUM_THREADS='1')
    commands = [line.split('  #')[0].strip() for line in block.splitlines() if line.strip()]
    assert len(commands) == 6
    for command in commands:
        # the words bash makes of the line as typed, then that python command (the venv's python, the one on a
        # user's PATH after `make demo`)
        words = typed_words(command, tmp_path, env)
        assert words[0] == 'python', command
        res = run_python([*words[1:], *SMALL.get(words[1], [])], cwd=tmp_path, env=env, timeout=600)
        assert res.returncode == 0, f'{command}\n{res.stdout[-2000:]}\n{res.stderr[-3000:]}'
    assert len(list((tmp_path / 'work_dirs').glob('*/iter_1.pth'))) == 4


def test_quick_start_python_runs_as_written():
    """The quick start's Python blocks, in one fresh interpreter as a user pastes them, then their results
    checked."""
    blocks = code_blocks('python', 'Quick start')
    assert len(blocks) == 2
    check = ("\nassert [tuple(m.shape) for m in maps] == [(1, 192, 14, 20)] * 4"
             "\nassert tuple(logits.shape) == (2, 10)\n")
    res = subprocess.run([sys.executable, '-c', '\n'.join(blocks) + check], cwd=ROOT, capture_output=True, text=True,
                         env=dict(os.environ, OMP_NUM_THREADS='1'))
    assert res.returncode == 0, res.stderr[-3000:]
