"""CTC decoding for LLM-CTC: full-head log-probabilities at the readout positions, greedy
or prefix beam search, ids detokenized once with the LLM's tokenizer.

Greedy search needs no log-probabilities: the log-softmax subtracts one normalizer per
frame, so the best class of a frame is the argmax of its logits (with the learned blank
offset eta already on the blank row's bias, Sec. 4.2). :func:`llm_ctc.head_argmax.head_argmax`
finds it one block of head rows at a time and never holds a frame's V = 151,936 logits, nor
runs the exp and log over them (App. D.3 times framewise greedy decoding);
``model.config.screened_argmax`` finds the same argmax through a BF16 product first.

Text is made once from an utterance's whole id sequence (:class:`llm_ctc.tokenizer.LLMTokenizer`).
"""

from __future__ import annotations

from typing import List, Tuple

import torch
from torch import Tensor

from asr.decode_methods import GREEDY, ctc_search
from llm_ctc.tokenizer import LLMTokenizer


def best_frame_ids(model, features: Tensor, feature_lens: Tensor) -> Tuple[Tensor, Tensor]:
    """The best class of every readout frame of an LLM-CTC model (N, T_n max) and T_n,
    without log-probabilities."""
    states, lengths = model.ctc_states(features, feature_lens)
    return model.frame_argmax(states), lengths


def recognize(model, features: Tensor, feature_lens: Tensor, method: str = "ctc-greedy-search",
              beam: int = 4, token_penalty: float = 0.0,
              blank_penalty: float = 0.0) -> Tuple[List[List[int]], List[str]]:
    """One LLM forward pass for the batch, then search and detokenization."""
    tokenizer = LLMTokenizer.of_model(model)
    with torch.inference_mode():
        if method == GREEDY and not blank_penalty:
            scores, lengths = model.best_frame_ids(features, feature_lens)
        else:
            scores, lengths = model.log_probs(features, feature_lens)
        ids = ctc_search(method, scores, lengths, model.blank_id, beam, token_penalty, blank_penalty)
    return ids, tokenizer.decode_batch(ids)
