"""Did a training run stall? The newest checkpoint of an experiment folder holds the
training loss per frame of every log interval (``asr.train``'s ``train_losses``); when
their mean over the last ``--last-updates`` updates is above ``--max-loss``, a warning
says so, with the measured curve and what to do (``--remedy``)::

    python -m local.training_stall exp/full_llm_ctc --max-loss 0.16 \\
        --remedy "move exp/full_llm_ctc aside and run stage 8 again with another train.seed"

On egs/mini, stage 8's LLM-CTC on the tiny LM learns (the last 100 of its 1,200 updates
at 0.12-0.13 per frame, test-clean 4.6-6.2%), learns slowly (0.182: 9.52%, and stage
11's offline speech readout from it made 3.5x the errors of one from a learned stage 8)
or stalls with the speech embeddings unread (0.50-0.93 per frame, 37-55%), by the draw
of the seed (egs/mini/RESULTS.md, "Stage 8 on the joined stage 4", "Stage 11 over three
seeds, and a slow stage 8"), so run.sh reads it at ``--max-loss 0.16``. The LLM steps of
its stages 10 and 11 (2,300 updates) that learned end at 0.010-0.063, and slow ones sit
between them and the stalls (0.106: 8.3x the errors), so run.sh reads those at
``--max-loss 0.08`` (egs/mini/RESULTS.md, "Slow LLM steps"). A warning, not an error:
the run's files stay as they are, and the exit status is 0 either way (2 for a folder
without a checkpoint), or ``--stalled-status`` for a run that stalled (egs/mini's stages
8, 10 and 11 train such a run again).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

from asr.checkpoint import read_checkpoint_entry
from asr.weights import newest_checkpoint


def recent_loss(train_losses: Sequence[Tuple[int, float]], last_updates: int) -> Optional[float]:
    """Mean loss of the log intervals that end within the last ``last_updates`` updates
    (the last interval alone when it is longer), or None for an empty record."""
    if not train_losses:
        return None
    final_update = train_losses[-1][0]
    recent = [loss for update, loss in train_losses if update > final_update - last_updates] or [train_losses[-1][1]]
    return sum(recent) / len(recent)


def stall_warning(exp_dir: Path, max_loss: float, last_updates: int, remedy: str) -> Tuple[Optional[str], bool]:
    """(the warning for ``exp_dir``'s newest checkpoint or None when it learned, whether it
    stalled): a checkpoint without losses is warned about, not counted as stalled."""
    checkpoint = newest_checkpoint(exp_dir)
    if checkpoint is None:
        raise FileNotFoundError(f"exp_dir: no epoch-*.pt or checkpoint-*.pt in {exp_dir}")
    try:
        train_losses: List[Tuple[int, float]] = [(int(u), float(v)) for u, v in
                                                 read_checkpoint_entry(checkpoint, "train_losses")]
    except KeyError:
        return (f"{checkpoint} holds no training losses (written before asr.train recorded them): "
                f"cannot tell whether the run stalled; its log holds the curve"), False
    loss = recent_loss(train_losses, last_updates)
    if loss is None or loss <= max_loss:
        return None, False
    final_update = train_losses[-1][0]
    shown = train_losses[:: max(1, len(train_losses) // 6)]
    if shown[-1] != train_losses[-1]:
        shown.append(train_losses[-1])
    curve = ", ".join(f"{update}: {value:.3f}" for update, value in shown)
    return (f"the run in {exp_dir} stalled: its training loss over the last {last_updates} of its "
            f"{final_update} updates is {loss:.3f} per frame, above {max_loss:g} (update: loss per frame "
            f"{curve}). {remedy}"), True


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("exp_dir", type=Path)
    parser.add_argument("--max-loss", type=float, required=True,
                        help="training loss per frame above which the run counts as stalled")
    parser.add_argument("--last-updates", type=int, default=100,
                        help="the loss is averaged over the log intervals ending in these last updates")
    parser.add_argument("--remedy", default="", help="what the warning tells the user to do")
    parser.add_argument("--stalled-status", type=int, default=0,
                        help="exit status after the warning, for a caller that acts on it (0: the warning only; "
                             "not 2, which means no checkpoint)")
    args = parser.parse_args(argv)
    if args.max_loss <= 0 or args.last_updates <= 0:
        parser.error(f"--max-loss and --last-updates must be > 0, got {args.max_loss:g} and {args.last_updates}")
    if not 0 <= args.stalled_status <= 255 or args.stalled_status == 2:
        parser.error(f"--stalled-status must be 0-255 and not 2 (no checkpoint), got {args.stalled_status}")
    try:
        warning, stalled = stall_warning(args.exp_dir, args.max_loss, args.last_updates, args.remedy)
    except FileNotFoundError as error:
        print(f"ERROR: {error}", file=sys.stderr)
        return 2
    if warning is not None:
        print(f"WARNING: {warning}", file=sys.stderr)
    return args.stalled_status if stalled else 0


if __name__ == "__main__":
    sys.exit(main())
