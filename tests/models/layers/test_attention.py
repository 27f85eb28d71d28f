"""Linear-attention operators against explicit quadratic references; TTT's closed form against autograd;
grids, fp16, linear cost."""
import pytest
import torch
import torch.nn.functional as F

from mmwf.models.layers import (
    OPERATORS,
    ELUAttention,
    InLineAttention,
    MHLAttention,
    ReLUAttention,
    TTTAttention,
    partition,
    unpartition,
)
from mmwf.models.layers.attention import block_distance_mixing, split_heads
from mmwf.models.layers.ttt_attention import dwconv_inner_grad, swiglu_inner_grads
from tests.cost import TensorShapes, saved_bytes

DIM, HEADS = 48, 3
LINEAR = [c for n, c in OPERATORS.items() if n != 'softmax']


def qkv_of(attn, x):
    return split_heads(attn.qkv(x), attn.num_heads)


def explicit(attn_map, v):
    """Quadratic evaluation: the N x N map times V, per head."""
    return attn_map @ v


@pytest.mark.parametrize('op, phi', [(ELUAttention, lambda t: F.elu(t) + 1), (ReLUAttention, F.relu)])
def test_kernel_attention_equals_normalised_map(op, phi):
    attn = op(DIM, HEADS).double()
    x = torch.randn(2, 1 + 5 * 7, DIM, dtype=torch.float64)
    q, k, v = qkv_of(attn, x)
    a = phi(q) @ phi(k).transpose(-2, -1)
    ref = explicit(a / (a.sum(-1, keepdim=True) + attn.eps), v)
    torch.testing.assert_close(attn.mix(q, k, v, (5, 7)), ref, rtol=1e-10, atol=1e-12)
    out = attn(x, (5, 7))
    torch.testing.assert_close(out, attn.proj(ref.transpose(1, 2).reshape(2, -1, DIM)), rtol=1e-10, atol=1e-12)


def test_inline_equals_its_map_whose_rows_sum_to_one():
    attn = InLineAttention(DIM, HEADS).double()
    x = torch.randn(2, 1 + 4 * 6, DIM, dtype=torch.float64)
    q, k, v = qkv_of(attn, x)
    N, s = x.shape[1], attn.head_dim ** -0.5
    kbar = k.mean(-2, keepdim=True)
    a = (s / N) * q @ k.transpose(-2, -1) + (1 - s * q @ kbar.transpose(-2, -1)) / N
    torch.testing.assert_close(a.sum(-1), torch.ones_like(a[..., 0]))
    torch.testing.assert_close(attn.mix(q, k, v, (4, 6)), explicit(a, v), rtol=1e-10, atol=1e-12)


