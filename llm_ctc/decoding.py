"""CTC decoding for LLM-CTC: full-head log-probabilities at the readout positions, greedy
or prefix beam search, ids detokenized once with the LLM's tokenizer.

Greedy search needs no log-probabilities: the log-softmax subtracts one normalizer per
frame, so the best class of a frame is the argmax of its logits (with the learned blank
offset eta already on the blank row's bias, Sec. 4.2). :func:`llm_ctc.head_argmax.head_argmax`
finds it one block of head rows at a time and never holds a frame's V = 151,936 logits, nor
runs the exp and log over them (App. D.3 times framewise greedy decoding);
``model.config.screened_argmax`` finds the same argmax through a BF16 product first.

Byte-level BPE pieces (Qwen3) are bytes, not characters: one Mandarin character is 3
UTF-8 bytes that may span two tokens, so text is only made from an utterance's whole
id sequence, never piece by piece.
"""

from __future__ import annotations

from typing import List, Sequence, Tuple

import torch
from torch import Tensor

from asr.search import ctc_collapse, ctc_greedy_search, ctc_prefix_beam_search
from asr.tokenizer import Tokenizer
from llm_ctc.head_argmax import head_argmax

METHODS = ("ctc-greedy-search", "ctc-prefix-beam-search")


class LLMTokenizer(Tokenizer):
    """The LLM's tokenizer behind the toolkit's :class:`asr.tokenizer.Tokenizer`
    interface, with the CTC blank of the model's head.

    encode: lowercased, no special tokens (App. D.2). decode: blank, head rows unused by
    the tokenizer and special tokens are dropped, the rest detokenized at once.
    """

    def __init__(self, tokenizer, num_classes: int, blank_id: int) -> None:
        self.tokenizer = tokenizer
        self._num_classes = int(num_classes)
        self._blank_id = int(blank_id)
        self._tokenizer_size = len(tokenizer)

    @property
    def vocab_size(self) -> int:
        return self._num_classes

    @property
    def blank_id(self) -> int:
        return self._blank_id

    def encode(self, texts: Sequence[str]) -> List[List[int]]:
        if isinstance(texts, str):
            raise TypeError("encode() takes a list of texts, got a single str")
        return [self.tokenizer.encode(text.lower(), add_special_tokens=False) for text in texts]

    def decode(self, ids: Sequence[int]) -> str:
        kept = [int(i) for i in ids if int(i) != self._blank_id and 0 <= int(i) < self._tokenizer_size]
        return self.tokenizer.decode(kept, skip_special_tokens=True)

    def normalize_reference(self, text: str) -> str:
        """Lowercased, as the targets are (App. D.2): references are scored against
        lowercase hypotheses."""
        return text.lower()


def search(log_probs: Tensor, lengths: Tensor, blank_id: int, method: str = "ctc-greedy-search",
           beam: int = 4, token_penalty: float = 0.0) -> List[List[int]]:
    """Token ids per utterance (App. D.2 decodes with beam 4, token penalty 0.3)."""
    if method == "ctc-greedy-search":
        return ctc_greedy_search(log_probs, lengths, blank_id=blank_id)
    if method == "ctc-prefix-beam-search":
        return ctc_prefix_beam_search(log_probs, lengths, beam=beam, blank_id=blank_id,
                                      token_penalty=token_penalty)
    raise ValueError(f"unknown CTC decoding method {method!r}; valid: {', '.join(METHODS)}")


def best_frame_ids(model, features: Tensor, feature_lens: Tensor) -> Tuple[Tensor, Tensor]:
    """The best class of every readout frame of an LLM-CTC model (N, T_n max) and T_n,
    without log-probabilities."""
    states, lengths = model.ctc_states(features, feature_lens)
    return head_argmax(states, model.head_weight, model.head_bias(), model.config.head_chunk_size,
                       screen=model.config.screened_argmax), lengths


def recognize(model, features: Tensor, feature_lens: Tensor, method: str = "ctc-greedy-search",
              beam: int = 4, token_penalty: float = 0.0) -> Tuple[List[List[int]], List[str]]:
    """One LLM forward pass for the batch, then search and detokenization."""
    tokenizer = LLMTokenizer(model.tokenizer, model.head_weight.shape[0], model.blank_id)
    with torch.inference_mode():
        if method == "ctc-greedy-search":
            frame_ids, lengths = best_frame_ids(model, features, feature_lens)
            ids = ctc_collapse(frame_ids, lengths, blank_id=model.blank_id)
        else:
            log_probs, lengths = model.ctc_log_probs(features, feature_lens)
            ids = search(log_probs, lengths, model.blank_id, method, beam, token_penalty)
    return ids, tokenizer.decode_batch(ids)
