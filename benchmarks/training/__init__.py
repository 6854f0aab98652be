"""Training throughput of a recipe preset on CPU: ``python -m benchmarks.training``; the
committed results beside this file."""
