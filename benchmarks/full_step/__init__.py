"""Full Zipformer training steps, standard CTC against Pruned CTC (paper Table 1): ``python
-m benchmarks.full_step``; the committed results beside this file."""
