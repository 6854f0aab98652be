"""LLM-CE, the autoregressive baseline (Sec. 4.1, eq. 10) on the same parts as LLM-CTC.

The LLM's chat template wraps the speech in a user turn; the assistant turn is the
lowercased transcript followed by EOS. Cross-entropy is computed only at the |y_n| + 1
positions that predict the transcript and EOS: the frozen head is applied to those rows
alone, never over the whole (N, S) sequence, one block of head rows at a time
(:mod:`llm_ctc.ce_loss`).
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor

from asr.decode_methods import CTC_SEARCH, GENERATION
from asr.family import LossStats, NotDecodableBy, NothingExcluded
from llm_ctc.base import SpeechLLM
from llm_ctc.ce_loss import frozen_head_cross_entropy
from llm_ctc.config import LLMASRConfig
from llm_ctc.head import head_logits
from llm_ctc.language_model import backbone_states
from llm_ctc.sequence import build_sequences, read_rows

# Stands for the speech while the chat template is rendered as text; never tokenized.
_SPEECH_MARK = "\u0000SPEECH\u0000"


def chat_template_parts(tokenizer, user_text: str) -> Tuple[List[int], List[int]]:
    """Token ids of the template before and after the speech in one user turn, up to and
    including the start of the assistant turn (thinking off where the template has it)."""
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(f"the tokenizer {getattr(tokenizer, 'name_or_path', tokenizer)!r} has no chat "
                         "template: LLM-CE needs the user/assistant template of an instruction model")
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": user_text + _SPEECH_MARK}],
                                             tokenize=False, add_generation_prompt=True, enable_thinking=False)
    if rendered.count(_SPEECH_MARK) != 1:
        raise ValueError("the chat template did not keep the user message intact")
    before, after = rendered.split(_SPEECH_MARK)
    return (tokenizer.encode(before, add_special_tokens=False), tokenizer.encode(after, add_special_tokens=False))


class LLMCEModel(SpeechLLM):
    """Decoded by generation (:meth:`generate_ids`), not by CTC search."""

    decoding = frozenset({GENERATION})

    def __init__(self, config: LLMASRConfig, tokenizer=None) -> None:
        if config.objective != "ce":
            raise ValueError(f"LLMCEModel needs model.objective 'ce', got {config.objective!r}")
        super().__init__(config, tokenizer)
        self.template_before, self.template_after = chat_template_parts(self.tokenizer, config.ce_user_text)
        eos = config.eos_id if config.eos_id is not None else self.tokenizer.eos_token_id
        if eos is None:
            raise ValueError("the tokenizer has no EOS token: set model.eos_id")
        self.eos_id = int(eos)

    def head_logits(self, states: Tensor) -> Tensor:
        """Float32 logits of the LLM head for the given rows only."""
        return head_logits(states, self.lm_head.weight, self.lm_head.bias, self.config.head_chunk_size)

    def template_embeddings(self) -> Tuple[Tensor, Tensor]:
        def embed(ids: List[int]) -> Tensor:
            return self.embed_tokens(torch.tensor(ids, dtype=torch.long, device=self.device))

        return embed(self.template_before), embed(self.template_after)

    def loss(self, features: Tensor, feature_lens: Tensor,
             targets: Sequence[Sequence[int]]) -> Tuple[Tensor, Dict[str, Any]]:
        """Summed cross-entropy of transcript + EOS (eq. 10) and counts for logging."""
        states, labels = self.teacher_forced_states(features, feature_lens, targets)
        loss = frozen_head_cross_entropy(states, self.lm_head.weight, self.lm_head.bias, labels,
                                         self.config.head_chunk_size)
        return loss, {"tokens": int(labels.numel()), "utterances": len(targets)}

    def teacher_forced_states(self, features: Tensor, feature_lens: Tensor,
                              targets: Sequence[Sequence[int]]) -> Tuple[Tensor, Tensor]:
        """Final-norm states (R, D) of the R = sum_n (|y_n| + 1) positions that predict
        each transcript and its EOS under teacher forcing, utterance after utterance, and
        their labels (R,): what the loss sees, and what generation must reproduce."""
        speech, speech_lens = self.speech_embeddings(features, feature_lens)
        targets = [list(map(int, t)) for t in targets]
        if len(targets) != speech.shape[0]:
            raise ValueError(f"targets has {len(targets)} transcripts for {speech.shape[0]} utterances")
        token_lens = torch.tensor([len(t) for t in targets], device=self.device)
        width = max(1, int(token_lens.max()))
        padded = torch.full((len(targets), width), self.eos_id, dtype=torch.long, device=self.device)
        for n, target in enumerate(targets):
            padded[n, :len(target)] = torch.tensor(target, dtype=torch.long, device=self.device)
        before, after = self.template_embeddings()
        batch = build_sequences(before, speech, speech_lens, suffix=after,
                                tail_tokens=self.embed_tokens(padded), tail_token_lens=token_lens)
        hidden = backbone_states(self.llm, batch.inputs_embeds, batch.attention_mask, batch.position_ids)
        # Position tail_start - 1 + i predicts y+_i (teacher forcing), i = 0..|y_n|.
        rows = read_rows(hidden, batch.tail_start - 1, token_lens + 1)
        labels = torch.cat([padded, padded.new_full((len(targets), 1), self.eos_id)], dim=1)
        labels[torch.arange(len(targets)), token_lens] = self.eos_id
        valid = torch.arange(labels.shape[1], device=self.device)[None, :] <= token_lens[:, None]
        return rows[valid], labels[valid]

    def forward(self, features: Tensor, feature_lens: Tensor, targets,
                return_stats: bool = False) -> Union[Tensor, Tuple[Tensor, LossStats]]:
        """The summed cross-entropy of :meth:`loss`; it keeps every utterance."""
        loss, _ = self.loss(features, feature_lens, targets)
        return (loss, NothingExcluded.of_batch(features)) if return_stats else loss

    def log_probs(self, features: Tensor, feature_lens: Tensor) -> Tuple[Tensor, Tensor]:
        raise NotDecodableBy(self, CTC_SEARCH)

    def generate_ids(self, features: Tensor, feature_lens: Tensor, beam: Optional[int] = None,
                     use_cache: bool = True) -> List[List[int]]:
        """Token ids per utterance (EOS removed): greedy when ``beam`` is None, else beam
        search with ``config.length_penalty`` (App. D.2: beam 4, 1.0); stops at EOS or
        ``config.max_new_tokens``. Utterances are decoded one at a time (batch 1, as the
        paper's timing protocol, App. D.3)."""
        from llm_ctc.generation import beam_search, greedy_search

        with torch.no_grad():
            speech, speech_lens = self.speech_embeddings(features, feature_lens)
            before, after = self.template_embeddings()
            results = []
            for n in range(speech.shape[0]):
                prefill = torch.cat([before, speech[n, :speech_lens[n]], after]).unsqueeze(0)
                if beam is None:
                    results.append(greedy_search(self, prefill, use_cache=use_cache))
                else:
                    results.append(beam_search(self, prefill, beam))
        return results
