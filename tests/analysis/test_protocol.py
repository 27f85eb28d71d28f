"""The benchmarks' protocol sets torch's TF32 and cuDNN autotuner settings for its block and puts them back."""
import pytest
import torch

from mmwf.analysis.protocol import Protocol
from mmwf.utils.tf32_settings import cudnn_tf32, matmul_tf32


@pytest.mark.parametrize('tf32', [True, False])
def test_backends_are_the_protocols_for_the_block(tf32):
    before = (matmul_tf32(), cudnn_tf32(), torch.backends.cudnn.benchmark, torch.backends.cuda.matmul.fp32_precision,
              torch.backends.cudnn.conv.fp32_precision)
    with Protocol(tf32=tf32, cudnn_benchmark=not before[2]).backends():
        assert (matmul_tf32(), cudnn_tf32(), torch.backends.cudnn.benchmark) == (tf32, tf32, not before[2])
        assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == (tf32, tf32)
    assert (matmul_tf32(), cudnn_tf32(), torch.backends.cudnn.benchmark, torch.backends.cuda.matmul.fp32_precision,
            torch.backends.cudnn.conv.fp32_precision) == before
