"""Convert an icefall Zipformer CTC checkpoint into this project's checkpoint format.

Takes icefall's ``pretrained.pt`` (``{"model": state_dict}``, as export.py writes it) or
a training checkpoint ``epoch-N.pt`` / ``checkpoint-N.pt`` (``model`` or, with
``--weights model_avg``, its running average), plus the recipe's ``bpe.model`` or
``tokens.txt``, and writes

    <out-dir>/epoch-1.pt     a checkpoint that asr.decode (and fine-tuning) loads
    <out-dir>/lang/          the token table, recorded as the run's lang_dir

The architecture (S, M, L or any custom size) is inferred from the weights' shapes and
printed. The CTC head (``ctc_output``) becomes the model's head; transducer-only parts
(decoder, joiner, simple projections, attention decoder) are skipped with a note. A
checkpoint without a CTC head is refused.

The converted model computes what icefall's computes on each utterance; in a padded
batch its outputs at valid frames do not depend on the padding (icefall's do).

Usage:
    python -m zipformer.icefall_import --checkpoint exp/pretrained.pt \\
        --bpe-model data/lang_bpe_500/bpe.model --out-dir exp/icefall-converted
    python -m asr.decode --exp-dir exp/icefall-converted --epoch 1 --avg 1 \\
        --use-averaged-model false --test-cuts data/fbank/librispeech_cuts_test-clean.jsonl.gz
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path
from typing import Optional, Sequence, Tuple

from asr.checkpoint import save_checkpoint
from zipformer.icefall_checkpoint import WEIGHT_ENTRIES, load_icefall_checkpoint, saved_training_args, select_weights
from zipformer.icefall_state_dict import (
    CTC_WEIGHT, IcefallCheckpointError, infer_config, map_names, preset_name, split_parts,
)
from zipformer.model import CTCModel
from asr.config import RunConfig
from asr.tokenizer import BpeTokenizer, CharTokenizer, Tokenizer

BPE_WORD_BOUNDARY = "\u2581"  # sentencepiece's word-start mark


def load_tokens(bpe_model: Optional[Path], tokens: Optional[Path]) -> Tuple[Tokenizer, Path]:
    if (bpe_model is None) == (tokens is None):
        raise IcefallCheckpointError("give exactly one of --bpe-model and --tokens")
    if bpe_model is not None:
        if not bpe_model.is_file():
            raise FileNotFoundError(f"--bpe-model: file not found: {bpe_model}")
        return BpeTokenizer(bpe_model), bpe_model
    if not tokens.is_file():
        raise FileNotFoundError(f"--tokens: file not found: {tokens}")
    tokenizer = CharTokenizer(tokens)
    if any(s.startswith(BPE_WORD_BOUNDARY) for s in tokenizer._symbol_to_id):
        raise IcefallCheckpointError(
            f"--tokens {tokens} is a BPE token table (symbols start with '{BPE_WORD_BOUNDARY}'): "
            "give the recipe's bpe.model with --bpe-model instead, so that words decode")
    return tokenizer, tokens


def convert(checkpoint_path: Path, out_dir: Path, bpe_model: Optional[Path] = None,
            tokens: Optional[Path] = None, weights: str = "model", allow_pickle: bool = False,
            pos_head_dim: Optional[int] = None, log=print) -> Path:
    """Write ``out_dir/epoch-1.pt`` and ``out_dir/lang/``; returns the checkpoint path."""
    checkpoint = load_icefall_checkpoint(checkpoint_path, allow_pickle)
    state_dict, skipped = split_parts(select_weights(checkpoint, weights, checkpoint_path))
    if CTC_WEIGHT not in state_dict:
        raise IcefallCheckpointError(
            f"{checkpoint_path} has no CTC head ('{CTC_WEIGHT}'): it is a transducer-only "
            "model (trained without --use-ctc 1); this project decodes with CTC only")
    config = infer_config(state_dict, saved_training_args(checkpoint), pos_head_dim)
    tokenizer, token_file = load_tokens(bpe_model, tokens)
    if tokenizer.vocab_size != config.vocab_size or tokenizer.blank_id != config.blank_id:
        raise IcefallCheckpointError(
            f"{token_file} has {tokenizer.vocab_size} tokens (blank {tokenizer.blank_id}) but the "
            f"CTC head has {config.vocab_size} outputs (blank {config.blank_id}): give the "
            "token table the model was trained with")
    model = CTCModel(config)
    missing, unexpected = model.load_state_dict(map_names(state_dict), strict=False)
    if missing or unexpected:
        raise IcefallCheckpointError(
            f"{checkpoint_path}: weights do not fit the inferred architecture: missing "
            f"{sorted(missing)[:5]}{'...' if len(missing) > 5 else ''}, unexpected "
            f"{sorted(unexpected)[:5]}{'...' if len(unexpected) > 5 else ''}")

    lang_dir = out_dir / "lang"
    lang_dir.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(token_file, lang_dir / token_file.name)
    run_config = RunConfig(model=config).to_dict()
    run_config["train"]["exp_dir"], run_config["train"]["lang_dir"] = str(out_dir), str(lang_dir)
    path = save_checkpoint(out_dir / "epoch-1.pt", model=model, config=run_config,
                           batch_idx_train=0, epoch=1,
                           extra={"icefall_source": str(checkpoint_path), "icefall_weights": weights})

    size = preset_name(config)
    log(f"icefall Zipformer {'-' + size if size else 'of a custom size'}: "
        f"{model.num_parameters():,} parameters, vocabulary {config.vocab_size}")
    log("  " + ", ".join(f"{k}={v}" for k, v in config.to_dict().items()
                         if k in ("num_encoder_layers", "downsampling_factor", "encoder_dim",
                                  "feedforward_dim", "num_heads", "cnn_module_kernel")))
    if skipped:
        log(f"  skipped transducer-only parts: {', '.join(skipped)}")
    log(f"wrote {path} and {lang_dir}/{token_file.name}")
    return path


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(description="Convert an icefall Zipformer CTC checkpoint.")
    parser.add_argument("--checkpoint", type=Path, required=True,
                        help="icefall pretrained.pt, epoch-N.pt or checkpoint-N.pt")
    parser.add_argument("--bpe-model", type=Path, help="the recipe's bpe.model (BPE lang dir)")
    parser.add_argument("--tokens", type=Path, help="the recipe's tokens.txt (character table)")
    parser.add_argument("--out-dir", type=Path, required=True, help="experiment folder to write")
    parser.add_argument("--weights", choices=WEIGHT_ENTRIES, default="model",
                        help="which entry of a training checkpoint to convert")
    parser.add_argument("--pos-head-dim", type=int, default=None,
                        help="icefall --pos-head-dim (default: the checkpoint's arguments, else 4); "
                             "fixes the number of heads when the checkpoint does not store them")
    parser.add_argument("--allow-pickle", action="store_true",
                        help="read a checkpoint holding Python objects (only for trusted files)")
    args = parser.parse_args(argv)
    if (args.out_dir / "epoch-1.pt").exists():
        raise SystemExit(f"ERROR: --out-dir {args.out_dir} already has epoch-1.pt; choose a new folder")
    try:
        convert(args.checkpoint, args.out_dir, args.bpe_model, args.tokens, args.weights,
                args.allow_pickle, args.pos_head_dim)
    except (FileNotFoundError, ValueError) as error:
        raise SystemExit(f"ERROR: {error}") from None


if __name__ == "__main__":
    main()
