"""A frozen 151,936-row LLM head, head and loss and a full LLM-CTC step (paper App. C.3):
``python -m benchmarks.frozen_head``; the committed results beside this file."""
