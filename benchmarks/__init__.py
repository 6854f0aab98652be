"""The benchmarks and the paper's analyses, each a program: python -m benchmarks.<name>."""
