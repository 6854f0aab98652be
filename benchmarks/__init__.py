"""Benchmarks and the paper's analyses, one folder per experiment: its program (run from
the repository root as ``python -m benchmarks.<experiment>``), its report code and its
committed results. ``benchmarks/README.md`` puts the results beside the paper's numbers."""
