"""Building what one training process trains: the family's model, its optimizer and
schedule, the fp16 loss scaler, and (several processes) the DDP wrapper and ZeRO-1
(:class:`asr.train_step.Trainee`). :mod:`asr.train` and the benchmarks build it here,
the same way."""

from __future__ import annotations

import hashlib
import logging
import random
from pathlib import Path
from typing import Mapping

import numpy as np
import torch
from torch.nn.parallel import DistributedDataParallel

from asr.config import RunConfig
from asr.data import rank_max_duration
from asr.family import load_family
from asr.train_helpers import keep_gradient_strides, make_grad_scaler
from asr.train_step import Trainee
from asr.train_zero1 import zero1_optimizer


def build_trainee(config: RunConfig, device: torch.device, vocab_size: int, blank_id: int = 0,
                  world_size: int = 1, local_rank: int = 0) -> Trainee:
    """Model (``vocab_size`` classes, blank ``blank_id``), optimizer, schedule and loss
    scaler of ``config``'s family on ``device``; with ``world_size`` > 1 the model trains
    through DDP and, with ``train.zero1``, the optimizer state is sharded."""
    options = config.train
    family = load_family(config.family)
    model = family.build_model(config.model, vocab_size, blank_id)
    if options.init_from:
        initialize_from(model, options.init_from)
    model = model.to(device)
    optimizer, scheduler = family.build_optimizer(model, config.optim)
    trained_model: torch.nn.Module = model
    if world_size > 1:
        keep_gradient_strides(model)
        device_ids = [local_rank] if device.type == "cuda" else None
        trained_model = DistributedDataParallel(model, device_ids=device_ids,
                                                find_unused_parameters=not model.uses_every_trained_weight())
        if options.zero1:
            optimizer = zero1_optimizer(optimizer, scheduler)
    elif options.zero1:
        logging.info("train.zero1 has no effect in a single process")
    # With train.virtual_ranks = N each process trains as N ranks (asr/rank_group.py): a
    # world of world_size x N ranks whose gradients DDP's way averages (their sum times 1/N).
    ranks = world_size * options.virtual_ranks
    return Trainee(model, optimizer, scheduler, make_grad_scaler(options.precision, device), options.precision,
                   device, schedule_units_per_batch(config, ranks), trained_model,
                   gradient_weight=1.0 / options.virtual_ranks)


def initialize_from(model: torch.nn.Module, path: str) -> None:
    """Load the "model" entry of the checkpoint ``path`` (``train.init_from``) into ``model``;
    errors name the option, the file and what does not fit. Weights this model has and the
    checkpoint lacks (e.g. the query vector q when a speech-readout LLM-CTC starts a
    query-readout one) keep their initialization and are named in the log; a checkpoint
    weight the model lacks, or of another shape, is an error."""
    if not Path(path).is_file():
        raise FileNotFoundError(f"train.init_from: checkpoint not found: {path}")
    checkpoint = torch.load(path, map_location="cpu", weights_only=False)
    if not isinstance(checkpoint, dict) or checkpoint.get("model") is None:
        raise ValueError(f"train.init_from: {path} has no 'model' entry (expected a checkpoint written by asr.train "
                         "or local.export_decoding_weights)")
    state, own = checkpoint["model"], model.checkpoint_state_dict()
    unexpected = sorted(set(state) - set(own))
    reshaped = [f"{name} {tuple(state[name].shape)} (the model's: {tuple(own[name].shape)})"
                for name in sorted(set(state) & set(own)) if state[name].shape != own[name].shape]
    if unexpected or reshaped or not set(state) & set(own):
        found = (f"weights this model lacks: {unexpected[:5]} ({len(unexpected)} in all)" if unexpected
                 else f"other shapes: {reshaped[:3]}" if reshaped else "no weight of this model")
        raise ValueError(f"train.init_from: the weights of {path} do not fit this model: {found}")
    kept = sorted(set(own) - set(state))
    try:
        model.load_checkpoint_state_dict({**{name: own[name] for name in kept}, **state})
    except (RuntimeError, KeyError, ValueError) as error:
        raise ValueError(f"train.init_from: the weights of {path} do not fit this model: {error}") from None
    logging.info("model initialized from the weights of %s%s", path,
                 f"; {len(kept)} weight(s) it lacks keep their initialization: {', '.join(kept[:8])}"
                 + (" ..." if len(kept) > 8 else "") if kept else "")


def weights_digest(state: Mapping[str, torch.Tensor]) -> str:
    """SHA-256 of a model's weights (names, dtypes, shapes and bytes, in name order): the
    same weights give the same digest whatever file or export holds them."""
    digest = hashlib.sha256()
    for name in sorted(state):
        tensor = state[name].detach().cpu().contiguous()
        digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def start_digest(path: str) -> str:
    """The digest of the weights a run starts from (``train.init_from``'s "model" entry),
    "" without one; checkpoints record it, so that a run whose start changed since (its
    stage trained again) is not resumed or called finished as if it had not."""
    if not path or not Path(path).is_file():
        return ""  # a missing file is named where the weights are loaded
    checkpoint = torch.load(path, map_location="cpu", weights_only=False)
    model = checkpoint.get("model") if isinstance(checkpoint, dict) else None
    return weights_digest(model) if isinstance(model, Mapping) else ""


def schedule_units_per_batch(config: RunConfig, world_size: int) -> float:
    """icefall's duration-adjusted batch count per update (egs/librispeech/ASR/zipformer/train.py,
    get_adjusted_batch_count): seconds of audio per update (all ranks, all accumulated
    microbatches) over the reference duration."""
    options = config.train
    return rank_max_duration(config.data, world_size) * world_size * options.accum_grad / options.schedule_ref_duration


def seed_everything(seed: int) -> None:
    """Seed python's, numpy's and torch's generators."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
