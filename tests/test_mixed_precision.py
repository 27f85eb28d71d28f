"""CPU stand-ins for the CUDA tests' mixed-precision checks (tests/test_cuda.py): the same comparisons of autocast
against fp32, in training mode and with the same bounds in unit roundoffs, run on the CPU in bfloat16 and float16,
so that their maths has run before a GPU sees it."""
import pytest
import torch

from mmwf.models.backbones import DeiT, WeightFormer
from tests.mixed_precision import Denoising, check_autocast, run, shifted_denoiser

DTYPES = pytest.mark.parametrize('dtype', [torch.bfloat16, torch.float16], ids=['bf16', 'fp16'])


@DTYPES
def test_weightformer_autocast_on_cpu_matches_fp32(dtype):
    check_autocast(WeightFormer('t', out_indices=(4, 8, 12, 16)), torch.randn(2, 3, 64, 64), dtype)


@DTYPES
def test_deit_autocast_on_cpu_matches_fp32(dtype):
    check_autocast(DeiT('t', with_cls_token=False), torch.randn(2, 3, 64, 64), dtype)


@pytest.mark.slow
@pytest.mark.parametrize('family', ['WeightFormerDiT', 'DiT'])
def test_denoiser_bf16_autocast_with_checkpointing_on_cpu_matches_fp32(family):
    """bf16 only: CPU fp16 kernels are ten times slower, and fp16's backbone check above runs the same casts."""
    dtype = torch.bfloat16
    check_autocast(Denoising(shifted_denoiser(family, 'S', with_cp=True, input_size=16)), torch.randn(4, 4, 16, 16),
                   dtype)


def test_training_mode_passes_draw_the_same_label_dropout():
    """The comparison is deterministic: two fp32 passes of a denoiser in training mode (label dropout 0.1 drawn
    in each) agree exactly, and the draws matter (with other draws the output differs)."""
    model = Denoising(shifted_denoiser('WeightFormerDiT', 'S', class_dropout_prob=0.5, input_size=16)).train()
    x = torch.randn(8, 4, 16, 16)
    first, second = run(model, x, None), run(model, x, None)
    assert torch.equal(first[0], second[0]) and torch.equal(first[1], second[1])
    torch.manual_seed(1)
    with torch.no_grad():
        other = model(x).float()
    assert not torch.equal(other, first[0])


def test_the_bounds_refuse_a_pass_less_precise_than_the_dtype():
    """The bounds can fail: a network whose autocast pass rounds each of its 40 layers' outputs to float8 (2
    mantissa bits, not bfloat16's 7) is refused."""
    class Lossy(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = torch.nn.ModuleList(torch.nn.Linear(64, 64) for _ in range(40))

        def forward(self, x):
            for layer in self.layers:
                x = layer(x)
                if torch.is_autocast_enabled('cpu'):
                    x = x.to(torch.float8_e5m2).to(x.dtype)
            return x
    with pytest.raises(AssertionError):
        check_autocast(Lossy(), torch.randn(8, 64), torch.bfloat16)
