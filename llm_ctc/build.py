"""Building an LLM-CTC / LLM-CE model from its configuration (:class:`llm_ctc.config.LLMASRConfig`):
LLM-CTC (Sec. 4.2), its streaming form (``model.streaming``, Sec. 4.3), or LLM-CE (Sec. 4.1)."""

from __future__ import annotations

from llm_ctc.base import SpeechLLM
from llm_ctc.config import LLMASRConfig


def build_model(config: LLMASRConfig, tokenizer=None) -> SpeechLLM:
    """The model ``config.objective`` and ``config.streaming`` name; ``tokenizer`` an
    already loaded tokenizer of the LLM (loaded from ``config.tokenizer_path`` when None)."""
    if config.objective == "ce":
        from llm_ctc.ce_model import LLMCEModel

        return LLMCEModel(config, tokenizer=tokenizer)
    if config.streaming:
        from llm_ctc.streaming.model import StreamingLLMCTCModel

        return StreamingLLMCTCModel(config, tokenizer=tokenizer)
    from llm_ctc.model import LLMCTCModel

    return LLMCTCModel(config, tokenizer=tokenizer)
