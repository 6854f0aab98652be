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
from asr.averaging import weights_for_decoding
from asr.checkpoint import CHECKPOINT_FORMAT_VERSION, read_checkpoint_entry
from asr.config import RunConfig
from asr.decode import choose_weights, newest_checkpoint


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
        if not args.exp_dir.is_dir():
            raise FileNotFoundError(f"exp_dir: experiment folder not found: {args.exp_dir}")
        saved = RunConfig.from_dict(read_checkpoint_entry(newest_checkpoint(args.exp_dir), "config"), args.overrides)
        weights = choose_weights(args.exp_dir, saved.decode)
        options = saved.decode
        state = weights_for_decoding(args.exp_dir, epoch=weights.epoch, iteration=weights.iteration,
                                     avg=options.avg, use_averaged_model=options.use_averaged_model)
    except (FileNotFoundError, ValueError, KeyError) as error:
        raise SystemExit(f"ERROR: {error}") from None
    chosen = read_checkpoint_entry(weights.paths[-1], "config")
    torch_save_atomically({"model": state, "config": chosen, "format_version": CHECKPOINT_FORMAT_VERSION,
                           "decoding_weights": weights.suffix, "sources": [str(p) for p in weights.paths]}, args.out)
    print(f"export: wrote {args.out} ({weights.suffix} of {args.exp_dir})")


if __name__ == "__main__":
    main()
