"""Pruned CTC: exact vocabulary reduction with full-vocabulary normalization, chunked
recomputation and finite-beam alignment pruning, in pure PyTorch (no k2)."""

from .loss import ExcludedUtteranceWarning, LossStats, PrunedCTCLoss, pruned_ctc_loss
from .standard import standard_ctc_loss

__all__ = [
    "pruned_ctc_loss",
    "PrunedCTCLoss",
    "standard_ctc_loss",
    "LossStats",
    "ExcludedUtteranceWarning",
]
__version__ = "0.1.0"
