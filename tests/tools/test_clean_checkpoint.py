from pathlib import Path

import pytest
import torch

from tests.tool_runner import run_tool

ROOT = Path(__file__).resolve().parents[2]
TOOL = ROOT / 'tools/model_converters/clean_checkpoint.py'


def run(*args):
    return run_tool(TOOL, *args, ok=None)


@pytest.mark.slow
def test_training_checkpoint_needs_trust_and_comes_out_weights_only(tmp_path):
    src, dst = tmp_path / 'ckpt_epoch_299.pth', tmp_path / 'clean.pth'
    # an argparse.Namespace stands in for the release's pickled yacs CfgNode: a non-tensor Python object
    import argparse
    torch.save({'model': {'blocks.0.dwc.weight': torch.ones(2)}, 'config': argparse.Namespace(lr=1),
                'epoch': 299}, src)
    with pytest.raises(Exception, match='Unsupported global'):
        torch.load(src, weights_only=True)
    refused = run(src, dst)
    assert refused.returncode != 0 and '--trust-source' in refused.stderr and not dst.exists()
    done = run(src, dst, '--trust-source')
    assert done.returncode == 0, done.stderr
    clean = torch.load(dst, weights_only=True)
    assert torch.equal(clean['state_dict']['blocks.0.dwc.weight'], torch.ones(2))


def test_missing_source_is_named(tmp_path):
    res = run(tmp_path / 'nope.pth', tmp_path / 'out.pth')
    assert res.returncode != 0 and 'nope.pth' in res.stderr
