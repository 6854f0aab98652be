"""CTC model: Zipformer encoder -> Dropout(0.1) -> vocabulary head, trained with Pruned CTC.

The head's weight and bias go straight to the loss, so training never forms (N, T, V)
logits (paper Sec. 3). Mixed precision (paper App. C.2): the encoder runs under the
caller's bf16/fp16 autocast; dropout, head and loss run in FP32. With
``model.streaming`` the encoder runs on chunk windows (:mod:`zipformer.windows`), one
history h per training update (:func:`asr.chunk_windows.history_for_step`).
"""

from __future__ import annotations

import math
import os
from typing import Any, List, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor, nn

from asr.chunk_windows import history_for_step
from asr.lookahead import lookahead_frames_of
from asr.family import Recognizer
from zipformer.encoder import ZipformerEncoder, encoder_output_lengths
from zipformer.presets import ZipformerConfig
from zipformer.scaling import set_batch_count
from zipformer.windows import windowed_encode, windowed_output_lengths

Targets = Union[Sequence[Sequence[int]], Tensor]


class CTCModel(Recognizer):
    """features (N, T, 80), feature_lens (N,) -> CTC loss or log-probs (N, T', V).

    T' = ((T - 7) // 2 + 1) // 2. ``config.loss`` chooses "pruned" (Pruned CTC) or
    "standard" (dense head + log_softmax + torch CTC, the baseline); both have the same
    signature (``pruned_ctc.pruned_ctc_loss``).
    """

    def __init__(self, config: ZipformerConfig) -> None:
        super().__init__()
        config.validate()
        self.config = config
        self.encoder = ZipformerEncoder(config)
        self.dropout = nn.Dropout(config.head_dropout)
        self.head = nn.Linear(config.output_dim, config.vocab_size)
        self.update = 0  # the training update (start_update), which keys a streaming model's h
        for parameter in self.frozen_parameters():
            parameter.requires_grad_(False)

    def frozen_modules(self) -> List[nn.Module]:
        """The front end and the stacks below the top ``config.trained_stacks`` (none when 0)."""
        if not self.config.trained_stacks:
            return []
        below = self.config.num_stacks - self.config.trained_stacks
        return [self.encoder.encoder_embed] + list(self.encoder.stacks[:below])

    def frozen_parameters(self) -> List[nn.Parameter]:
        return [p for module in self.frozen_modules() for p in module.parameters()]

    def train(self, mode: bool = True) -> "CTCModel":
        super().train(mode)
        for module in self.frozen_modules():  # as decoding runs them: no dropout, no skipping
            module.train(False)
        return self

    @property
    def feature_dim(self) -> int:
        return self.config.feature_dim

    def start_update(self, update: int, batch_count: float) -> None:
        """Drive the encoder's schedules (dropouts, skip rates, balancers) by the
        duration-adjusted batch count, icefall's ScheduledFloat
        (egs/librispeech/ASR/zipformer/scaling.py)."""
        set_batch_count(self, batch_count)
        self.update = int(update)

    def history_seconds(self) -> int:
        """A streaming model's history h: drawn for this update in training,
        ``streaming_max_history`` in evaluation."""
        if not self.training:
            return self.config.streaming_max_history
        return history_for_step(self.config.streaming_seed, self.update, self.config.streaming_max_history)

    def lookahead_frames(self) -> int:
        """A streaming model's lookahead into the next chunk, in feature frames."""
        return lookahead_frames_of(self.config.streaming_lookahead_seconds, self.config.streaming_chunk_seconds)

    def encode(self, features: Tensor, feature_lens: Tensor) -> Tuple[Tensor, Tensor]:
        """Encoder output in FP32 (N, T', D) and its lengths (N,): of whole utterances, or
        of chunk windows for a streaming model."""
        if self.config.streaming:
            encoder_out, encoder_out_lens = windowed_encode(self.encoder, features, feature_lens,
                                                            self.history_seconds(), self.config.streaming_chunk_seconds,
                                                            self.lookahead_frames())
        else:
            encoder_out, encoder_out_lens = self.encoder(features, feature_lens)
        return encoder_out.float(), encoder_out_lens

    def forward(self, features: Tensor, feature_lens: Tensor, targets: Targets, return_stats: bool = False,
                target_lengths: Optional[Tensor] = None) -> Any:
        """Summed CTC loss over the batch (a scalar; reduction "sum" as icefall).

        targets: a list of N token-id lists without blanks, or a padded (N, U) tensor with
        ``target_lengths``. With ``return_stats`` also returns pruned_ctc's LossStats
        (which utterances were excluded and why).
        """
        encoder_out, encoder_out_lens = self.encode(features, feature_lens)
        with torch.autocast(device_type=encoder_out.device.type, enabled=False):
            encoder_out = self.dropout(encoder_out)
            return self.loss_function()(
                encoder_out, self.head.weight, self.head.bias, targets, encoder_out_lens,
                target_lengths=target_lengths, blank_id=self.config.blank_id, reduction="sum",
                return_stats=return_stats, **self._pruning_options())

    def _pruning_options(self) -> dict:
        """The configured chunk size and beam; unset ones keep pruned_ctc's defaults."""
        options = {}
        if self.config.chunk_size is not None:
            options["chunk_size"] = self.config.chunk_size
        if self.config.alignment_beam is not None:
            options["beam"] = None if math.isinf(self.config.alignment_beam) else self.config.alignment_beam
        return options

    def output_lengths(self, num_frames):
        """Model frames (T') for ``num_frames`` feature frames, an int or a tensor."""
        if self.config.streaming:
            return windowed_output_lengths(num_frames, self.config.streaming_chunk_seconds)
        return encoder_output_lengths(num_frames)

    def loss_function(self):
        """The configured loss function (imported lazily: the model builds without it)."""
        from pruned_ctc import pruned_ctc_loss, standard_ctc_loss

        return pruned_ctc_loss if self.config.loss == "pruned" else standard_ctc_loss

    def log_probs(self, features: Tensor, feature_lens: Tensor) -> Tuple[Tensor, Tensor]:
        """Full-vocabulary log-probabilities (N, T', V) in FP32 and lengths (N,), for
        decoding (greedy or prefix beam search)."""
        encoder_out, encoder_out_lens = self.encode(features, feature_lens)
        with torch.autocast(device_type=encoder_out.device.type, enabled=False):
            logits = self.head(self.dropout(encoder_out))
            return logits.log_softmax(dim=-1), encoder_out_lens

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())


