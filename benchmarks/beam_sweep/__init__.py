"""Alignment-beam sweep, discarded posterior mass per beam (paper App. B.3, Fig. 5-6):
``python -m benchmarks.beam_sweep``; the committed results beside this file."""
