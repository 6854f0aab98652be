"""Discarded posterior mass of a random LLM-CTC per beam (paper App. B.3, Table 7): ``python
-m benchmarks.llm_discarded_mass``; the committed results beside this file."""
