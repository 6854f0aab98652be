"""Head + CTC loss, standard CTC against Pruned CTC (paper Fig. 3, App. C): ``python -m
benchmarks.head_loss``; the committed results beside this file."""
