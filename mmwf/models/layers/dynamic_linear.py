"""Dynamic linear layers: W(X) = W0 + dW(X), paper eq. 3, with the predictors of Table 1 (eqs. 4-8).

Every layer maps tokens x (B, N, Cin) on an H x W grid to (B, N, Cout). The static weight ``w`` is stored
input-major (Cin, Cout) and the bias ``b`` (Cout), as in the released WeightFormer. The predicted update is
normalised per output column, dW / (||dW||_col + 1), as the release does, then y = x (w + dW) + b.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.init import trunc_normal_

from mmwf.registry import MODELS

from .implementation import check_choice, choose_kernel, records_autograd, resolved_as
from .tokens import pool_tokens


def product_cost(*dims: int) -> int:
    """Multiply-adds of the chain of matrix products of shapes (d0, d1), (d1, d2), ... taken left to right."""
    return sum(dims[0] * m * k for m, k in zip(dims[1:-1], dims[2:]))


def weight_form(costs: dict[str, dict[str, int]], order: str, weight_elements: int,
                autograd: bool, form: str = 'auto', device_type: str = 'cpu') -> tuple[str, str]:
    """(form, order) of a Bilateral update with ``costs`` (:meth:`BilateralDynamicLinear.costs`) on ``device_type``
    (that device's charge, whatever :func:`~.implementation.resolved_as` says):
    :func:`~.implementation.choose_kernel`'s ``'dynamic_weight'``, asked without a layer (``mmwf.analysis.kernels``
    times every form beside the one the rule picks)."""
    with resolved_as(device_type):
        return choose_kernel('dynamic_weight', form, torch.device(device_type), autograd, costs=costs, order=order,
                             weight_elements=weight_elements)


def gelu_output(y: torch.Tensor) -> torch.Tensor:
    """GELU of a layer's fresh output y: in place where autograd does not record it (nothing else holds y)."""
    return F.gelu(y) if records_autograd(y) else torch.ops.aten.gelu_(y)


def gram_column_norms(gram: torch.Tensor, right: torch.Tensor) -> torch.Tensor:
    """The column norms of dW = left right from the Gram matrix gram = left^T left (B or 1, K, K) and right (B, K,
    Cout): ||dW_j|| = sqrt(right_j^T gram right_j), (B, 1, Cout), in fp32 at least, whatever the inputs' dtype and
    autocast (in fp16 the squares of small norms underflow to zero, and the square root's derivative there made every
    gradient of WF-T's fp16 training step NaN on CUDA). Where rounding leaves the square below the smallest normal
    number (a zero column), the norm is that number's square root (about 1e-19, nothing beside the 1 the update adds
    to it) with gradient 0, as ``torch.linalg.vector_norm``'s at a zero column: two launches where a mask took
    five."""
    dtype = torch.promote_types(right.dtype, torch.float32)
    with torch.autocast(right.device.type, enabled=False):
        right = right.to(dtype)
        square = (right * torch.matmul(gram.to(dtype), right)).sum(1, keepdim=True)
    return square.clamp_min(torch.finfo(dtype).tiny).sqrt()


