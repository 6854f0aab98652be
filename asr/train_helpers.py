"""Small named pieces of the training loop: distributed setup, mixed precision,
fp16 loss-scale care, and progress reporting (console rate/ETA + tensorboard)."""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import time
from dataclasses import dataclass
from typing import ContextManager, Dict, Optional

import torch
import torch.distributed as dist

from asr.logs import format_duration


def keep_gradient_strides(model: torch.nn.Module) -> None:
    """Make every parameter's gradient arrive with the parameter's own strides.

    Channels-last convolutions (the Zipformer's depthwise and pointwise ones) return
    weight gradients whose size-1 dimensions carry other strides; DDP then copies each into
    its bucket and warns ("Grad strides do not match bucket view strides"). The copy is
    made here instead, for those few small tensors only."""
    for parameter in model.parameters():
        if parameter.requires_grad:
            parameter.register_hook(lambda grad, strides=parameter.stride(): grad
                                    if grad.stride() == strides
                                    else grad.new_empty_strided(grad.shape, strides).copy_(grad))


@dataclass
class Distributed:
    """Where this process runs: its rank among ``world_size`` and its device."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        """Only the main process (rank 0) writes checkpoints, logs and tensorboard."""
        return self.rank == 0


def setup_distributed(device_option: str = "auto", option_name: str = "train.device") -> Distributed:
    """Join the torchrun process group (NCCL on GPUs, gloo on CPU) if WORLD_SIZE > 1;
    ``device_option`` is the value of ``option_name`` (auto, cpu, cuda)."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if device_option not in ("auto", "cpu", "cuda"):
        raise ValueError(f"{option_name} must be auto, cpu or cuda, got {device_option!r}")
    use_cuda = torch.cuda.is_available() if device_option == "auto" else device_option == "cuda"
    if use_cuda and not torch.cuda.is_available():
        raise RuntimeError(f"{option_name}=cuda but no CUDA device is available")
    device = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    if world_size > 1 and not dist.is_initialized():
        dist.init_process_group(backend="nccl" if use_cuda else "gloo")
    return Distributed(rank=rank, world_size=world_size, local_rank=local_rank, device=device)


def leave_distributed() -> None:
    """End a multi-process run on every rank together.

    The caller has dropped its references to the DDP wrapper and the optimizer. A barrier
    first (no rank still in a collective), then the garbage collector frees what only
    reference cycles still hold, while every peer and the store that rank 0 hosts are
    still there, a second barrier, and only then the process group goes. Left to the
    interpreter, DDP's reducer died after ``destroy_process_group``, in the teardown of
    ``main``'s frame, and a rank could hang there once rank 0 had exited.
    """
    dist.barrier()
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()


def all_reduce_sum(values: torch.Tensor, world_size: int) -> torch.Tensor:
    """Sum a tensor over ranks (identity for one process)."""
    if world_size > 1:
        dist.all_reduce(values, op=dist.ReduceOp.SUM)
    return values


def autocast_context(precision: str, device: torch.device) -> ContextManager:
    """bf16/fp16 autocast for the encoder (the model keeps head and loss in FP32)."""
    if precision == "fp32":
        return contextlib.nullcontext()
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return torch.autocast(device_type=device.type, dtype=dtype)


def make_grad_scaler(precision: str, device: torch.device) -> torch.amp.GradScaler:
    """A GradScaler that is active for fp16 only, starting at scale 1.0 (as icefall)."""
    return torch.amp.GradScaler(device.type, init_scale=1.0, enabled=precision == "fp16")


def nurse_grad_scale(scaler: torch.amp.GradScaler, batch_idx_train: int) -> None:
    """Let a collapsed fp16 loss scale grow back, and stop when it is hopeless.

    The scaler only grows every 2000 good steps by itself; like icefall, double a small
    scale sooner (below 2 every 25 batches, below 8 every 100, below 32 every 400).
    Below 1e-5 training has diverged: lower the peak learning rate (icefall's advice):
    ``optim.base_lr`` of the zipformer family, ``optim.lr`` of llm_ctc.
    """
    if not scaler.is_enabled():
        return
    scale = scaler.get_scale()
    if (
        (scale < 2.0 and batch_idx_train % 25 == 0)
        or (scale < 8.0 and batch_idx_train % 100 == 0)
        or (scale < 32.0 and batch_idx_train % 400 == 0)
    ):
        scaler.update(scale * 2.0)
    if scale < 0.01 and batch_idx_train % 100 == 0:
        logging.warning("fp16 grad scale is small: %.2e", scale)
    if scale < 1e-5:
        raise RuntimeError(
            f"fp16 grad scale collapsed to {scale:.2e} at batch {batch_idx_train}: training diverged; "
            f"lower the peak learning rate (optim.base_lr of the zipformer family, e.g. by 0.005; optim.lr of "
            f"llm_ctc) or use train.precision=bf16"
        )


