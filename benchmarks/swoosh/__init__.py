"""SwooshL/R, the plain formula against logaddexp in place: ``python -m benchmarks.swoosh``;
the committed results beside this file."""