class DynamicLinear(nn.Module):
    """Base class: y = x (W0 + dW(X)) + b. Subclasses implement :meth:`delta`.

    X, the tokens dW is predicted from, is the layer's own input x, or a ``context`` passed with it (e.g. the
    MLP's C-wide input for its second linear, whose own input is 4C wide).

    Args:
        in_features (int): Cin.
        out_features (int): Cout.
        context_features (int, optional): width of X when it is a context, not x. Defaults to None (X = x).
        update (str): how a weight formed per sample adds its update: ``'addcdiv'`` (one fused op), ``'div-add'``
            (the TorchScript exporter has no addcdiv) or ``'auto'`` (:mod:`.implementation`). Defaults to ``'auto'``.
    """

    choices = ('update',)

    def __init__(self, in_features: int, out_features: int, context_features: int | None = None,
                 update: str = 'auto') -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.context_features = context_features or in_features
        self.update = check_choice('update', update)
        self.w = nn.Parameter(trunc_normal_(torch.empty(in_features, out_features), std=0.02))
        self.b = nn.Parameter(trunc_normal_(torch.empty(out_features), std=0.02))

    def delta(self, x: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
        """Predict dW (B, Cin, Cout) from the tokens X (B, N, context_features)."""
        raise NotImplementedError

    def effective_delta(self, x: torch.Tensor, hw: tuple[int, int],
                        context: torch.Tensor | None = None) -> torch.Tensor:
        """The update added to ``w``: dW / (||dW||_col + 1), (B, Cin, Cout) (``forward`` fuses it into one
        addcdiv; this explicit form is for analysis, e.g. tools/analysis/dynamic_strength.py)."""
        dw = self.delta(x if context is None else context, hw)
        return dw / (torch.linalg.vector_norm(dw, dim=1, keepdim=True) + 1)

    def forward(self, x: torch.Tensor, hw: tuple[int, int], context: torch.Tensor | None = None) -> torch.Tensor:
        """Tokens x (B, N, Cin) -> (B, N, Cout); dW from ``context`` (B, N, context_features) when given."""
        return self.apply_update(x, self.delta(x if context is None else context, hw))

    def apply_update(self, x: torch.Tensor, dw: torch.Tensor) -> torch.Tensor:
        """x (w + dW / (||dW||_col + 1)) + b with the weight formed per sample, for dW (B, Cin, Cout)."""
        # work on W^T (B, Cout, Cin): the strategies build dW^T contiguously (``delta`` returns its
        # transposed view), so the column norms and the update run over contiguous memory
        dw_t = dw.transpose(1, 2)
        norm = torch.linalg.vector_norm(dw_t, dim=2, keepdim=True)
        if choose_kernel('weight_update', self.update, x.device) == 'addcdiv':
            weight_t = torch.addcdiv(self.w.t().contiguous(), dw_t, norm + 1)  # (w + dW / (||dW||_col + 1))^T
        else:
            weight_t = self.w.t() + dw_t / (norm + 1)
        y = torch.matmul(x, weight_t.transpose(1, 2))
        y += self.b
        return y

    def apply_factors(self, x: torch.Tensor, left: torch.Tensor, right: torch.Tensor,
                      gram: torch.Tensor, fused: bool = False, gelu: bool = False) -> torch.Tensor:
        """:meth:`apply_update` for dW = left right of rank K, left (B or 1, Cin, K) or (Cin, K), right (B, K, Cout),
        gram = left^T left, without a weight per sample: x w + b + ((x left) right) / (||dW||_col + 1), the column
        norms from the Gram matrix (:func:`gram_column_norms`); ``fused``: in one Triton kernel
        (:func:`~.dynamic_linear_triton.low_rank_linear_triton`); ``gelu``: GELU of that (in the kernel's epilogue
        when ``fused``)."""
        norm = gram_column_norms(gram, right).to(right.dtype)  # (B, 1, Cout)
        if fused:
            from .dynamic_linear_triton import low_rank_linear_triton
            return low_rank_linear_triton(x, self.w, self.b, left, right / (norm + 1), gelu)
        y = torch.baddbmm(F.linear(x, self.w.t(), self.b), torch.matmul(x, left), right / (norm + 1))
        return gelu_output(y) if gelu else y

    def extra_repr(self) -> str:
        extra = f', context_features={self.context_features}' if self.context_features != self.in_features else ''
        return f'in_features={self.in_features}, out_features={self.out_features}{extra}'


@MODELS.register_module()
class GAPDynamicLinear(DynamicLinear):
    """Eq. 4: dW = reshape(MLP(GAP(X))), MLP = Linear(Cx, hidden) -> GELU -> Linear(hidden, Cin*Cout)."""

    def __init__(self, in_features: int, out_features: int, hidden: int = 4,
                 context_features: int | None = None, **choices: str) -> None:
        super().__init__(in_features, out_features, context_features, **choices)
        self.wfm = nn.Sequential(nn.Linear(self.context_features, hidden), nn.GELU(),
                                 nn.Linear(hidden, in_features * out_features))

    def delta(self, x: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
        return self.wfm(x.mean(1)).view(-1, self.in_features, self.out_features)


def sandwich(left: torch.Tensor, x: torch.Tensor, right: torch.Tensor, scale: float, order: str) -> torch.Tensor:
    """left (a, C) X^T X right (C, b) * scale for tokens x (B, N, C), as (B, a, b) built transposed-contiguous.

    ``'tokens'``: (left X^T)(X right), through (N, a) and (N, b) intermediates (cheap for few tokens; the order
    whose FLOPs the paper's Table 2 reports); ``'core'``: left (X^T X) right, through the (C, C) correlation
    (independent of N after it); ``'auto'``: the cheaper (:func:`~.implementation.choose_kernel`)."""
    n, c = x.shape[1], x.shape[2]
    a, b = left.shape[0], right.shape[1]
    cost_tokens = product_cost(n, c, a) + product_cost(n, c, b) + product_cost(b, n, a)
    cost_core = product_cost(c, n, c) + min(product_cost(a, c, c, b), product_cost(b, c, c, a))
    if choose_kernel('product_order', order, x.device, costs=dict(tokens=cost_tokens, core=cost_core)) == 'tokens':
        p = torch.matmul(x, left.t()) * scale  # (B, N, a) = (left X^T)^T
        q = torch.matmul(x, right)  # (B, N, b)
        return torch.matmul(q.transpose(1, 2), p).transpose(1, 2)
    corr = torch.matmul(x.transpose(1, 2), x) * scale  # (B, C, C), symmetric
    if a * c * c <= c * c * b:
        return torch.matmul(torch.matmul(left, corr), right).transpose(1, 2).contiguous().transpose(1, 2)
    return torch.matmul(right.t(), torch.matmul(corr, left.t())).transpose(1, 2)


class CorrelationDynamicLinear(DynamicLinear):
    """Shared part of eqs. 5-7: products around the correlation X^T X of the (optionally 2x2-pooled) tokens,
    scaled by Cx^-0.5 / N with N the un-pooled token count (the release's scaling), evaluated in ``order``
    (:func:`sandwich`; the outputs agree to rounding)."""

    choices = ('update', 'order')

    def __init__(self, in_features: int, out_features: int, pool: bool = True, order: str = 'auto',
                 context_features: int | None = None, **choices: str) -> None:
        super().__init__(in_features, out_features, context_features, **choices)
        self.pool, self.order = pool, check_choice('order', order)

    def tokens(self, x: torch.Tensor, hw: tuple[int, int]) -> tuple[torch.Tensor, float]:
        """The tokens the correlation is taken over, and its scale."""
        return pool_tokens(x, hw) if self.pool else x, self.context_features ** -0.5 / x.shape[1]


@MODELS.register_module()
class LinearDynamicLinear(CorrelationDynamicLinear):
    """Eq. 5: dW = W1 (X^T X) W2, W1 (Cin, Cx), W2 (Cx, Cout); ``pool`` picks w/ or w/o pooling."""

    def __init__(self, in_features: int, out_features: int, pool: bool = True, order: str = 'auto',
                 context_features: int | None = None, **choices: str) -> None:
        super().__init__(in_features, out_features, pool, order, context_features, **choices)
        cx = self.context_features
        self.w1 = nn.Parameter(trunc_normal_(torch.empty(in_features, cx), std=0.02))
        self.w2 = nn.Parameter(trunc_normal_(torch.empty(cx, out_features), std=0.02))

    def delta(self, x: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
        xp, scale = self.tokens(x, hw)
        return sandwich(self.w1, xp, self.w2, scale, self.order)


@MODELS.register_module()
class NonlinearDynamicLinear(LinearDynamicLinear):
    """Eq. 6: dW = SiLU(W1 (X^T X) W2)."""

    def delta(self, x: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
        return F.silu(super().delta(x, hw))


@MODELS.register_module()
class DeepDynamicLinear(CorrelationDynamicLinear):
    """Eq. 7: dW = W1 SiLU(W2 (X^T X) W3) W4, low rank: W1 (Cin, r1), W2 (r1, Cx), W3 (Cx, r2), W4 (r2, Cout) with
    r1 = Cin / ratio, r2 = Cout / ratio; the outer product is taken as ``outer``: ``'left'`` (W1 inner) W4,
    ``'right'`` W1 (inner W4), or ``'auto'``, the cheaper by :func:`product_cost`."""

    choices = ('update', 'order', 'outer')

    def __init__(self, in_features: int, out_features: int, pool: bool = True, ratio: int = 4, order: str = 'auto',
                 context_features: int | None = None, outer: str = 'auto', **choices: str) -> None:
        super().__init__(in_features, out_features, pool, order, context_features, **choices)
        self.outer = check_choice('outer', outer)
        r1, r2, cx = in_features // ratio, out_features // ratio, self.context_features
        shapes = dict(w1=(in_features, r1), w2=(r1, cx), w3=(cx, r2), w4=(r2, out_features))
        for name, shape in shapes.items():
            setattr(self, name, nn.Parameter(trunc_normal_(torch.empty(shape), std=0.02)))

    def delta(self, x: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
        xp, scale = self.tokens(x, hw)
        inner = F.silu(sandwich(self.w2, xp, self.w3, scale, self.order))  # (B, r1, r2)
        (cin, r1), (r2, cout) = self.w1.shape, self.w4.shape
        costs = dict(left=product_cost(cin, r1, r2, cout), right=product_cost(cout, r2, r1, cin))
        if choose_kernel('outer_product', self.outer, x.device, costs=costs) == 'left':  # (W1 inner) W4
            return torch.matmul(torch.matmul(self.w1, inner), self.w4)
        return torch.matmul(self.w1, torch.matmul(inner, self.w4))


@MODELS.register_module()
class BilateralDynamicLinear(DynamicLinear):
    """Eq. 8, Bilateral Activation (the released strategy): dW = W1 SiLU(W2 X^T) SiLU(X W3) W4.

    Released layout: ``wfm`` = Linear(Cx, Cin/r + Cout/r) holds W2 and W3 (with bias), ``w1`` (Cin/r, Cin),
    ``w2`` (Cout/r, Cout). On the 2x2-pooled tokens Xp (B, N', Cx), with [A, B] = split(wfm(Xp)):
    dW = (SiLU(A) w1)^T (SiLU(B) w2) * Cx^-0.5 / N. The product is evaluated in whichever order costs
    fewer multiply-adds: the release's (through (N', Cout) intermediates, cheap for few tokens) or
    w1^T (SiLU(A)^T SiLU(B)) w2 (independent of N' after the small core, cheap at high resolution).
    ``order='tokens'`` always takes the release's order (to count FLOPs as the paper did), ``'core'`` the other.

    Args:
        in_features (int): Cin.
        out_features (int): Cout.
        ratio (int): r, the rank reduction of the predictor. Defaults to 4.
        order (str): ``'auto'``, ``'tokens'`` or ``'core'``. Defaults to ``'auto'``.
        context_features (int, optional): Cx, the width of X when it is a context (see :class:`DynamicLinear`).
            Defaults to None (Cx = Cin).
        form (str): ``'factored'`` (never a weight per sample), ``'fused'`` (the factored form in one Triton
            kernel: :mod:`.dynamic_linear_triton`; a choice, not yet the rule's: no GPU has timed it; traced and
            exported graphs take their own entry), ``'materialized'`` (the release's weight per sample) or
            ``'auto'`` (:func:`~.implementation.choose_kernel`). Defaults to ``'auto'``.
        update (str): see :class:`DynamicLinear`. Defaults to ``'auto'``.
    """

    choices = ('update', 'order', 'form')
    gelu_epilogue = True  # forward(..., gelu=True) returns GELU of the output (the Triton kernel's epilogue)

    def __init__(self, in_features: int, out_features: int, ratio: int = 4, order: str = 'auto',
                 context_features: int | None = None, form: str = 'auto', update: str = 'auto') -> None:
        super().__init__(in_features, out_features, context_features, update)
        self.order, self.form = check_choice('order', order), check_choice('form', form)
        self.r_in, self.r_out = in_features // ratio, out_features // ratio
        self.wfm = nn.Linear(self.context_features, self.r_in + self.r_out)
        self.w1 = nn.Parameter(trunc_normal_(torch.empty(self.r_in, in_features), std=0.02))
        self.w2 = nn.Parameter(trunc_normal_(torch.empty(self.r_out, out_features), std=0.02))

    def predict(self, x: torch.Tensor, hw: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
        """SiLU(W2 Xp^T)^T scaled by Cx^-0.5 / N (B, N', Cin/r) and SiLU(Xp W3) (B, N', Cout/r) of the pooled tokens."""
        a, b = F.silu(self.wfm(pool_tokens(x, hw))).split([self.r_in, self.r_out], dim=-1)
        return a * (self.context_features ** -0.5 / x.shape[1]), b

    def costs(self, n: int, tokens: int) -> dict[str, dict[str, int]]:
        """Multiply-adds per sample of each way to apply the update to ``tokens`` tokens, from n pooled ones:
        ``'materialized'`` (forming dW: the release's order through (N', Cout) intermediates, or the core's,
        w1^T (SiLU(A)^T SiLU(B)) w2, counted as (w1^T core) w2) and ``'factored'`` (the factors of rank N' or
        Cin/r, their Gram matrix, the column norms and the two thin products with x), each for both orders."""
        cin, cout, ri, ro = self.in_features, self.out_features, self.r_in, self.r_out
        return dict(
            materialized=dict(tokens=product_cost(n, ri, cin) + product_cost(n, ro, cout) + product_cost(cout, n, cin),
                              core=product_cost(ro, n, ri) + product_cost(cin, ri, ro, cout)),
            factored=dict(tokens=(product_cost(n, ri, cin) + product_cost(n, ro, cout) + product_cost(n, cin, n)
                                  + product_cost(n, n, cout) + product_cost(tokens, cin, n, cout)),
                          core=(product_cost(ri, n, ro, cout) + product_cost(ri, cin, ri) + product_cost(ri, ri, cout)
                                + product_cost(tokens, cin, ri, cout))))

    def delta(self, x: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
        a, b = self.predict(x, hw)
        costs = self.costs(a.shape[1], x.shape[1])['materialized']
        return self.product(a, b, choose_kernel('product_order', self.order, x.device, costs=costs))

    def product(self, a: torch.Tensor, b: torch.Tensor, order: str) -> torch.Tensor:
        """dW (B, Cin, Cout), as the transposed view of a contiguous dW^T (the column norms then reduce over
        contiguous memory, and the matmul with x reads the transpose for free)."""
        if order == 'tokens':
            p, q = torch.matmul(a, self.w1), torch.matmul(b, self.w2)
            return torch.matmul(q.transpose(1, 2), p).transpose(1, 2)
        core_t = torch.matmul(b.transpose(1, 2), a)  # evaluated as (w2^T core^T) w1
        return torch.matmul(torch.matmul(self.w2.t(), core_t), self.w1).transpose(1, 2)

    def factors(self, a: torch.Tensor, b: torch.Tensor, order: str) -> tuple[torch.Tensor, ...]:
        """(left, right, gram) of :meth:`~DynamicLinear.apply_factors`: dW = (SiLU(A) w1)^T (SiLU(B) w2) of rank N'
        (``'tokens'``, a Gram matrix per sample) or w1^T (SiLU(A)^T SiLU(B) w2) of rank Cin/r (``'core'``, left and
        gram shared by the batch)."""
        if order == 'tokens':
            p, q = torch.matmul(a, self.w1), torch.matmul(b, self.w2)  # (B, N', Cin), (B, N', Cout)
            return p.transpose(1, 2), q, torch.matmul(p, p.transpose(1, 2))
        right = torch.matmul(torch.matmul(a.transpose(1, 2), b), self.w2)  # (B, Cin/r, Cout)
        return self.w1.t(), right, torch.matmul(self.w1, self.w1.t())

    def forward(self, x: torch.Tensor, hw: tuple[int, int], context: torch.Tensor | None = None,
                gelu: bool = False) -> torch.Tensor:
        """As :class:`DynamicLinear`, with the update applied in the form and order
        :func:`~.implementation.choose_kernel` picks by :meth:`costs`; ``gelu``: GELU of the output (an MLP's first
        linear, where nothing else reads it)."""
        a, b = self.predict(x if context is None else context, hw)
        form, order = choose_kernel('dynamic_weight', self.form, x.device, records_autograd(x, self.w),
                                    costs=self.costs(a.shape[1], x.shape[1]), order=self.order,
                                    weight_elements=self.in_features * self.out_features)
        if form in ('factored', 'fused'):
            return self.apply_factors(x, *self.factors(a, b, order), fused=form == 'fused', gelu=gelu)
        y = self.apply_update(x, self.product(a, b, order))
        return gelu_output(y) if gelu else y


@MODELS.register_module()
class StaticLinear(nn.Linear):
    """nn.Linear with the dynamic layers' call signature ``(x, hw[, context])``; grid and context are unused."""

    def forward(self, x: torch.Tensor, hw: tuple[int, int] | None = None,
                context: torch.Tensor | None = None) -> torch.Tensor:
        return super().forward(x)
