import subprocess
import sys
from pathlib import Path

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
