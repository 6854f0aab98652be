"""Streaming LLM-CTC, parallel against cached computation (paper App. E, Fig. 7): ``python
-m benchmarks.streaming_consistency``; the committed results beside this file."""
