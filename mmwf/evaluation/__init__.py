"""Metrics of mmwf's tasks: FID and Inception Score of generated images."""
from .fid import (
                         FIDInception,
                         GenerationMetric,
                         feature_statistics,
                         frechet_distance,
                         inception_score,
                         load_statistics,
)

__all__ = ['FIDInception', 'GenerationMetric', 'feature_statistics', 'frechet_distance', 'inception_score',
           'load_statistics']
