from .attention_distiller import AttentionDistiller

__all__ = ['AttentionDistiller']
