"""The paper's and the release's equations in plain tensor maths, written once for every test that compares mmwf with
them, and the one way the tests move weights off their initial values.

- The dynamic layers (Table 1: eqs. 4-8 of a dynamic linear, eqs. 10-13 of a dynamic depthwise conv) from their
  parameters, with no mmwf computation and no torch.nn.functional pooling or convolution (:func:`linear_delta`,
  :func:`dwconv_delta`); mmwf's classes name the variant only.
- The released networks from a state dict in the release's layout (docs/weightformer.md): the WeightFormer backbone
  and classifier (:func:`weightformer_forward`) and WF-DiT (:func:`wf_dit_forward`), both through the release's
  DynCnn and DynLinear (:func:`release_dynamic_dwconv`, :func:`release_dynamic_linear`).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from mmwf.models import layers


def randomised(module: torch.nn.Module, std: float = 1.0, *, around_init: bool = False, vector_mean: float = 0.0,
               seed: int = 0) -> torch.nn.Module:
    """Every parameter drawn from N(0, std^2) (1-D ones, norm gains and biases, around ``vector_mean``), or with
    ``around_init`` its initial value plus that noise, from a generator of its own (the process's seed untouched),
    so that no term of an equation hides behind a zero or unit init. The module, in place."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            noise = (torch.randn(p.shape, generator=g, dtype=torch.float64) * std).to(p)
            p.copy_(p + noise if around_init else noise + (vector_mean if p.dim() == 1 else 0))
    return module


# ---------------------------------------------------------------- plain operations
def silu(t: torch.Tensor) -> torch.Tensor:
    return t / (1 + torch.exp(-t))


def gelu(t: torch.Tensor) -> torch.Tensor:
    return 0.5 * t * (1 + torch.erf(t / 2 ** 0.5))


def token_grid(x: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
    """Tokens (B, H*W, C) -> (B, H, W, C)."""
    return x.reshape(x.shape[0], *hw, x.shape[-1])


def pool2(x: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
    """2 x 2 average pooling of the token grid, floor (the last odd row / column dropped), as tokens."""
    h, w = hw[0] // 2 * 2, hw[1] // 2 * 2
    g = token_grid(x, hw)[:, :h, :w]
    pooled = (g[:, 0::2, 0::2] + g[:, 1::2, 0::2] + g[:, 0::2, 1::2] + g[:, 1::2, 1::2]) / 4
    return pooled.reshape(x.shape[0], -1, x.shape[-1])


def adaptive_pool(m: torch.Tensor, k: int) -> torch.Tensor:
    """AAP of a map (B, C, H, W) to (B, C, k, k): bin i covers [floor(i H / k), ceil((i + 1) H / k))."""
    h, w = m.shape[-2:]
    out = torch.empty(*m.shape[:2], k, k, dtype=m.dtype)
    for i in range(k):
        for j in range(k):
            r0, r1 = (i * h) // k, -(-((i + 1) * h) // k)
            c0, c1 = (j * w) // k, -(-((j + 1) * w) // k)
            out[:, :, i, j] = m[:, :, r0:r1, c0:c1].mean((-2, -1))
    return out


def conv(m: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, groups: int = 1) -> torch.Tensor:
    """Zero-padded 'same' 2-D convolution by explicit shifts: m (B, Ci, H, W), weight (Co, Ci/groups, K, K)."""
    k = weight.shape[-1]
    p = k // 2
    padded = torch.zeros(*m.shape[:2], m.shape[2] + 2 * p, m.shape[3] + 2 * p, dtype=m.dtype)
    padded[:, :, p:p + m.shape[2], p:p + m.shape[3]] = m
    co, ci_g = weight.shape[:2]
    out = torch.zeros(m.shape[0], co, *m.shape[2:], dtype=m.dtype)
    for o in range(co):
        g = o // (co // groups)
        for u in range(k):
            for v in range(k):
                window = padded[:, g * ci_g:(g + 1) * ci_g, u:u + m.shape[2], v:v + m.shape[3]]
                out[:, o] += torch.einsum('bchw,c->bhw', window, weight[o, :, u, v])
    return out + (bias[None, :, None, None] if bias is not None else 0)


def unit_clip(dw: torch.Tensor) -> torch.Tensor:
    """The release's normalisation of a dynamic kernel (B, C, K, K): dW / (||dW||_F + 1) per channel."""
    return dw / (dw.flatten(2).norm(dim=-1)[..., None, None] + 1)


# ---------------------------------------------------------------- Table 1's dynamic layers, from their parameters
def linear_output(layer: torch.nn.Module, x: torch.Tensor, dw: torch.Tensor) -> torch.Tensor:
    """Eq. 3 with the release's normalisation: y = x (W0 + dW / (||dW||_col + 1)) + b."""
    weight = layer.w + dw / (dw.norm(dim=1, keepdim=True) + 1)
    return torch.einsum('bnc,bcd->bnd', x, weight) + layer.b


def linear_delta(layer: torch.nn.Module, x: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
    """dW of eqs. 4-8 from X (B, H*W, C) on the grid ``hw``."""
    n = x.shape[1]
    if isinstance(layer, layers.GAPDynamicLinear):  # eq. 4
        lin_a, lin_b = layer.wfm[0], layer.wfm[2]
        z = gelu(x.mean(1) @ lin_a.weight.T + lin_a.bias) @ lin_b.weight.T + lin_b.bias
        return z.reshape(-1, layer.in_features, layer.out_features)
    scale = layer.context_features ** -0.5 / n
    if isinstance(layer, layers.BilateralDynamicLinear):  # eq. 8: W1 sigma(W2 X^T) sigma(X W3) W4
        xp = pool2(x, hw)
        ri = layer.r_in
        w2, b2 = layer.wfm.weight[:ri], layer.wfm.bias[:ri]
        w3, b3 = layer.wfm.weight[ri:].T, layer.wfm.bias[ri:]
        left = silu(torch.einsum('rc,bnc->brn', w2, xp) + b2[:, None])  # sigma(W2 X^T): (B, r_in, N')
        right = silu(xp @ w3 + b3)  # sigma(X W3): (B, N', r_out)
        return layer.w1.T @ left @ right @ layer.w2 * scale
    xp = pool2(x, hw) if layer.pool else x
    corr = xp.transpose(1, 2) @ xp  # X^T X
    if isinstance(layer, layers.DeepDynamicLinear):  # eq. 7
        return layer.w1 @ silu(layer.w2 @ corr @ layer.w3 * scale) @ layer.w4
    linear = layer.w1 @ corr @ layer.w2 * scale  # eq. 5
    return silu(linear) if isinstance(layer, layers.NonlinearDynamicLinear) else linear  # eq. 6


def dwconv_delta(layer: torch.nn.Module, m: torch.Tensor) -> torch.Tensor:
    """dW (B, C, K, K) of eqs. 10-13 from the map X (B, C, H, W), with the release's normalisation."""
    k = layer.kernel_size
    if isinstance(layer, layers.GAPDynamicDWConv):  # eq. 10
        lin_a, lin_b = layer.wfm[0], layer.wfm[2]
        z = gelu(m.mean((2, 3)) @ lin_a.weight.T + lin_a.bias) @ lin_b.weight.T + lin_b.bias
        return unit_clip(z.reshape(-1, layer.dim, k, k))
    c1, c2 = layer.wfm[0], layer.wfm[2]
    if isinstance(layer, layers.ConvDynamicDWConv):  # eq. 13: AAP(f(X))
        return unit_clip(adaptive_pool(conv(gelu(conv(m, c1.weight, c1.bias)), c2.weight, c2.bias), k))
    pooled = adaptive_pool(m, k)  # (B, C, K, K); the 1 x 1 convs: a linear map per position
    mlp = torch.einsum('oc,bcij->boij', c2.weight[:, :, 0, 0],
                       gelu(torch.einsum('oc,bcij->boij', c1.weight[:, :, 0, 0], pooled) + c1.bias[:, None, None]))
    if isinstance(layer, layers.AmpDirDynamicDWConv):  # eq. 12: s(X) * MLP(X') / (||MLP(X')||_F + eps)
        amplitude = torch.sigmoid(m.mean((2, 3)) @ layer.amp.weight.T + layer.amp.bias)
        return amplitude[..., None, None] * mlp / (mlp.flatten(2).norm(dim=-1)[..., None, None] + layer.eps)
    return unit_clip(mlp)  # eq. 11


# ---------------------------------------------------------------- the released networks, from a state dict
def released_state_dict(dim: int, depth: int, num_classes: int = 1000, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random tensors in the released WeightFormer checkpoint's layout (blocks i with (i + 2) % 3 == 0 dynamic)."""
    g = torch.Generator().manual_seed(seed)

    def r(*shape, std=0.05):
        return torch.randn(*shape, generator=g) * std

    def ln(prefix):
        return {prefix + '.weight': 1 + r(dim, std=0.1), prefix + '.bias': r(dim)}

    hid = 4 * dim
    sd = {'patch_embed.proj.weight': r(dim, 3, 16, 16, std=0.02), 'patch_embed.proj.bias': r(dim),
          **ln('init_norm'), **ln('norm'), 'head.weight': r(num_classes, dim), 'head.bias': r(num_classes)}
    for i in range(depth):
        p = f'blocks.{i}.'
        sd.update(ln(p + 'norm2'))
        sd[p + 'linear2.weight'], sd[p + 'linear2.bias'] = r(dim, hid), r(dim)
        if (i + 2) % 3 == 0:
            sd.update(ln(p + 'norm1'))
            sd.update({p + 'dwc.w': r(dim, 1, 3, 3, std=0.2), p + 'dwc.b': r(dim),
                       p + 'dwc.wfm.0.weight': r(dim, dim, 1, 1, std=0.2), p + 'dwc.wfm.0.bias': r(dim),
                       p + 'dwc.wfm.2.weight': r(dim, dim, 1, 1, std=0.2),
                       p + 'linear1.w': r(dim, hid), p + 'linear1.b': r(hid),
                       p + 'linear1.wfm.weight': r(dim // 4 + hid // 4, dim, std=0.2),
                       p + 'linear1.wfm.bias': r(dim // 4 + hid // 4),
                       p + 'linear1.w1': r(dim // 4, dim, std=0.2), p + 'linear1.w2': r(hid // 4, hid, std=0.2)})
        else:
            sd.update({p + 'dwc.weight': r(dim, 1, 3, 3, std=0.2), p + 'dwc.bias': r(dim),
                       p + 'linear1.weight': r(hid, dim), p + 'linear1.bias': r(hid)})
    return sd


def release_dynamic_dwconv(sd: dict, prefix: str, z: torch.Tensor) -> torch.Tensor:
    """The release's DynCnn on a map z (B, C, H, W): AAP(3) -> 1x1 conv -> GELU -> 1x1 conv, dW / (||dW||_F + 1),
    then a 3 x 3 depthwise conv with W0 + dW per sample."""
    k = prefix + 'dwc.'
    dw = F.conv2d(F.gelu(F.conv2d(F.adaptive_avg_pool2d(z, 3), sd[k + 'wfm.0.weight'], sd[k + 'wfm.0.bias'])),
                  sd[k + 'wfm.2.weight'])
    dw = unit_clip(dw)
    return torch.cat([F.conv2d(z[b:b + 1], (sd[k + 'w'][:, 0] + dw[b])[:, None], sd[k + 'b'], padding=1,
                               groups=z.shape[1]) for b in range(z.shape[0])])


def release_dynamic_linear(sd: dict, prefix: str, h: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
    """The release's DynLinear (the first MLP linear) on tokens h (B, H*W, C): dW from the 2 x 2-pooled tokens
    (split(wfm), SiLU, w1 / w2, * C^-0.5 / N), its columns / (||.|| + 1), h (W0 + dW) + b."""
    k = prefix + 'linear1.'
    B, N, C = h.shape
    pooled = F.avg_pool2d(h.transpose(1, 2).reshape(B, C, *hw), 2).flatten(2).transpose(1, 2)
    a, b = F.linear(pooled, sd[k + 'wfm.weight'], sd[k + 'wfm.bias']).split(
        [sd[k + 'w1'].shape[0], sd[k + 'w2'].shape[0]], -1)
    dw = (F.silu(a) @ sd[k + 'w1']).transpose(1, 2) @ (F.silu(b) @ sd[k + 'w2']) * C ** -0.5 / N
    dw = dw / (dw.norm(dim=-2, keepdim=True) + 1)
    return h @ (sd[k + 'w'] + dw) + sd[k + 'b']


def weightformer_forward(sd: dict, img: torch.Tensor, depth: int) -> tuple[torch.Tensor, list[torch.Tensor],
                                                                                tuple[int, int]]:
    """The released WeightFormer on images (B, 3, H, W) -> (logits, every block's tokens, the grid (H, W))."""
    def ln(t, name):
        return F.layer_norm(t, t.shape[-1:], sd[name + '.weight'], sd[name + '.bias'], 1e-6)

    fmap = F.conv2d(img, sd['patch_embed.proj.weight'], sd['patch_embed.proj.bias'], stride=16)
    B, C, H, W = fmap.shape
    x = ln(fmap.flatten(2).transpose(1, 2), 'init_norm')
    feats = []
    for i in range(depth):
        p = f'blocks.{i}.'
        if (i + 2) % 3 == 0:
            x = ln(x, p + 'norm1')
            x = x + release_dynamic_dwconv(sd, p, x.transpose(1, 2).reshape(B, C, H, W)).flatten(2).transpose(1, 2)
            h = release_dynamic_linear(sd, p, ln(x, p + 'norm2'), (H, W))
        else:
            conv_out = F.conv2d(x.transpose(1, 2).reshape(B, C, H, W), sd[p + 'dwc.weight'], sd[p + 'dwc.bias'],
                                padding=1, groups=C)
            x = x + conv_out.flatten(2).transpose(1, 2)
            h = ln(x, p + 'norm2') @ sd[p + 'linear1.weight'].t() + sd[p + 'linear1.bias']
        x = x + F.gelu(h) @ sd[p + 'linear2.weight'].t() + sd[p + 'linear2.bias']
        feats.append(x)
    logits = ln(x, 'norm').mean(1) @ sd['head.weight'].t() + sd['head.bias']
    return logits, feats, (H, W)


def wf_dit_forward(sd: dict, x: torch.Tensor, t: torch.Tensor, y: torch.Tensor, p: int, depth: int) -> torch.Tensor:
    """WF-DiT of the release on latents x (B, C, S, S), timesteps t and labels y -> DiT's output (B, C', S, S)."""
    B, D = x.shape[0], sd['pos_embed'].shape[-1]
    g = x.shape[-1] // p
    tok = F.conv2d(x, sd['x_embedder.proj.weight'], sd['x_embedder.proj.bias'], stride=p).flatten(2).transpose(1, 2)
    tok = tok + sd['pos_embed']
    half = 128  # GLIDE's frequencies, in float32 as DiT computes them
    freqs = torch.exp(-math.log(10000) * torch.arange(half, dtype=torch.float32) / half)
    args = t[:, None].float() * freqs
    tf = torch.cat([torch.cos(args), torch.sin(args)], 1).double()
    temb = F.linear(F.silu(F.linear(tf, sd['t_embedder.mlp.0.weight'], sd['t_embedder.mlp.0.bias'])),
                    sd['t_embedder.mlp.2.weight'], sd['t_embedder.mlp.2.bias'])
    c = temb + sd['y_embedder.embedding_table.weight'][y]

    def ln(z):
        return F.layer_norm(z, (D,), eps=1e-6)

    def mod(z, shift, scale):
        return z * (1 + scale[:, None]) + shift[:, None]
    for i in range(depth):
        k = f'blocks.{i}.'
        m = F.linear(F.silu(c), sd[k + 'adaLN_modulation.1.weight'], sd[k + 'adaLN_modulation.1.bias']).chunk(6, 1)
        tok = ln(tok)
        z = mod(tok, m[0], m[1]).transpose(1, 2).reshape(B, D, g, g)
        if (i + 2) % 3 == 0:
            z = release_dynamic_dwconv(sd, k, z)
        else:
            z = F.conv2d(z, sd[k + 'dwc.weight'], sd[k + 'dwc.bias'], padding=1, groups=D)
        tok = tok + m[2][:, None] * z.flatten(2).transpose(1, 2)
        h = mod(ln(tok), m[3], m[4])
        if (i + 2) % 3 == 0:
            h = release_dynamic_linear(sd, k, h, (g, g))
        else:
            h = F.linear(h, sd[k + 'linear1.weight'], sd[k + 'linear1.bias'])
        h = F.linear(F.gelu(h, approximate='tanh'), sd[k + 'linear2.weight'], sd[k + 'linear2.bias'])
        tok = tok + m[5][:, None] * h
    shift, scale = F.linear(F.silu(c), sd['final_layer.adaLN_modulation.1.weight'],
                            sd['final_layer.adaLN_modulation.1.bias']).chunk(2, 1)
    out = F.linear(mod(ln(tok), shift, scale), sd['final_layer.linear.weight'], sd['final_layer.linear.bias'])
    C = out.shape[-1] // (p * p)
    return out.reshape(B, g, g, p, p, C).permute(0, 5, 1, 3, 2, 4).reshape(B, C, g * p, g * p)
