"""The MLP's second projection with GELU recomputed in the backward pass: the same values and gradients as
linear(GELU(h)) through autograd, and one hidden tensor fewer kept for the backward pass."""
import math

import pytest
import torch

from mmwf.models.layers import gelu_linear


def gelu(h: torch.Tensor, approximate: str) -> torch.Tensor:
    """GELU written out: exact (erf) or its tanh approximation."""
    if approximate == 'tanh':
        return 0.5 * h * (1 + torch.tanh(math.sqrt(2 / math.pi) * (h + 0.044715 * h ** 3)))
    return 0.5 * h * (1 + torch.erf(h / math.sqrt(2)))


@pytest.mark.parametrize('approximate', ['none', 'tanh'])
@pytest.mark.parametrize('bias', [True, False])
def test_values_and_gradients_equal_the_formula(approximate, bias):
    linear = torch.nn.Linear(12, 5, bias=bias).double()
    h = torch.randn(2, 7, 12, dtype=torch.float64, requires_grad=True)
    out = gelu_linear(h, linear, approximate)
    expected = gelu(h, approximate) @ linear.weight.T + (linear.bias if bias else 0)
    assert torch.allclose(out, expected, rtol=1e-12, atol=1e-12)
    weights = torch.randn_like(out)
    inputs = (h, *linear.parameters())
    grads = torch.autograd.grad((out * weights).sum(), inputs)
    ref = torch.autograd.grad((expected * weights).sum(), inputs)
    assert all(torch.allclose(g, r, rtol=1e-10, atol=1e-12) for g, r in zip(grads, ref))
    frozen = torch.nn.Linear(12, 5).double().requires_grad_(False)  # only h's gradient asked for
    (g,) = torch.autograd.grad(gelu_linear(h, frozen, approximate).sum(), h)
    (r,) = torch.autograd.grad((gelu(h, approximate) @ frozen.weight.T).sum(), h)
    assert torch.allclose(g, r, rtol=1e-10, atol=1e-12)


def saved_bytes(fn) -> int:
    """Bytes of the tensors autograd keeps for the backward pass of ``fn()`` (the parameters excluded)."""
    kept = []

    def pack(t):
        if not isinstance(t, torch.nn.Parameter):
            kept.append(t.numel() * t.element_size())
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sum(kept)


def test_keeps_one_hidden_tensor_fewer():
    linear = torch.nn.Linear(64, 16)
    h = torch.randn(4, 10, 64, requires_grad=True)
    hidden = h.numel() * h.element_size()
    ours = saved_bytes(lambda: gelu_linear(h, linear, 'tanh'))
    plain = saved_bytes(lambda: linear(torch.nn.functional.gelu(h, approximate='tanh')))
    assert ours == hidden and plain >= 2 * hidden


@pytest.mark.parametrize('dtype', [torch.bfloat16, torch.float16], ids=['bf16', 'fp16'])
@pytest.mark.parametrize('approximate', ['none', 'tanh'])
def test_autocast_backward_matches_autograd_of_the_same_autocast_pass(approximate, dtype):
    """Under autocast (CPU here; CUDA takes the same casts) the recomputing backward gives autograd's gradients of
    linear(GELU(h)) under the same autocast, in the dtypes autograd gives them (the parameters' and h's), to one
    rounding of the low precision; and both are within a few of its roundings of fp32's."""
    linear = torch.nn.Linear(64, 32)
    h = torch.randn(4, 9, 64, requires_grad=True)
    weights = torch.randn(4, 9, 32)

    def grads(fn, autocast):
        with torch.autocast('cpu', dtype=dtype, enabled=autocast):
            out = fn()
        return out, torch.autograd.grad((out.float() * weights).sum(), (h, *linear.parameters()))
    out, ours = grads(lambda: gelu_linear(h, linear, approximate), True)
    ref_out, theirs = grads(lambda: linear(torch.nn.functional.gelu(h, approximate=approximate)), True)
    _, exact = grads(lambda: linear(torch.nn.functional.gelu(h, approximate=approximate)), False)
    u = torch.finfo(dtype).eps / 2
    assert out.dtype == ref_out.dtype == dtype and torch.equal(out, ref_out)
    for g, r, e, leaf in zip(ours, theirs, exact, (h, *linear.parameters())):
        assert g.dtype == r.dtype == leaf.dtype
        assert (g - r).norm() <= 2 * u * r.norm()
        assert (g - e).norm() <= 8 * u * e.norm()
