"""LLM-CTC (Sec. 4.2, Fig. 1): CTC over a pretrained LLM's own frozen vocabulary head.

features -> frozen encoder -> projector -> E_n (T_n x D) -> LLM backbone (LoRA) on
[prompt, E_n] (speech readout) or [prompt, E_n, q 1_{T_n}] (query readout) -> final-norm
states X at the T_n readout positions -> ``pruned_ctc_loss(X, W, b_pre, blank_offset=eta)``
(logits X W^T + b_pre + eta e_blank). The head W and b_pre stay frozen, so the loss runs its
two-product frozen-head schedule; eta and the trainable parts learn.
"""

from __future__ import annotations

import logging
from typing import Any, Dict, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor, nn

from asr.family import LossStats
from llm_ctc.base import SpeechLLM
from llm_ctc.blank import head_with_blank, initial_blank_offset
from llm_ctc.config import LLMASRConfig
from llm_ctc.head import head_logits
from llm_ctc.head_argmax import head_argmax
from llm_ctc.head_rows import (RowGroups, describe, find_row_groups, grouped_argmax, grouped_head, grouped_log_probs,
                               worth_grouping)
from llm_ctc.language_model import backbone_states
from llm_ctc.sequence import build_sequences, read_rows

Targets = Union[Sequence[Sequence[int]], Tensor]