class ProgressReport:
    """Running training statistics, printed every ``log_interval`` optimizer updates with
    rate and ETA.

    Losses are sums over the batch; they are reported per encoder frame. ``add`` is called
    per microbatch, ``maybe_report`` after each update (``accum_grad`` microbatches, or
    the rest of an epoch): the rate is in microbatches per second, the run's ETA in
    updates.
    """

    def __init__(self, log_interval: int, writer: Optional[object] = None, accum_grad: int = 1) -> None:
        self.log_interval = log_interval
        self.writer = writer
        self.accum_grad = accum_grad
        self._reset()

    def _reset(self) -> None:
        self.loss_sum = 0.0
        self.frames = 0
        self.audio_seconds = 0.0
        self.excluded = 0
        self.utterances = 0
        self.batches = 0
        self.updates = 0
        self.started = time.monotonic()

    def add(self, loss_sum: float, frames: int, audio_seconds: float, utterances: int, excluded: int) -> None:
        self.loss_sum += loss_sum
        self.frames += frames
        self.audio_seconds += audio_seconds
        self.utterances += utterances
        self.excluded += excluded
        self.batches += 1

    def maybe_report(
        self, *, epoch: int, batch_in_epoch: int, batch_idx_train: int, lr: float,
        grad_scale: float, batches_per_epoch: Optional[int], max_batches: int,
    ) -> Optional[float]:
        """After an update: log and write scalars when ``batch_idx_train`` (updates) hits
        the interval, and return the interval's loss per frame (else None).
        ``batch_in_epoch`` and ``batches_per_epoch`` count microbatches."""
        self.updates += 1
        if batch_idx_train % self.log_interval != 0 or self.batches == 0:
            return None
        elapsed = max(time.monotonic() - self.started, 1e-9)
        rate = self.batches / elapsed
        loss = self.loss_sum / max(self.frames, 1)
        eta = _eta_text(rate, self.updates / elapsed, batch_in_epoch, batch_idx_train, batches_per_epoch,
                        max_batches)
        of_epoch = f"/{batches_per_epoch}" if batches_per_epoch else ""
        global_count = (f"global {batch_idx_train}" if self.accum_grad == 1
                        else f"update {batch_idx_train} of {self.accum_grad} microbatches")
        logging.info(
            "epoch %d, batch %d%s (%s): loss %.4f per frame, lr %.3e, grad scale %.3g, "
            "%.2f batches/s, %.1fx real time, %d/%d utterances excluded%s",
            epoch, batch_in_epoch, of_epoch, global_count, loss, lr, grad_scale, rate,
            self.audio_seconds / elapsed, self.excluded, self.utterances, eta,
        )
        self.scalars({"train/loss": loss, "train/lr": lr, "train/grad_scale": grad_scale,
                      "train/batches_per_second": rate}, batch_idx_train)
        self._reset()
        return loss

    def scalars(self, values: Dict[str, float], step: int) -> None:
        if self.writer is not None:
            for name, value in values.items():
                self.writer.add_scalar(name, value, step)


def _eta_text(rate: float, update_rate: float, batch_in_epoch: int, batch_idx_train: int,
              batches_per_epoch: Optional[int], max_batches: int) -> str:
    parts = []
    if batches_per_epoch and batch_in_epoch <= batches_per_epoch:
        parts.append(f"epoch ETA {format_duration((batches_per_epoch - batch_in_epoch) / rate)}")
    if max_batches:
        parts.append(f"run ETA {format_duration(max(max_batches - batch_idx_train, 0) / update_rate)}")
    return (", " + ", ".join(parts)) if parts else ""
