"""mmwf's Triton kernels compiled ahead of time for sm_80 (A100) and sm_90a (H100 / H200) on the CPU, with no GPU and
no driver (``mmwf.models.layers.triton_targets``): every specialization the layers reach compiles, spills nothing,
and uses the tensor cores exactly where its dtype has them; the taps' gradient has no reduction across threads in
its loop (at most its epilogue's barriers); and docs/gpu.md's table is what the code compiles to.

Slow: compiling the 78 (specialization, target) pairs cold takes minutes of CPU (about 90 s, K = 7 most); with
Triton's cache warm (it keeps the facts beside each kernel) about 6 s of CPU."""
import re
from pathlib import Path

import pytest

from mmwf.models.layers import triton_targets

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[3]
DOC = ROOT / 'docs' / 'gpu.md'
# shared memory a program may take (bytes): the opt-in maximum per block of an A100, of an H100 / H200
SHARED_LIMIT = {'sm_80': 163 * 1024, 'sm_90a': 227 * 1024}


@pytest.fixture(scope='module')
def facts():
    return triton_targets.facts()


def test_every_specialization_compiles_for_both_targets(facts):
    """The conv's three kernels at K 3, 5 and 7 in fp32, bf16 and fp16, and the linear in fp32, TF32, bf16 and fp16
    at each of its tiles, each for sm_80 and sm_90a."""
    found = {(f.kernel, f.specialization, f.target) for f in facts}
    assert len(found) == len(facts)
    for target in triton_targets.TARGETS:
        for ks in (3, 5, 7):
            for dtype in ('fp32', 'bf16', 'fp16'):
                for kernel, what in (('dwconv_tokens', 'forward'), ('dwconv_tokens', 'input grad'),
                                     ('dwconv_taps_grad', 'taps grad')):
                    assert (kernel, f'{what} K={ks} {dtype}', target) in found
        linear = {f.specialization.split()[0] for f in facts if f.kernel == 'low_rank_linear' and f.target == target}
        assert linear == {'fp32', 'tf32', 'bf16', 'fp16'}
    tiles = {f.specialization.split()[1] for f in facts if f.kernel == 'low_rank_linear'}
    assert tiles == {'64x64x32', '128x64x32', '64x128x32', '128x128x32'}  # the autotuner's


def test_no_specialization_spills_or_outgrows_its_target(facts):
    for f in facts:
        assert f.spill_stores == f.spill_loads == 0, f
        assert 0 < f.registers <= 255 and f.shared <= SHARED_LIMIT[f.target], f


def test_tensor_cores_exactly_where_the_dtype_has_them(facts):
    """TF32, bf16 and fp16 dots on the tensor cores (mma.sync: HMMA on sm_80; wgmma: HGMMA on sm_90a); fp32 without
    TF32 on the FMA units, and the depthwise conv (no dot) without them."""
    for f in facts:
        dtype = f.specialization.split()[0]
        if f.kernel == 'low_rank_linear' and dtype in ('tf32', 'bf16', 'fp16'):
            assert f.mma > 0 and f.ptx_mma == {'sm_80': 'mma', 'sm_90a': 'wgmma'}[f.target], f
        else:
            assert f.mma == 0 and f.ptx_mma == '-', f


def test_the_taps_gradient_does_not_reduce_across_threads_in_its_loop(facts):
    """The taps' gradient sums over the tokens in its loop, elementwise per tap: in fp32 it has no barrier at all,
    in bf16 / fp16 only its epilogue's (the sums' layout changed once for the store), at most one per 8 taps
    (reduced across warps per tap and 32-token step, it took 36 to 204 bar.sync)."""
    for f in facts:
        if f.kernel == 'dwconv_taps_grad':
            ks = int(re.search(r'K=(\d)', f.specialization).group(1))
            assert f.barriers == 0 if f.specialization.endswith('fp32') else f.barriers <= -(-ks * ks // 8), f


def test_the_docs_table_is_what_the_code_compiles_to(facts):
    """docs/gpu.md's table between its markers is ``python -m mmwf.models.layers.triton_targets``'s output: a change
    to a kernel, its tiles or Triton shows here (rerun the command and paste its table)."""
    text = DOC.read_text()
    found = re.search(r'<!-- triton_targets -->\n(.*?)\n<!-- /triton_targets -->', text, re.DOTALL)
    assert found, 'docs/gpu.md has no <!-- triton_targets --> table'
    assert found.group(1).strip() == triton_targets.table(facts)