def blockwise_reference(attn, x, hw):
    """Per-block ReLU(+1e-6) linear attention plus the 5x5 depthwise conv of v (MHLA with M = I), computed
    block by block on the unpadded grid (blocks of ceil(H/2) x ceil(W/2), the last ones smaller)."""
    B, N, C = x.shape
    H, W = hw
    q, k, v = qkv_of(attn, x)
    phi = [F.relu(t) + 1e-6 for t in (q, k)]
    grid = torch.arange(N).reshape(H, W)
    bh, bw = -(-H // 2), -(-W // 2)
    out = torch.zeros_like(v)
    for rows in (slice(0, bh), slice(bh, H)):
        for cols in (slice(0, bw), slice(bw, W)):
            idx = grid[rows, cols].flatten()
            if idx.numel() == 0:
                continue
            qb, kb, vb = phi[0][:, :, idx], phi[1][:, :, idx], v[:, :, idx]
            a = qb @ kb.transpose(-2, -1)
            out[:, :, idx] = a @ vb / (a.sum(-1, keepdim=True) + 1e-6)
    out = out.transpose(1, 2).reshape(B, N, C)
    lepe = attn.lepe(v.transpose(1, 2).reshape(B, N, C).transpose(1, 2).reshape(B, C, H, W))
    return attn.proj(out + lepe.flatten(2).transpose(1, 2))


@pytest.mark.parametrize('hw', [(6, 8), (7, 9), (3, 1)])
@pytest.mark.parametrize('normalizer', ['official', 'textbook'])
def test_mhla_with_identity_mixing_is_blockwise_linear_attention(hw, normalizer):
    attn = MHLAttention(DIM, HEADS, normalizer=normalizer).double()
    with torch.no_grad():
        attn.block_mixing.copy_(torch.eye(4))
    x = torch.randn(2, hw[0] * hw[1], DIM, dtype=torch.float64)
    torch.testing.assert_close(attn(x, hw), blockwise_reference(attn, x, hw), rtol=1e-9, atol=1e-10)


def mhla_loop_reference(q, k, v, hw, blocks, m, normalizer):
    """MHLA's mixing written token by token (fp64): the grid zero-padded to P_h x P_w blocks of ceil(H / P_h) x
    ceil(W / P_w); per block p, S_p = sum phi(k) v^T and z_p = sum phi(k) over its real tokens; token t at in-block
    position i of block p gets phi(q_t)^T (sum_p' M[p, p'] S_p') / (n + 1e-6), with n the ``'official'``
    sum_p' M[p, p'] phi(q_{p', i})^T z_p' (0 where block p' has no token at i) or the ``'textbook'``
    phi(q_t)^T sum_p' M[p, p'] z_p'."""
    H, W = hw
    (ph, pw), (bh, bw) = blocks, (-(-H // blocks[0]), -(-W // blocks[1]))
    phi_q, phi_k = F.relu(q) + 1e-6, F.relu(k) + 1e-6

    def token(p, i):  # raster index of in-block position i of block p, or None when it is padding
        r, c = (p // pw) * bh + i // bw, (p % pw) * bw + i % bw
        return r * W + c if r < H and c < W else None
    P, n = ph * pw, bh * bw
    S = [sum(phi_k[..., t, :, None] * v[..., t, None, :] for t in map(lambda i: token(p, i), range(n)) if t is not None)
         for p in range(P)]
    z = [sum(phi_k[..., t, :] for t in map(lambda i: token(p, i), range(n)) if t is not None) for p in range(P)]
    out = torch.zeros_like(v)
    for p in range(P):
        mixed_s = sum(m[p, p2] * S[p2] for p2 in range(P))
        for i in range(n):
            t = token(p, i)
            if t is None:
                continue
            if normalizer == 'official':
                den = sum(m[p, p2] * (phi_q[..., token(p2, i), :] * z[p2]).sum(-1) for p2 in range(P)
                          if token(p2, i) is not None)
            else:
                den = (phi_q[..., t, :] * sum(m[p, p2] * z[p2] for p2 in range(P))).sum(-1)
            out[..., t, :] = (phi_q[..., t, :, None] * mixed_s).sum(-2) / (den[..., None] + 1e-6)
    return out


@pytest.mark.parametrize('hw', [(6, 8), (7, 9)])
@pytest.mark.parametrize('normalizer', ['official', 'textbook'])
def test_mhla_mixing_and_normalisers_equal_a_token_by_token_reference(hw, normalizer):
    attn = MHLAttention(DIM, HEADS, normalizer=normalizer).double()
    with torch.no_grad():
        attn.block_mixing.copy_(torch.rand(4, 4, dtype=torch.float64))  # a non-symmetric mixing matrix
    q, k, v = qkv_of(attn, torch.randn(2, hw[0] * hw[1], DIM, dtype=torch.float64))
    ref = mhla_loop_reference(q, k, v, hw, attn.blocks, attn.block_mixing.detach(), normalizer)
    torch.testing.assert_close(attn.mix(q, k, v, hw), ref, rtol=1e-9, atol=1e-11)


def test_mhla_normalisers_differ_with_mixing_and_partition_round_trips():
    x = torch.randn(1, 48, DIM, dtype=torch.float64)
    official = MHLAttention(DIM, HEADS, normalizer='official').double()
    textbook = MHLAttention(DIM, HEADS, normalizer='textbook').double()
    textbook.load_state_dict(official.state_dict())
    assert (official(x, (6, 8)) - textbook(x, (6, 8))).abs().max() > 1e-3
    t = torch.randn(2, 3, 7 * 9, 5)
    block = official.block_size((7, 9))
    blocks = partition(t, (7, 9), block, official.blocks)
    assert block == (4, 5) and blocks.shape == (2, 3, 4, 20, 5)
    torch.testing.assert_close(unpartition(blocks, (7, 9), block, official.blocks), t, rtol=0, atol=0)


def test_mhla_mixing_init_matches_the_release_values():
    m = block_distance_mixing((2, 2), 'cos')
    torch.testing.assert_close(m[0], torch.tensor([0.2936, 0.2494, 0.2494, 0.2076]), atol=1e-4, rtol=0)
    torch.testing.assert_close(block_distance_mixing((2, 2), 'linear')[0],
                               torch.tensor([0.6306, 0.1847, 0.1847, 0.0]), atol=1e-4, rtol=0)
    torch.testing.assert_close(m.sum(0), torch.ones(4))


def test_ttt_swiglu_closed_form_gradients_equal_autograd():
    B, h, N, d, s = 2, 3, 11, 8, 1 / 3
    k, v = torch.randn(B, h, N, d, dtype=torch.float64), torch.randn(B, h, N, d, dtype=torch.float64)
    w1, w2 = torch.randn(1, h, d, d, dtype=torch.float64), torch.randn(1, h, d, d, dtype=torch.float64)
    W1 = w1.expand(B, h, d, d).clone().requires_grad_()
    W2 = w2.expand(B, h, d, d).clone().requires_grad_()
    loss = -(s / N) * (((k @ W1) * F.silu(k @ W2)) * v).sum()
    a1, a2 = torch.autograd.grad(loss, (W1, W2))
    g1, g2 = swiglu_inner_grads(k, v, w1, w2, s)
    torch.testing.assert_close(g1, a1, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(g2, a2, rtol=1e-10, atol=1e-12)


def test_ttt_dwconv_closed_form_gradient_equals_autograd():
    B, d, H, W, s = 2, 4, 6, 10, 1 / 3
    k, v = torch.randn(B, d, H, W, dtype=torch.float64), torch.randn(B, d, H, W, dtype=torch.float64)
    w3 = torch.randn(d, 1, 3, 3, dtype=torch.float64)
    W3 = w3.expand(B, d, 1, 3, 3).clone().requires_grad_()
    out = F.conv2d(k.reshape(1, B * d, H, W), W3.reshape(B * d, 1, 3, 3), padding=1, groups=B * d)
    loss = -(s / (H * W)) * (out.reshape(B, d, H, W) * v).sum()
    (auto,) = torch.autograd.grad(loss, W3)
    torch.testing.assert_close(dwconv_inner_grad(k, v, s), auto.squeeze(2), rtol=1e-10, atol=1e-12)


def test_ttt_forward_is_one_autograd_inner_step_of_each_inner_model():
    """TTT end to end against a reference that takes the inner gradients with autograd, per sample: the SwiGLU
    fast weights and the 3 x 3 kernel each take one clipped step (eta = 1) on the image's own keys and values, then
    run on its queries; the two heads' outputs are concatenated into proj."""
    attn = TTTAttention(DIM, HEADS).double()
    with torch.no_grad():
        for w in (attn.w1, attn.w2, attn.w3):
            w.normal_(0, 0.3)  # large enough that the step changes the output
    (H, W), B, C, h = (5, 6), 2, DIM, HEADS
    d, s, N = C // h, attn.scale, H * W
    x = torch.randn(B, N, C, dtype=torch.float64)
    qkv = attn.qkv(x)
    outputs = []
    for b in range(B):
        heads = qkv[b, :, :3 * C].reshape(N, 3, h, d)
        q, k, v = (heads[:, j].transpose(0, 1) for j in range(3))  # (h, N, d)
        w1 = attn.w1[0].detach().clone().requires_grad_()
        w2 = attn.w2[0].detach().clone().requires_grad_()
        with torch.enable_grad():
            loss = -(s / N) * (((k.detach() @ w1) * F.silu(k.detach() @ w2)) * v.detach()).sum()
            g1, g2 = torch.autograd.grad(loss, (w1, w2))
        w1 = attn.w1[0] - g1 / (g1.norm(dim=-2, keepdim=True) + 1)
        w2 = attn.w2[0] - g2 / (g2.norm(dim=-2, keepdim=True) + 1)
        o1 = ((q @ w1) * F.silu(q @ w2)).transpose(0, 1).reshape(N, C)
        q2, k2, v2 = (qkv[b, :, 3 * C + j * d:3 * C + (j + 1) * d].T.reshape(1, d, H, W) for j in range(3))
        w3 = attn.w3.detach().clone().requires_grad_()
        with torch.enable_grad():
            loss = -(s / N) * (F.conv2d(k2.detach(), w3, padding=1, groups=d) * v2.detach()).sum()
            (g3,) = torch.autograd.grad(loss, w3)
        w3 = attn.w3 - g3 / (g3.flatten(1).norm(dim=1)[:, None, None, None] + 1)
        o2 = F.conv2d(q2, w3, padding=1, groups=d)[0].flatten(1).T
        outputs.append(attn.proj(torch.cat([o1, o2], -1)))
    torch.testing.assert_close(attn(x, (H, W)), torch.stack(outputs), rtol=1e-9, atol=1e-11)


def test_ttt_layout_and_inner_step():
    """qkv has 3C + 3d rows and proj C + d inputs; the output depends on the inner step (w1 matters even
    though it is not a projection of x)."""
    attn = TTTAttention(DIM, HEADS)
    d = DIM // HEADS
    assert attn.qkv.weight.shape == (3 * DIM + 3 * d, DIM) and attn.proj.weight.shape == (DIM, DIM + d)
    x = torch.randn(2, 6 * 10, DIM)
    out = attn(x, (6, 10))
    with torch.no_grad():
        attn.w1.mul_(2)
    assert (attn(x, (6, 10)) - out).abs().max() > 1e-4
    with pytest.raises(ValueError, match='no class token'):
        attn(torch.randn(2, 61, DIM), (6, 10))


@pytest.mark.parametrize('op', LINEAR)
def test_non_square_grids_forward_backward(op):
    attn = op(DIM, HEADS)
    for hw in [(5, 9), (1, 7), (8, 3)]:
        x = torch.randn(2, hw[0] * hw[1], DIM, requires_grad=True)
        out = attn(x, hw)
        assert out.shape == x.shape
        out.square().mean().backward()
        assert torch.isfinite(x.grad).all()
        assert all(torch.isfinite(p.grad).all() for p in attn.parameters())
        attn.zero_grad()


@pytest.mark.parametrize('op', LINEAR)
def test_fp16_at_64x64_tokens_is_finite(op):
    attn = op(192, 3)
    x = (torch.randn(1, 64 * 64, 192) * 10).requires_grad_()
    with torch.autocast('cpu', dtype=torch.float16):
        out = attn(x, (64, 64))
    out.float().square().mean().backward()
    assert torch.isfinite(out).all() and torch.isfinite(x.grad).all()


@pytest.mark.parametrize('op', LINEAR)
def test_cost_is_linear_in_tokens(op):
    """No intermediate with two dims >= N, and saved-for-backward bytes grow 4x with 4x tokens."""
    attn = op(DIM, HEADS)
    n = 24
    with TensorShapes() as mode:
        attn(torch.randn(1, n * n, DIM, requires_grad=True), (n, n)).sum().backward()
    assert not [s for s in mode.shapes if sum(d >= n * n for d in s) >= 2]
    sizes = [saved_bytes(lambda n=n: attn(torch.randn(1, n * n, DIM, requires_grad=True), (n, n)).sum())
             for n in (16, 32, 64)]
    assert (sizes[2] - sizes[1]) / (sizes[1] - sizes[0]) == pytest.approx(4.0, rel=0.05)
