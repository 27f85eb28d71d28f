"""The FLOP counter's two conventions for WeightFormer's Bilateral update (eq. 8): the released evaluation order,
the paper's (Table 3's and the metafiles' counts), against its matrix products written out, and mmwf's order."""
import pytest
import torch

from mmwf.analysis import count_flops, released_order
from mmwf.models.layers import BilateralDynamicLinear


class OnGrid(torch.nn.Module):
    def __init__(self, layer: torch.nn.Module, hw: tuple[int, int]) -> None:
        super().__init__()
        self.layer, self.hw = layer, hw

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x, self.hw)


def released_macs(c_in: int, c_out: int, r_in: int, r_out: int, hw: tuple[int, int]) -> int:
    """Eq. 8 as released, on N tokens pooled to N' (2 x 2, floor): the predictor's linear (N' C_in (r_in + r_out)),
    sigma(A) W1 (N' r_in C_in), sigma(B) W2 (N' r_out C_out), dW = P^T Q (C_in N' C_out), then x (W0 + dW)
    (N C_in C_out)."""
    n, pooled = hw[0] * hw[1], (hw[0] // 2) * (hw[1] // 2)
    return (pooled * c_in * (r_in + r_out) + pooled * r_in * c_in + pooled * r_out * c_out + c_in * pooled * c_out
            + n * c_in * c_out)


@pytest.mark.parametrize('hw', [(64, 64), (5, 7)], ids=['1024 px', '80 x 112 px'])
def test_released_order_counts_the_releases_products_and_ours_differs(hw):
    """WF-T's first MLP linear (192 -> 768): the released order's count is its products exactly; mmwf's own order
    (the layer's rule: the reordered core for many tokens, the release's for few) counts fewer products at 1024 px
    and the same at 80 x 112, so a count in the wrong convention cannot pass."""
    layer = BilateralDynamicLinear(192, 768)
    model = OnGrid(layer, hw).eval()
    x = torch.randn(1, hw[0] * hw[1], 192)
    with released_order(model):
        released = count_flops(model, (x,))
    ours = count_flops(model, (x,))
    assert released == released_macs(192, 768, layer.r_in, layer.r_out, hw)
    if hw == (64, 64):
        assert ours < 0.8 * released
    else:
        assert ours == released
