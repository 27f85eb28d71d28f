from .complexity import count_flops, flop_analyzer, released_order

__all__ = ['flop_analyzer', 'count_flops', 'released_order']
