"""The kernel table's entries that timings propose (:func:`mmwf.analysis.kernels.proposed_entries`): per entry and
mode, the evaluation fastest in the most cases, keyed as the table keys a device's entries."""
from mmwf.analysis.kernels import proposed_entries


def test_the_evaluation_fastest_in_most_cases_is_proposed_per_entry_and_mode():
    wins = {('depthwise_conv', 'inference'): ['grouped', 'triton', 'triton'],
            ('depthwise_conv', 'training'): ['grouped', 'taps'],  # a tie: the first seen
            ('dynamic_weight', 'training'): ['fused / tokens', 'materialized / core', 'fused / core']}
    assert proposed_entries(wins, 'cuda') == {
        'depthwise_conv_cuda': ('triton', 2, 3),
        'depthwise_conv_cuda_autograd': ('grouped', 1, 2),
        'dynamic_weight_cuda_autograd': ('fused', 2, 3),  # the form; the order stays the cost rule's
    }
