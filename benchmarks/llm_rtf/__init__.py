"""Real-time factor of LLM-CTC against LLM-CE (paper Sec. 5.3, App. D.3): ``python -m
benchmarks.llm_rtf``, its per-component profile ``benchmarks.llm_rtf.profile`` and precision
check ``benchmarks.llm_rtf.precision_agreement``; the committed results beside this file."""
