"""The model-independent toolkit shared by every model family (Zipformer CTC, LLM-CTC).

Configuration (:mod:`asr.config`), the Lhotse data module (:mod:`asr.data`,
:mod:`asr.cut_filters`), tokenizers (:mod:`asr.tokenizer`), the trainer (:mod:`asr.train`),
the decoder (:mod:`asr.decode`, :mod:`asr.search`), scoring in icefall's formats
(:mod:`asr.scoring`), checkpoints and weight averaging (:mod:`asr.checkpoint`,
:mod:`asr.averaging`). Import submodules directly.
"""

from asr.threads import prefer_short_spinning as _prefer_short_spinning

# Before any program of the toolkit imports torch (asr/threads.py says why).
_prefer_short_spinning()
