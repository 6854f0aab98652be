# Data preparation settings of the AISHELL-1 recipe (each is also a run.sh option).
parts="train dev test"         # prepare_aishell always makes all three
train_parts="train"
speed_perturb="0.9,1.1"        # factors for the training part; "" for none
