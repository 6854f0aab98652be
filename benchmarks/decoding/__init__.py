"""CTC greedy and prefix beam search speed against pyctcdecode: ``python -m
benchmarks.decoding``; the committed results beside this file."""
