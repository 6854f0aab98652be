"""The (M, D, V) head products alone, the time floor of an exact head + CTC loss: ``python
-m benchmarks.head_products``; the committed results beside this file."""
