"""Streaming LLM-CTC (paper Sec. 4.3, App. D.4, App. E).

* :mod:`llm_ctc.streaming.layout`: chunk layout and time coordinates of the LLM input
  [prompt, E_1, Q_1, E_2, Q_2, ...], the cache bound P + 2A + J.
* :mod:`llm_ctc.streaming.mask`: the bounded-history attention mask V_n(i).
* :mod:`llm_ctc.streaming.encoder`: encoder windows of h seconds of history + chunk.
* :mod:`llm_ctc.streaming.llm`: the parallel masked forward and loss (eq. 11), the cached
  LLM with eviction, the history h drawn per update.
* :mod:`llm_ctc.streaming.recognizer`: decoding chunk by chunk with a KV cache.
* :mod:`llm_ctc.streaming.model`: the streaming LLM-CTC model (an asr.family.Recognizer).

Programs: ``python -m llm_ctc.streaming.stream`` (a wav file, partial text per chunk),
``python -m llm_ctc.streaming.latency`` (per-chunk latency over a long input),
``python -m llm_ctc.streaming.table`` (the Table 5 layout from result files).
"""
