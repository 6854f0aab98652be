"""One rank of the DDP test (tests/asr/test_ddp.py), started with torchrun's
environment variables (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT).

    python tests/asr/ddp_rank.py <record.pt> <section.field=value> ...

Trains with :func:`asr.train.main` and saves, for every optimizer update, the epoch,
the global batch index, the cut ids of the microbatches this rank trained on and their
number, its summed loss and a copy of every trainable model parameter.
"""

import faulthandler
import signal
import sys
from typing import Any, Dict, List

import torch

from asr.train import Run, TrainingState, main


def record_steps(record_path: str, overrides: List[str]) -> None:
    steps: List[Dict[str, Any]] = []

    def record(run: Run, batch: dict, state: TrainingState) -> None:
        steps.append({
            "epoch": state.epoch,
            "batch_idx_train": state.batch_idx_train,
            "cut_ids": list(batch["cut_ids"]),  # of all the update's microbatches
            "num_microbatches": batch["num_microbatches"],
            # The report is reset after every logged batch (train.log_interval=1): this batch's loss.
            "loss": run.report.loss_sum,
            "parameters": {name: p.detach().clone() for name, p in run.model.named_parameters()
                           if p.requires_grad},
        })

    main(overrides, after_step=record)
    torch.save(steps, record_path)


if __name__ == "__main__":
    # The launcher sends SIGUSR1 before killing a rank that overran its time: every
    # thread's stack then lands in this rank's log.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    record_steps(sys.argv[1], sys.argv[2:])
