import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_upernet_table_against_the_paper():
    res = subprocess.run([sys.executable, 'tools/analysis/get_flops.py', 'configs/upernet_wf_t_ade20k.py', '--paper'],
                         cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-3000:]
    rows = {r.split('|')[3].strip(): [c.strip() for c in r.split('|')[1:-1]]
            for r in res.stdout.splitlines() if r.startswith('| upernet_wf_t_ade20k')}
    assert rows.keys() == {'backbone', 'backbone+neck', 'whole'}
    assert rows['backbone+neck'][4] == '6.8' and rows['backbone+neck'][5] == '7 (-3.0%)'
    assert rows['whole'][3] == '12.08' and rows['whole'][4] == '37.4'
    assert rows['whole'][5].startswith('38 (-1.5%)')


@pytest.mark.slow
def test_cascade_box_path_reproduces_the_paper_total():
    """Table 4's totals are backbone + pyramid + RPN + the three box heads on 1000 proposals (no mask head)."""
    res = subprocess.run([sys.executable, 'tools/analysis/get_flops.py', 'configs/cascade_wf_t_coco.py', '--paper',
                          '--detections', '0'], cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-3000:]
    rows = {r.split('|')[3].strip(): [c.strip() for c in r.split('|')[1:-1]]
            for r in res.stdout.splitlines() if r.startswith('| cascade_wf_t_coco')}
    assert float(rows['whole'][4]) == pytest.approx(566, rel=0.01)
    assert rows['whole'][3] == '59.26'  # one mask head
    assert float(rows['backbone+neck'][4]) == pytest.approx(77, rel=0.01)
