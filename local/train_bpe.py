"""Sentencepiece BPE/unigram model of a recipe, and its ``tokens.txt``.

``<blk>`` is id 0 (the CTC blank), ``<sos/eos>`` id 1 and ``<unk>`` id 2; no BOS/EOS
pieces. Writes ``<lang_dir>/{transcript_words.txt, <type>_<V>.model, bpe.model, tokens.txt}``.

    python -m local.train_bpe data/lang_bpe_500 \\
        --manifests data/manifests/librispeech_supervisions_train-clean-100.jsonl.gz --vocab-size 500
"""

from __future__ import annotations

import argparse
import logging
import shutil
from pathlib import Path
from typing import Sequence

from asr.atomic_io import atomic_output
from local.tokens import BLANK, SOS_EOS, UNK, write_tokens, write_transcript

MODEL_TYPES = ("unigram", "bpe")


def train_bpe(
    lang_dir: Path,
    manifests: Sequence[Path],
    vocab_size: int = 500,
    model_type: str = "unigram",
    hard_vocab_limit: bool = False,
) -> Path:
    """Trains the model on the manifests' texts; returns ``lang_dir/bpe.model``.

    With ``hard_vocab_limit=False`` sentencepiece may return fewer pieces than asked
    when the text is too small for ``vocab_size`` (a warning says how many); with True
    it fails instead. Large vocabularies (e.g. 180,000) need enough text either way.
    Does nothing when ``bpe.model`` and ``tokens.txt`` exist.
    """
    import sentencepiece as spm

    if model_type not in MODEL_TYPES:
        raise ValueError(f"--model-type must be one of {MODEL_TYPES}, found {model_type!r}")
    if vocab_size < 4:
        raise ValueError(f"--vocab-size must be at least 4 (3 special symbols + 1), found {vocab_size}")
    lang_dir = Path(lang_dir)
    final_model, tokens_path = lang_dir / "bpe.model", lang_dir / "tokens.txt"
    if final_model.is_file() and tokens_path.is_file():
        logging.info(f"{final_model} and {tokens_path} exist: skipping")
        return final_model
    lang_dir.mkdir(parents=True, exist_ok=True)
    transcript = lang_dir / "transcript_words.txt"
    if not transcript.is_file():
        write_transcript(manifests, transcript)
    model_prefix = lang_dir / f"{model_type}_{vocab_size}"
    logging.info(f"training sentencepiece {model_type} with {vocab_size} pieces on {transcript}")
    spm.SentencePieceTrainer.train(
        input=str(transcript),
        model_prefix=str(model_prefix),
        model_type=model_type,
        vocab_size=vocab_size,
        character_coverage=1.0,
        input_sentence_size=100_000_000,
        shuffle_input_sentence=True,
        user_defined_symbols=[BLANK, SOS_EOS],
        unk_id=2,
        unk_piece=UNK,
        bos_id=-1,
        eos_id=-1,
        hard_vocab_limit=hard_vocab_limit,
        # The default seed vocabulary (1M) bounds unigram vocabularies; keep it above them.
        seed_sentencepiece_size=max(1_000_000, 4 * vocab_size),
        num_threads=1,
    )
    processor = spm.SentencePieceProcessor(model_file=f"{model_prefix}.model")
    pieces = [processor.id_to_piece(index) for index in range(processor.get_piece_size())]
    if len(pieces) < vocab_size:
        logging.warning(
            f"sentencepiece made {len(pieces)} pieces, fewer than the {vocab_size} asked: "
            f"the text of {transcript} is too small for that vocabulary"
        )
    expected = {0: BLANK, 1: SOS_EOS, 2: UNK}
    for index, symbol in expected.items():
        if pieces[index] != symbol:
            raise RuntimeError(f"{model_prefix}.model has {pieces[index]!r} at id {index}, expected {symbol!r}")
    with atomic_output(final_model) as partial:
        shutil.copyfile(f"{model_prefix}.model", partial)
    write_tokens(pieces, tokens_path)
    logging.info(f"wrote {final_model} and {tokens_path} ({len(pieces)} tokens)")
    return final_model


def main(argv: Sequence[str] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("lang_dir", type=Path)
    parser.add_argument("--manifests", type=Path, nargs="+", required=True, help="supervision or cut manifests")
    parser.add_argument("--vocab-size", type=int, default=500)
    parser.add_argument("--model-type", default="unigram", choices=MODEL_TYPES)
    parser.add_argument("--hard-vocab-limit", action="store_true", help="fail if the text cannot give --vocab-size pieces")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    try:
        train_bpe(args.lang_dir, args.manifests, args.vocab_size, args.model_type, args.hard_vocab_limit)
    except (FileNotFoundError, ValueError) as error:
        raise SystemExit(f"ERROR: {error}")


if __name__ == "__main__":
    main()
