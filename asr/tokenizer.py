"""Text <-> token ids for CTC training and decoding.

Two kinds of lexicon share one interface, :class:`Tokenizer`:

* :class:`BpeTokenizer` wraps a sentencepiece model (``data/lang_bpe_<V>/bpe.model``)
  trained with ``<blk>`` = 0 and ``<sos/eos>`` = 1 as user-defined symbols and
  ``<unk>`` = 2 (LibriSpeech, GigaSpeech).
* :class:`CharTokenizer` reads an icefall character table
  (``data/lang_char/tokens.txt``, lines ``"<symbol> <id>"``) for Mandarin
  (AISHELL-1): text is split into characters and spaces are dropped.

:func:`load_tokenizer` picks the kind from what a lang directory holds.
"""

from __future__ import annotations

import abc
from pathlib import Path
from typing import Dict, List, Sequence

from asr.config import PathLike

BLANK_SYMBOL = "<blk>"
SOS_EOS_SYMBOL = "<sos/eos>"
UNK_SYMBOL = "<unk>"



class Tokenizer(abc.ABC):
    """Maps transcripts to CTC target ids and back.

    Id 0 is the CTC blank in every lexicon this project writes; ``blank_id``
    says so explicitly for code that must not assume it.
    """

    @property
    @abc.abstractmethod
    def vocab_size(self) -> int:
        """Number of output classes V of the CTC head (blank included)."""

    @property
    @abc.abstractmethod
    def blank_id(self) -> int:
        """Id of the CTC blank symbol ``<blk>``."""

    @abc.abstractmethod
    def encode(self, texts: Sequence[str]) -> List[List[int]]:
        """Token ids of each transcript (one list per text, no blanks)."""

    @abc.abstractmethod
    def decode(self, ids: Sequence[int]) -> str:
        """Text of one hypothesis; blank and ``<sos/eos>`` ids are ignored."""

    def decode_batch(self, batch_ids: Sequence[Sequence[int]]) -> List[str]:
        """Text of each hypothesis of a batch."""
        return [self.decode(ids) for ids in batch_ids]

    def normalize_reference(self, text: str) -> str:
        """A reference transcript as this lexicon's hypotheses spell it (scoring)."""
        return text


class BpeTokenizer(Tokenizer):
    """Sentencepiece BPE/unigram model with icefall's special-symbol ids.

    Args:
        model_path: the ``bpe.model`` file.

    Raises:
        FileNotFoundError: ``model_path`` does not exist.
        ValueError: the model lacks ``<blk>`` (it was not trained with the
            special symbols this project expects).
    """

    def __init__(self, model_path: PathLike) -> None:
        import sentencepiece

        model_path = Path(model_path)
        if not model_path.is_file():
            raise FileNotFoundError(f"sentencepiece model not found: {model_path}")
        self.model_path = model_path
        self._processor = sentencepiece.SentencePieceProcessor()
        self._processor.load(str(model_path))
        blank = self._processor.piece_to_id(BLANK_SYMBOL)
        unk = self._processor.unk_id()
        if blank == unk:
            raise ValueError(
                f"{model_path}: sentencepiece model has no {BLANK_SYMBOL} piece; train it "
                f"with user_defined_symbols=['{BLANK_SYMBOL}', '{SOS_EOS_SYMBOL}']"
            )
        self._blank_id = blank
        sos_eos = self._processor.piece_to_id(SOS_EOS_SYMBOL)
        self._ignored_on_decode = {blank} | ({sos_eos} if sos_eos != unk else set())

    @property
    def vocab_size(self) -> int:
        return self._processor.get_piece_size()

    @property
    def blank_id(self) -> int:
        return self._blank_id

    def encode(self, texts: Sequence[str]) -> List[List[int]]:
        if isinstance(texts, str):
            raise TypeError("encode() takes a list of texts, got a single str")
        return self._processor.encode(list(texts), out_type=int)

    def decode(self, ids: Sequence[int]) -> str:
        kept = [int(i) for i in ids if int(i) not in self._ignored_on_decode]
        _check_id_range(kept, self.vocab_size, self.model_path)
        return self._processor.decode(kept)


