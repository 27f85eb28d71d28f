from .attention_distiller import AttentionDistiller, student_checkpoint

__all__ = ['AttentionDistiller', 'student_checkpoint']
