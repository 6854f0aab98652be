"""CTC decoding for LLM-CTC: full-head log-probabilities at the readout positions, greedy
or prefix beam search, ids detokenized once with the LLM's tokenizer.

Greedy search needs no log-probabilities: the log-softmax subtracts one normalizer per
frame, so the best class of a frame is the argmax of its logits (with the learned blank
offset eta already on the blank row's bias, Sec. 4.2). :func:`head_argmax` finds it one
block of head rows at a time and never holds a frame's V = 151,936 logits, nor runs the
exp and log over them (App. D.3 times framewise greedy decoding).

Byte-level BPE pieces (Qwen3) are bytes, not characters: one Mandarin character is 3
UTF-8 bytes that may span two tokens, so text is only made from an utterance's whole
id sequence, never piece by piece.
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import torch
from torch import Tensor

from asr.search import ctc_collapse, ctc_greedy_search, ctc_prefix_beam_search
from asr.tokenizer import Tokenizer

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


def head_argmax(states: Tensor, weight: Tensor, bias: Optional[Tensor], rows_per_block: int = 4096) -> Tensor:
    """states (..., D), weight (V, D), bias (V,) or None -> the argmax over V of the
    float32 logits (int64, (...)), computed as :func:`llm_ctc.head.head_logits` computes
    them, block by block, keeping the running best (the first of equal maxima, as
    ``torch.argmax``)."""
    vocab = weight.shape[0]
    if vocab == 0:
        raise ValueError("weight has no rows: no class to choose")
    inputs = states.float()
    best_value = best_index = None
    for start in range(0, vocab, rows_per_block):
        stop = min(start + rows_per_block, vocab)
        block = inputs @ weight[start:stop].float().t()
        if bias is not None:
            block = block + bias[start:stop].float()
        value, index = block.max(dim=-1)
        if best_value is None:
            best_value, best_index = value, index
        else:
            better = value > best_value
            best_value = torch.where(better, value, best_value)
            best_index = torch.where(better, index + start, best_index)
    return best_index


def best_frame_ids(model, features: Tensor, feature_lens: Tensor) -> Tuple[Tensor, Tensor]:
    """The best class of every readout frame of an LLM-CTC model (N, T_n max) and T_n,
    without log-probabilities."""
    states, lengths = model.ctc_states(features, feature_lens)
    return head_argmax(states, model.head_weight, model.head_bias(), model.config.head_chunk_size), lengths


def recognize(model, features: Tensor, feature_lens: Tensor, method: str = "ctc-greedy-search",
              beam: int = 4, token_penalty: float = 0.0) -> Tuple[List[List[int]], List[str]]:
    """One LLM forward pass for the batch, then search and detokenization."""
    tokenizer = LLMTokenizer(model.tokenizer, model.head_weight.shape[0], model.blank_id)
    with torch.no_grad():
        if method == "ctc-greedy-search":
            frame_ids, lengths = best_frame_ids(model, features, feature_lens)
            ids = ctc_collapse(frame_ids, lengths, blank_id=model.blank_id)
        else:
            log_probs, lengths = model.ctc_log_probs(features, feature_lens)
            ids = search(log_probs, lengths, model.blank_id, method, beam, token_penalty)
    return ids, tokenizer.decode_batch(ids)
