"""tools/analysis/get_flops.py prints the library's counts (which tests/test_model_index.py checks against every
metafile entry) beside the paper's figures read from the metafiles."""
from pathlib import Path

import pytest

from mmwf.configs import metafile_models
from tests.tool_runner import run_tool

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_get_flops_prints_the_metafile_counts_beside_the_papers():
    res = run_tool('tools/analysis/get_flops.py', 'weightformer_t', 'configs/upernet_wf_t_ade20k.py', '--paper')
    rows = {tuple(c.strip() for c in r.split('|')[1:4]): [c.strip() for c in r.split('|')[4:-1]]
            for r in res.stdout.splitlines() if r.startswith(('| weightformer_t', '| upernet'))}
    models = metafile_models()
    wf, upernet = models['weightformer_t_in1k']['Metadata'], models['upernet_wf_t_ade20k']['Metadata']

    def close(printed, ours, figure):
        """``printed`` is 'figure (+x.y%)' with the x.y of ``ours`` (as printed, to its last decimal) against it."""
        value, percent = printed.split(' (')
        implied = figure * (1 + float(percent.rstrip('%)')) / 100)
        return float(value) == figure and abs(implied - ours) <= 0.05 + figure * 0.0005

    params, flops, versus = rows['weightformer_t', '224x224', 'classifier']
    assert (float(params), float(flops)) == (wf['Parameters (M)'], wf['GFLOPs'])
    versus_flops, versus_params = versus.split('; params ')
    assert close(versus_flops, float(flops), wf['Paper GFLOPs'])
    assert close(versus_params, float(params), wf['Paper Parameters (M)'])
    assert {part for *_, part in rows if _[0] == 'upernet_wf_t_ade20k'} == {'backbone', 'backbone+neck', 'whole'}
    params, flops, versus = rows['upernet_wf_t_ade20k', '512x512', 'whole']
    assert (float(params), float(flops)) == (upernet['Parameters (M)'], upernet['GFLOPs'])
    assert close(versus.split('; ')[0], float(flops), upernet['Paper GFLOPs'])
    _, flops, versus = rows['upernet_wf_t_ade20k', '512x512', 'backbone+neck']
    assert float(flops) == upernet['GFLOPs (backbone+neck)']
    assert close(versus, float(flops), upernet['Paper GFLOPs (backbone+neck)'])
