"""The LLM's own tokenizer as the toolkit's lexicon (:class:`asr.tokenizer.Tokenizer`), with
the CTC blank of the model's head (Sec. 4.2, App. D.2).

Byte-level BPE pieces (Qwen3) are bytes, not characters: one Mandarin character is 3
UTF-8 bytes that may span two tokens, so text is only made from an utterance's whole id
sequence, never piece by piece.
"""

from __future__ import annotations

from typing import List, Sequence

from asr.tokenizer import Tokenizer


class LLMTokenizer(Tokenizer):
    """The LLM's tokenizer behind the toolkit's :class:`asr.tokenizer.Tokenizer`
    interface, with the CTC blank of the model's head.

    encode: lowercased, no special tokens (App. D.2); with ``leading_space``, after a space,
    so that a text's first word takes the token it has after another word (byte-level BPE
    has two: "why" opens a text, " why" follows a word), one form per word wherever a
    transcript starts in a stream (``model.transcript_leading_space``; not in the paper).
    decode: blank, head rows unused by the tokenizer and special tokens are dropped, the
    rest detokenized at once (with ``leading_space``, without the space it starts with).
    """

    def __init__(self, tokenizer, num_classes: int, blank_id: int, leading_space: bool = False) -> None:
        self.tokenizer = tokenizer
        self._num_classes = int(num_classes)
        self._blank_id = int(blank_id)
        self._tokenizer_size = len(tokenizer)
        self.leading_space = bool(leading_space)

    @classmethod
    def of_model(cls, model) -> "LLMTokenizer":
        """The lexicon of a built LLM-CTC or LLM-CE model: its tokenizer, head rows, blank
        and ``model.transcript_leading_space``."""
        return cls(model.tokenizer, model.head_weight.shape[0], model.blank_id,
                   model.config.transcript_leading_space)

    @property
    def vocab_size(self) -> int:
        return self._num_classes

    @property
    def blank_id(self) -> int:
        return self._blank_id

    def encode(self, texts: Sequence[str]) -> List[List[int]]:
        if isinstance(texts, str):
            raise TypeError("encode() takes a list of texts, got a single str")
        prefix = " " if self.leading_space else ""
        return [self.tokenizer.encode(prefix + text.lower(), add_special_tokens=False) for text in texts]

    def decode(self, ids: Sequence[int]) -> str:
        kept = [int(i) for i in ids if int(i) != self._blank_id and 0 <= int(i) < self._tokenizer_size]
        text = self.tokenizer.decode(kept, skip_special_tokens=True)
        return text[1:] if self.leading_space and text.startswith(" ") else text

    def normalize_reference(self, text: str) -> str:
        """Lowercased, as the targets are (App. D.2): references are scored against
        lowercase hypotheses."""
        return text.lower()
