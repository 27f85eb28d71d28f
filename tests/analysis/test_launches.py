"""Kernel launches counted on the CPU with the CUDA evaluations: what a block dispatches, within its budget, so that a
change that adds launches to eager GPU training (launch-bound for WF-T) is seen without a GPU."""
import pytest
import timm
import torch

import mmwf  # noqa: F401  (registers the timm models)
from mmwf.analysis.launches import block_launches, count_launches
from mmwf.models.layers.implementation import kernel, resolved_as

# kernel launches of one WF-T block at 224 (batch 2) with the CUDA evaluations, counted when the budget was set;
# a DeiT-T block launches 10 at inference and 32 in training (measured alike)
BUDGET = {('static', 'inference'): 7, ('static', 'training'): 22,
          ('dynamic', 'inference'): 30, ('dynamic', 'training'): 103}


def test_views_and_allocations_launch_nothing():
    x = torch.randn(4, 6)

    def call():
        y = x.view(6, 4).t().unsqueeze(0)  # views
        torch.empty(3), torch.empty_like(x)  # allocations
        return (y + 1).sum()
    assert count_launches(call) == {'add': 1, 'sum': 1}


def test_resolved_as_takes_another_device_evaluations_and_restores():
    cpu = torch.device('cpu')
    assert kernel('adaptive_pool', cpu) == 'native'
    with resolved_as('cuda'):
        assert kernel('adaptive_pool', cpu) == 'tokens'
        with resolved_as('cpu'):
            assert kernel('adaptive_pool', cpu) == 'native'
        assert kernel('depthwise_conv', cpu) == 'grouped'
    assert kernel('depthwise_conv', cpu) == 'loop'


@pytest.mark.parametrize('mode', ['inference', 'training'])
def test_launches_per_block_stay_within_budget(mode):
    model = timm.create_model('weightformer_t')
    tokens = torch.randn(2, 14 * 14, 192)
    blocks = {'static': model.blocks[0], 'dynamic': model.blocks[1]}
    counts = {kind: block_launches(block, tokens, (14, 14), mode == 'training') for kind, block in blocks.items()}
    for kind, count in counts.items():
        assert sum(count.values()) <= BUDGET[kind, mode], (kind, mode, dict(count))
    # the CUDA evaluations were counted: the pooling as one product over the tokens, the Bilateral update through a
    # weight per sample (materialized: no charge for its passes on CUDA)
    assert '_adaptive_avg_pool2d' not in counts['dynamic'] and 'addcdiv' in counts['dynamic']
    on_cpu = block_launches(blocks['dynamic'], tokens, (14, 14), mode == 'training', device_type='cpu')
    assert '_adaptive_avg_pool2d' in on_cpu
