"""Zipformer encoder forward + backward speed and memory per preset: ``python -m
benchmarks.encoder``; the committed results beside this file."""
