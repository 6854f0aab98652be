"""Pruned CTC: exact vocabulary reduction with full-vocabulary normalization, chunked
recomputation and finite-beam alignment pruning, in pure PyTorch (no k2)."""

from .inputs import DEFAULT_BEAM, DEFAULT_CHUNK_SIZE, PreparedBatch, bias_with_blank_offset
from .loss import PrunedCTCLoss, pruned_ctc_loss
from .results import ExcludedUtteranceWarning, LossStats
from .standard import standard_ctc_loss
from .two_stage import ReducedBatch, alignment_loss, reduce_vocabulary
from .vocab_chunks import DEFAULT_PRECISION, Precision

__all__ = [
    "pruned_ctc_loss",
    "bias_with_blank_offset",
    "PrunedCTCLoss",
    "standard_ctc_loss",
    "reduce_vocabulary",
    "alignment_loss",
    "ReducedBatch",
    "PreparedBatch",
    "Precision",
    "DEFAULT_PRECISION",
    "DEFAULT_CHUNK_SIZE",
    "DEFAULT_BEAM",
    "LossStats",
    "ExcludedUtteranceWarning",
]
__version__ = "0.1.0"
