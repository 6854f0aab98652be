"""LLM-CTC (paper Sec. 4.2): non-autoregressive ASR on a pretrained causal LLM with its
frozen native vocabulary head, trained with Pruned CTC; and the LLM-CE baseline
(Sec. 4.1). Needs the ``llm`` extra (transformers, peft).

What a trainer or decoder uses (both models)::

    from llm_ctc import LLMASRConfig, build_model
    model = build_model(LLMASRConfig(llm="Qwen/Qwen3-0.6B", encoder_type="zipformer",
                                     encoder_path="exp/zipformer/epoch-30.pt"))
    targets = model.encode_texts(texts)              # lowercased LLM token ids
    loss, stats = model.loss(features, feature_lens, targets)
    groups = model.parameter_groups(weight_decay=0.1)  # AdamW
    state = model.trainable_state_dict()              # LoRA, projector, q, eta only
    model.load_trainable_state_dict(state)
    model.merge_lora()                                # for inference

LLM-CTC decoding: ``model.ctc_log_probs(features, feature_lens)`` or
:func:`llm_ctc.decoding.recognize`; LLM-CE: ``model.generate(features, feature_lens,
beam=4)``. Checkpoints: :mod:`llm_ctc.checkpoint`.

Streaming LLM-CTC (Sec. 4.3): training ``llm_ctc.streaming.streaming_training_loss(model,
features, feature_lens, targets, h)`` with ``h = sample_history(generator)`` per
microbatch (8 for validation); inference ``llm_ctc.streaming_recognizer.StreamingRecognizer``
(or ``recognize_streaming`` for a batch) and ``python -m llm_ctc.stream``.
"""

from llm_ctc.config import LLMASRConfig

__all__ = ["LLMASRConfig", "build_model", "load_model_checkpoint", "save_model_checkpoint"]


def __getattr__(name: str):
    # Imported on first use: reading a run's configuration (asr.config imports
    # llm_ctc.config through this package) must not import torch or transformers.
    if name in ("build_model", "load_model_checkpoint", "save_model_checkpoint"):
        from llm_ctc import checkpoint

        return getattr(checkpoint, name)
    raise AttributeError(f"module 'llm_ctc' has no attribute {name!r}")