def load_ctc_checkpoint(path: Union[str, os.PathLike], entry: str = "model", option: str = "checkpoint") -> CTCModel:
    """The CTC model of a checkpoint file written by ``asr.train`` (or
    ``local.export_decoding_weights``), its ``entry`` weights loaded; errors name ``option``."""
    from pathlib import Path

    from zipformer.presets import config_from_dict

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{option}: Zipformer checkpoint not found: {path}")
    checkpoint = torch.load(path, map_location="cpu", weights_only=False)
    config = checkpoint.get("config") if isinstance(checkpoint, dict) else None
    if not config or "model" not in config:
        raise ValueError(f"{option}: {path} holds no training configuration (expected a checkpoint written by asr.train)")
    if checkpoint.get(entry) is None:
        raise KeyError(f"{option}: {path} has no '{entry}' entry")
    model = CTCModel(config_from_dict(config["model"]))
    model.load_state_dict(checkpoint[entry])
    return model


def parameter_groups(model: nn.Module, lr: float) -> List[dict]:
    """One optimizer group per distinct product of ``lr_scale`` attributes on enclosing
    modules (icefall's get_parameter_groups_with_lrs in egs/librispeech/ASR/zipformer/optim.py);
    the Zipformer CTC recipe sets none: a single group at ``lr``. Frozen parameters
    (``model.trained_stacks``) are left out."""
    groups: dict = {}

    def visit(module: nn.Module, scale: float) -> None:
        scale *= float(getattr(module, "lr_scale", 1.0))
        for param in module.parameters(recurse=False):
            if param.requires_grad:
                groups.setdefault(scale, []).append(param)
        for child in module.children():
            visit(child, scale)

    visit(model, 1.0)
    return [{"params": params, "lr": lr * scale} for scale, params in groups.items()]
