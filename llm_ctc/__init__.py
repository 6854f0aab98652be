"""LLM-CTC (paper Sec. 4.2): non-autoregressive ASR on a pretrained causal LLM with its
frozen native vocabulary head, trained with Pruned CTC; and the LLM-CE baseline
(Sec. 4.1). Needs the ``llm`` extra (transformers, peft)."""

from llm_ctc.config import LLMASRConfig

__all__ = ["LLMASRConfig"]
