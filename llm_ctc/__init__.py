"""LLM-CTC (paper Sec. 4.2): non-autoregressive ASR on a pretrained causal LLM with its
frozen native vocabulary head, trained with Pruned CTC; and the LLM-CE baseline
(Sec. 4.1). Needs the ``llm`` extra (transformers, peft).

Both models are :class:`asr.family.Recognizer` models, as the toolkit's trainer and
decoder use them::

    from llm_ctc import LLMASRConfig, build_model
    model = build_model(LLMASRConfig(llm="Qwen/Qwen3-0.6B", encoder_type="zipformer",
                                     encoder_path="exp/zipformer/epoch-30.pt"))
    targets = model.encode_texts(texts)              # lowercased LLM token ids
    loss, stats = model(features, feature_lens, targets, return_stats=True)
    loss, counts = model.loss(features, feature_lens, targets)  # with counts for logging
    groups = model.parameter_groups(weight_decay=0.1)  # AdamW
    state = model.checkpoint_state_dict()             # LoRA, projector, q, eta only
    model.load_checkpoint_state_dict(state)
    model.prepare_for_decoding()                      # LoRA merged, for inference

LLM-CTC decoding: ``model.log_probs(features, feature_lens)`` or
:func:`llm_ctc.decoding.recognize`; LLM-CE: ``model.generate_ids(features, feature_lens,
beam=4)``. Checkpoints of one model: :mod:`llm_ctc.checkpoint`; the builder: :mod:`llm_ctc.build`.

Streaming LLM-CTC (Sec. 4.3, :mod:`llm_ctc.streaming`): ``model.streaming: true`` builds
:class:`llm_ctc.streaming.model.StreamingLLMCTCModel`, whose loss draws the history h per
update (8 s in evaluation); inference chunk by chunk with
:class:`llm_ctc.streaming.recognizer.StreamingRecognizer` (``recognize_streaming`` for a
batch) and ``python -m llm_ctc.streaming.stream``.
"""

import asr  # noqa: F401  (OpenMP settings before torch loads: asr/threads.py)
from llm_ctc.config import LLMASRConfig

__all__ = ["LLMASRConfig", "build_model", "load_model_checkpoint", "save_model_checkpoint"]


def __getattr__(name: str):
    # Imported on first use: reading a run's configuration (asr.config imports
    # llm_ctc.config through this package) must not import torch or transformers.
    if name == "build_model":
        from llm_ctc.build import build_model

        return build_model
    if name in ("load_model_checkpoint", "save_model_checkpoint"):
        from llm_ctc import checkpoint

        return getattr(checkpoint, name)
    raise AttributeError(f"module 'llm_ctc' has no attribute {name!r}")
