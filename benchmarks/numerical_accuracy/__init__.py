"""Numerical accuracy of Pruned CTC against a dense FP64 reference (paper App. B.2):
``python -m benchmarks.numerical_accuracy``; the committed results beside this file."""
