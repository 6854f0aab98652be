"""The ``optim`` section of an LLM-CTC / LLM-CE run (standard library only: reading a
preset must not import torch). Defaults are the paper's shared LLM-based ASR settings
(App. D.2, Table 8): AdamW, peak lr 1e-4, weight decay 0.1, moments 0.9/0.95, eps 1e-6,
200 linear warm-up updates, cosine decay to a floor of 5% of the peak, clip norm 5.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class AdamWOptions:
    """AdamW with linear warm-up and cosine decay (:mod:`llm_ctc.optim`)."""

    lr: float = 1e-4  # peak learning rate
    weight_decay: float = 0.1  # on matrices only (SpeechLLM.parameter_groups)
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-6
    warmup_batches: int = 200  # linear warm-up, in optimizer updates
    # Updates after which the cosine reaches the floor (the paper gives no length: a
    # recipe sets it to its number of updates); the rate stays at the floor afterwards.
    decay_batches: int = 20000
    final_lr_fraction: float = 0.05  # the floor, as a fraction of the peak
    clip_norm: float = 5.0  # total gradient norm; 0 turns clipping off

    def __post_init__(self) -> None:
        for name in ("lr", "eps"):
            if not getattr(self, name) > 0:
                raise ValueError(f"optim.{name} must be > 0, got {getattr(self, name)}")
        if self.weight_decay < 0:
            raise ValueError(f"optim.weight_decay must be >= 0, got {self.weight_decay}")
        for name in ("beta1", "beta2"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"optim.{name} must be in [0, 1), got {getattr(self, name)}")
        if self.warmup_batches < 0:
            raise ValueError(f"optim.warmup_batches must be >= 0, got {self.warmup_batches}")
        if self.decay_batches <= self.warmup_batches:
            raise ValueError(f"optim.decay_batches ({self.decay_batches}) must exceed optim.warmup_batches "
                             f"({self.warmup_batches})")
        if not 0.0 <= self.final_lr_fraction <= 1.0:
            raise ValueError(f"optim.final_lr_fraction must be in [0, 1], got {self.final_lr_fraction}")
        if self.clip_norm < 0:
            raise ValueError(f"optim.clip_norm must be >= 0 (0: no clipping), got {self.clip_norm}")


__all__ = ["AdamWOptions"]
