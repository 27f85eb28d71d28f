"""The engine split: the mixers timed are the block's own branches, the crossover interpolation, and the tool."""
import math
from pathlib import Path

import pytest
import torch

from mmwf.analysis.engine_split import block_engines, crossover
from tests.tool_runner import run_tool

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize('name', ['deit_t_softmax', 'deit_t_mhla', 'weightformer_t'])
def test_the_mixers_compose_to_the_block(name):
    hw = (6, 4)
    block, token, channel = block_engines(name, hw)
    x = torch.randn(2, hw[0] * hw[1], block.norm2.normalized_shape[0])
    with torch.no_grad():
        z = block.norm1(x)
        # a WeightFormer dynamic block normalises the stream first
        mixed = (z if name == 'weightformer_t' else x) + token(z)
        assert torch.allclose(block(x, hw), mixed + channel(block.norm2(mixed)), atol=1e-5)
    if name == 'weightformer_t':  # the first dynamic block's
        assert type(block.dwc).__name__ == 'AdaptiveDynamicDWConv'


def test_crossover_interpolates_the_log_ratio_in_log_length():
    lengths = [100, 400, 1600]
    # ratios 1/2, 2, 8: log-ratio -ln2 at 100 and +ln2 at 400, so the sign changes halfway in log length
    assert crossover(lengths, [1, 4, 16], [2, 2, 2]) == pytest.approx(math.sqrt(100 * 400))
    assert crossover(lengths, [3, 4, 16], [2, 2, 2]) == 100  # above at every length
    assert crossover(lengths, [1, 1, 1], [2, 2, 2]) is None
    # above at the first length only (equal engines, noise): no crossover; above, below, above: the last rise
    assert crossover(lengths, [3, 1, 1], [2, 2, 2]) is None
    assert crossover(lengths, [3, 1, 4], [2, 2, 2]) == pytest.approx(math.sqrt(400 * 1600))


def test_tool_prints_both_modes_and_plots(tmp_path):
    res = run_tool('tools/analysis/benchmark.py', 'engine-split', '--models', 'deit_t_softmax', 'weightformer_t',
                   '--sizes', '64', '128', '--rounds', '1', '--plot', tmp_path / 'split.png')
    rows = [r for r in res.stdout.splitlines() if r.startswith(('| deit_t', '| weightformer_t'))]
    assert len(rows) == 4 and 'softmax attention' in rows[0] and 'dynamic DWConv' in rows[1]
    for row in rows:
        cells = [c.strip() for c in row.split('|')[3:5]]
        assert all(float(t) > 0 and float(c) > 0 for t, c in (cell.split(' / ') for cell in cells))
    assert (tmp_path / 'split.png').stat().st_size > 10_000