class CharTokenizer(Tokenizer):
    """Character table in icefall's ``tokens.txt`` format.

    Each line is ``"<symbol> <id>"``; ``<blk>`` must be 0. Symbols starting with
    ``#`` (disambiguation symbols of a lexicon FST) are not output classes.
    Characters missing from the table encode to ``<unk>``.

    Args:
        tokens_path: the ``tokens.txt`` file.

    Raises:
        FileNotFoundError: ``tokens_path`` does not exist.
        ValueError: a malformed line, a duplicated id or symbol, or a missing
            ``<blk>`` / ``<unk>``.
    """

    def __init__(self, tokens_path: PathLike) -> None:
        tokens_path = Path(tokens_path)
        if not tokens_path.is_file():
            raise FileNotFoundError(f"token table not found: {tokens_path}")
        self.tokens_path = tokens_path
        self._symbol_to_id = read_tokens(tokens_path)
        for required in (BLANK_SYMBOL, UNK_SYMBOL):
            if required not in self._symbol_to_id:
                raise ValueError(f"{tokens_path}: the table has no {required} line")
        self._id_to_symbol = {i: s for s, i in self._symbol_to_id.items()}
        self._unk_id = self._symbol_to_id[UNK_SYMBOL]
        self._vocab_size = 1 + max(self._symbol_to_id.values())
        self._ignored_on_decode = {self._symbol_to_id[BLANK_SYMBOL]}
        if SOS_EOS_SYMBOL in self._symbol_to_id:
            self._ignored_on_decode.add(self._symbol_to_id[SOS_EOS_SYMBOL])

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    @property
    def blank_id(self) -> int:
        return self._symbol_to_id[BLANK_SYMBOL]

    def encode(self, texts: Sequence[str]) -> List[List[int]]:
        if isinstance(texts, str):
            raise TypeError("encode() takes a list of texts, got a single str")
        return [
            [self._symbol_to_id.get(char, self._unk_id) for char in text if not char.isspace()]
            for text in texts
        ]

    def decode(self, ids: Sequence[int]) -> str:
        kept = [int(i) for i in ids if int(i) not in self._ignored_on_decode]
        _check_id_range(kept, self.vocab_size, self.tokens_path)
        return "".join(self._id_to_symbol.get(i, UNK_SYMBOL) for i in kept)


def load_tokenizer(lang_dir: PathLike) -> Tokenizer:
    """The tokenizer of a lang directory.

    ``<lang_dir>/bpe.model`` makes a :class:`BpeTokenizer` (a BPE lang dir also
    holds a ``tokens.txt``, which is then ignored); otherwise
    ``<lang_dir>/tokens.txt`` makes a :class:`CharTokenizer`.

    Raises:
        FileNotFoundError: naming both files looked for.
    """
    lang_dir = Path(lang_dir)
    bpe_model = lang_dir / "bpe.model"
    tokens = lang_dir / "tokens.txt"
    if bpe_model.is_file():
        return BpeTokenizer(bpe_model)
    if tokens.is_file():
        return CharTokenizer(tokens)
    raise FileNotFoundError(
        f"lang dir {lang_dir} has neither {bpe_model.name} (BPE) nor {tokens.name} "
        f"(char table): looked for {bpe_model} and {tokens}"
    )


def read_tokens(path: PathLike) -> Dict[str, int]:
    """icefall's ``tokens.txt`` (``symbol id`` per line) -> {symbol: id}; names the bad line."""
    path = Path(path)
    symbol_to_id: Dict[str, int] = {}
    seen_ids: Dict[int, str] = {}
    with path.open(encoding="utf-8") as table:
        for line_number, line in enumerate(table, start=1):
            fields = line.split()
            if not fields:
                continue
            if len(fields) != 2 or not fields[1].lstrip("-").isdigit():
                raise ValueError(
                    f"{path}:{line_number}: expected '<symbol> <id>', found {line.rstrip()!r}"
                )
            symbol, token_id = fields[0], int(fields[1])
            if symbol.startswith("#"):
                continue
            if symbol in symbol_to_id or token_id in seen_ids:
                raise ValueError(
                    f"{path}:{line_number}: duplicated symbol or id in {line.rstrip()!r}"
                )
            symbol_to_id[symbol] = token_id
            seen_ids[token_id] = symbol
    return symbol_to_id


def write_tokens(symbols: Sequence[str], path: PathLike) -> Path:
    """Writes ``symbol id`` lines, ids counting from 0 in the given order."""
    from asr.atomic_io import write_text_atomically

    if len(set(symbols)) != len(symbols):
        raise ValueError(f"token symbols for {path} are not unique")
    write_text_atomically(path, "".join(f"{symbol} {index}\n" for index, symbol in enumerate(symbols)))
    return Path(path)


def _check_id_range(ids: Sequence[int], vocab_size: int, source: Path) -> None:
    bad = [i for i in ids if not 0 <= i < vocab_size]
    if bad:
        raise ValueError(
            f"token id {bad[0]} out of range [0, {vocab_size}) of {source}"
        )
