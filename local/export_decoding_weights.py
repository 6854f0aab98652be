"""Write the weights a decoder would use (``decode.epoch/iter``, ``avg``,
``use_averaged_model`` of a run's configuration) as one checkpoint file, e.g. the
averaged Zipformer that LLM-CTC takes as its frozen speech encoder
(``model.encoder_path``):

    python -m local.export_decoding_weights exp/full_pruned_ctc exp/full_pruned_ctc/decoding.pt \\
        decode.iter=last decode.avg=1 decode.use_averaged_model=true

The file holds ``model`` (the chosen weights), the training ``config`` and the
checkpoint format version, as ``asr.train`` writes them; it is written to a temporary
name and renamed. An existing file is kept (the program says so).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Sequence

from asr.atomic_io import torch_save_atomically
from asr.checkpoint import CHECKPOINT_FORMAT_VERSION, read_checkpoint_entry
from asr.weights import choose_weights, explicit_choice, saved_run_config


def main(argv: Sequence[str] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("exp_dir", type=Path, help="the training run's folder (train.exp_dir)")
    parser.add_argument("out", type=Path, help="the checkpoint file to write")
    parser.add_argument("overrides", nargs="*", help="decode.field=value overrides of the saved configuration")
    args = parser.parse_args(argv)
    if args.out.is_file():
        print(f"export: {args.out} exists, skipping")
        return
    try:
        saved = saved_run_config(args.exp_dir, explicit_choice(args.overrides))
        weights = choose_weights(args.exp_dir, saved.decode)
        state = weights.state_dict()
    except (FileNotFoundError, ValueError, KeyError) as error:
        raise SystemExit(f"ERROR: {error}") from None
    chosen = read_checkpoint_entry(weights.paths[-1], "config")
    torch_save_atomically({"model": state, "config": chosen, "format_version": CHECKPOINT_FORMAT_VERSION,
                           "decoding_weights": weights.suffix, "sources": [str(p) for p in weights.paths]}, args.out)
    print(f"export: wrote {args.out} ({weights.suffix} of {args.exp_dir})")


if __name__ == "__main__":
    main()
