from . import backbones, layers, necks

__all__ = ['backbones', 'layers', 'necks']