class LLMCTCModel(SpeechLLM):
    def __init__(self, config: LLMASRConfig, tokenizer=None) -> None:
        if config.objective != "ctc":
            raise ValueError(f"LLMCTCModel needs model.objective 'ctc', got {config.objective!r}")
        super().__init__(config, tokenizer)
        weight, bias, blank = head_with_blank(self.lm_head.weight, self.lm_head.bias, len(self.tokenizer),
                                              config.blank_id)
        self.blank_id = blank
        appended = weight.shape[0] != self.lm_head.weight.shape[0]
        self.register_buffer("extended_head_weight", weight if appended else None, persistent=False)
        self.register_buffer("pretrained_bias", bias, persistent=False)
        self.has_pretrained_bias = self.lm_head.bias is not None
        self.blank_offset = nn.Parameter(torch.tensor(
            initial_blank_offset(weight, blank, config.blank_cosine_threshold), dtype=torch.float32))
        self.prompt_ids = self.tokenizer.encode(config.prompt, add_special_tokens=False)
        self.query = nn.Parameter(self.initial_query(config)) if config.readout == "query" else None
        groups = find_row_groups(weight, bias, apart=[blank]) if config.distinct_head_rows else None
        if groups is not None and worth_grouping(groups):
            logging.info("%s: the loss and decoding run over those (llm_ctc/head_rows.py)", describe(groups))
        else:
            groups = None
        for name, field in (("head_group_first_rows", "first_rows"), ("head_group_counts", "counts"),
                            ("head_group_of", "group_of")):
            self.register_buffer(name, None if groups is None else getattr(groups, field), persistent=False)

    def initial_query(self, config: LLMASRConfig) -> Tensor:
        """q before training: N(0, query_std^2) per element, or the input embedding of the
        token ``model.query_init`` (float32, as every trainable part)."""
        if config.query_init is None:
            return torch.randn(self.hidden_size) * config.query_std
        ids = self.tokenizer.encode(config.query_init, add_special_tokens=False)
        if len(ids) != 1:
            raise ValueError(f"model.query_init {config.query_init!r} is {len(ids)} tokens of the LLM's tokenizer "
                             f"({ids[:8]}), expected one")
        return self.embed_tokens(torch.tensor(ids, device=self.device))[0].detach().float().cpu().clone()

    @property
    def head_groups(self) -> Optional[RowGroups]:
        """The frozen head's groups of equal rows, or None when the head is used as it is."""
        if self.head_group_first_rows is None:
            return None
        return RowGroups(self.head_group_first_rows, self.head_group_counts, self.head_group_of)

    @property
    def head_weight(self) -> Tensor:
        """The frozen head (V, D), with the appended blank row where there is one."""
        return self.lm_head.weight if self.extended_head_weight is None else self.extended_head_weight

    def head_bias(self) -> Tensor:
        """b_pre + eta e_blank (Sec. 4.2), float32, differentiable in eta."""
        from pruned_ctc import bias_with_blank_offset

        return bias_with_blank_offset(self.pretrained_bias.to(self.blank_offset.dtype), self.blank_offset,
                                      self.blank_id, self.head_weight)

    def ctc_states(self, features: Tensor, feature_lens: Tensor) -> Tuple[Tensor, Tensor]:
        """Final-norm LLM states at the readout positions (N, T_n max, D) and T_n (N,)."""
        speech, speech_lens = self.speech_embeddings(features, feature_lens)
        return self.readout_states(speech, speech_lens)

    def readout_states(self, speech: Tensor, speech_lens: Tensor) -> Tuple[Tensor, Tensor]:
        """As :meth:`ctc_states` from projected speech embeddings (N, T, D)."""
        prompt = self.embed_tokens(torch.tensor(self.prompt_ids, dtype=torch.long, device=self.device))
        query = None if self.query is None else self.query.to(speech.dtype)
        batch = build_sequences(prompt, speech, speech_lens, query=query)
        hidden = backbone_states(self.llm, batch.inputs_embeds, batch.attention_mask, batch.position_ids)
        if self.query is not None:
            starts = batch.tail_start  # P + T_n: the query positions (Sec. 4.2)
        else:
            starts = torch.full_like(speech_lens, batch.speech_start)  # P: the speech positions
        return read_rows(hidden, starts, speech_lens), speech_lens

    def loss(self, features: Tensor, feature_lens: Tensor, targets: Targets,
             target_lengths: Tensor = None) -> Tuple[Tensor, Dict[str, Any]]:
        """Summed Pruned CTC loss of the batch and counts for logging.

        targets: LLM token ids without blank (:meth:`encode_texts`). Utterances with
        T_n < |y_n| + r_n are excluded by the loss (zero loss and gradient) and counted.
        """
        states, lens = self.ctc_states(features, feature_lens)
        return self.loss_of_states(states, lens, targets, target_lengths)

    def loss_of_states(self, states: Tensor, lens: Tensor, targets: Targets,
                       target_lengths: Tensor = None) -> Tuple[Tensor, Dict[str, Any]]:
        """:meth:`loss` from the X rows (N, T_n max, D) and T_n (N,) (the streaming model's
        concatenated query outputs too, Sec. 4.3 eq. 11)."""
        from pruned_ctc import pruned_ctc_loss

        weight, bias = self.head_weight, self.pretrained_bias if self.has_pretrained_bias else None
        blank = self.blank_id
        if self.head_groups is not None:
            # The same loss over the distinct rows (llm_ctc/head_rows.py): each target
            # token keeps its own row's logit, the normalizer is the full head's.
            flat, target_lengths = self.checked_targets(targets, target_lengths, states)
            weight, bias, class_of = grouped_head(self.head_groups, weight, bias, flat)
            targets, blank = class_of[flat], int(class_of[blank])
        loss, stats = pruned_ctc_loss(
            states, weight, bias, targets, lens, target_lengths=target_lengths, blank_id=blank,
            reduction="sum", return_stats=True, blank_offset=self.blank_offset,
            **self.config.pruning_options())
        return loss, {
            "frames": int(lens.sum()),
            "utterances": stats.num_utterances,
            "excluded": stats.num_excluded,
            "not_alignable": stats.num_not_alignable,
            "selected_classes": stats.num_selected_classes,
            "blank_offset": float(self.blank_offset.detach()),
            "loss_stats": stats,  # pruned_ctc.LossStats (per-utterance exclusions, for asr.train)
        }

    def checked_targets(self, targets: Targets, target_lengths: Optional[Tensor], states: Tensor
                        ) -> Tuple[Tensor, Tensor]:
        """The targets concatenated (1-D) and their lengths, every id a head row other than
        blank (the checks ``pruned_ctc_loss`` makes, before the ids are mapped to classes)."""
        from pruned_ctc.inputs import check_target_ids, flatten_targets

        flat, lengths = flatten_targets(targets, target_lengths, states.shape[0], states.device)
        check_target_ids(flat, self.head_weight.shape[0], self.blank_id)
        return flat, lengths

    def forward(self, features: Tensor, feature_lens: Tensor, targets: Targets,
                return_stats: bool = False) -> Union[Tensor, Tuple[Tensor, LossStats]]:
        """The summed loss of :meth:`loss` (and its per-utterance exclusions)."""
        loss, info = self.loss(features, feature_lens, targets)
        return (loss, info["loss_stats"]) if return_stats else loss

    def log_probs(self, features: Tensor, feature_lens: Tensor) -> Tuple[Tensor, Tensor]:
        """Full-head log-probabilities (N, T_n max, V) in float32 and T_n, for decoding."""
        states, lens = self.ctc_states(features, feature_lens)
        return self.log_probs_of_states(states), lens

    def best_frame_ids(self, features: Tensor, feature_lens: Tensor) -> Tuple[Tensor, Tensor]:
        """The argmax class of every readout frame (N, T_n max) and T_n, without the
        (N, T_n max, V) log-softmax (:func:`llm_ctc.decoding.best_frame_ids`)."""
        from llm_ctc.decoding import best_frame_ids

        return best_frame_ids(self, features, feature_lens)

    def frame_argmax(self, states: Tensor) -> Tensor:
        """The best class of every state (...,) int64, without log-probabilities: the
        argmax of the float32 logits with eta on blank (the first of equal maxima)."""
        if self.head_groups is not None:
            return grouped_argmax(self.head_groups, states, self.head_weight, self.head_bias(),
                                  self.config.head_chunk_size)
        return head_argmax(states, self.head_weight, self.head_bias(), self.config.head_chunk_size,
                           screen=self.config.screened_argmax)

    def log_probs_of_states(self, states: Tensor) -> Tensor:
        if self.head_groups is not None:
            return grouped_log_probs(self.head_groups, states, self.head_weight, self.head_bias(),
                                     self.config.head_chunk_size)
        logits = head_logits(states, self.head_weight, self.head_bias(), self.config.head_chunk_size)
        return logits.log_softmax(dim=-1)
