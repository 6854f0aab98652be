"""The character table of a Mandarin recipe (``data/lang_char/tokens.txt``):
``<blk>`` 0, ``<sos/eos>`` 1, ``<unk>`` 2, then every distinct character of the
training transcripts (whitespace removed) in code-point order. On AISHELL-1's
training set that is 4336 entries.

    python -m local.prepare_char data/lang_char --manifests data/manifests/aishell_supervisions_train.jsonl.gz
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import List, Sequence

from local.tokens import SPECIAL_SYMBOLS, manifest_texts, write_tokens, write_transcript


def char_table(texts: Sequence[str]) -> List[str]:
    """Special symbols followed by the sorted distinct non-space characters."""
    characters = sorted({char for text in texts for char in text if not char.isspace()})
    return list(SPECIAL_SYMBOLS) + [c for c in characters if c not in SPECIAL_SYMBOLS]


def prepare_char(lang_dir: Path, manifests: Sequence[Path]) -> Path:
    """Writes ``lang_dir/{text, tokens.txt}``; returns ``tokens.txt``. Skips when it exists."""
    lang_dir = Path(lang_dir)
    tokens_path = lang_dir / "tokens.txt"
    if tokens_path.is_file():
        logging.info(f"{tokens_path} exists: skipping")
        return tokens_path
    lang_dir.mkdir(parents=True, exist_ok=True)
    write_transcript(manifests, lang_dir / "text")
    symbols = char_table(list(manifest_texts(manifests)))
    write_tokens(symbols, tokens_path)
    logging.info(f"wrote {tokens_path} ({len(symbols)} tokens)")
    return tokens_path


def main(argv: Sequence[str] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("lang_dir", type=Path)
    parser.add_argument("--manifests", type=Path, nargs="+", required=True, help="supervision or cut manifests")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    try:
        prepare_char(args.lang_dir, args.manifests)
    except (FileNotFoundError, ValueError) as error:
        raise SystemExit(f"ERROR: {error}")


if __name__ == "__main__":
    main()
