"""The Zipformer CTC family (:class:`asr.family.Family`): the model from its ``model``
section, and ScaledAdam with the Eden schedule from its ``optim`` section."""

from __future__ import annotations

import dataclasses
from typing import Tuple

import torch

from asr.family import Family
from zipformer.model import CTCModel, parameter_groups
from zipformer.optim import Eden, ScaledAdam
from zipformer.presets import ScaledAdamOptions, ZipformerConfig


def build_model(config: ZipformerConfig, vocab_size: int, blank_id: int) -> CTCModel:
    """A Zipformer CTC model whose head has ``vocab_size`` outputs (blank at ``blank_id``)."""
    return CTCModel(dataclasses.replace(config, vocab_size=vocab_size, blank_id=blank_id))


def build_optimizer(model: torch.nn.Module, options: ScaledAdamOptions) -> Tuple[ScaledAdam, Eden]:
    """ScaledAdam over the model's parameter groups and its Eden schedule (icefall's rules)."""
    optimizer = ScaledAdam(parameter_groups(model, options.base_lr), lr=options.base_lr,
                           clipping_scale=options.clipping_scale)
    scheduler = Eden(optimizer, lr_batches=options.lr_batches, lr_epochs=options.lr_epochs,
                     warmup_batches=options.warmup_batches, warmup_start=options.warmup_start)
    return optimizer, scheduler


FAMILY = Family("zipformer", ZipformerConfig, ScaledAdamOptions, build_model, build_optimizer)
