# shellcheck shell=bash disable=SC2034  # sourced by run.sh
# --quick 1: a smoke run of a few minutes (the test suite runs it). Fewer utterances,
# a smaller model and fewer steps; its own folders, so it never mixes with a full run.
num_train=2000
num_dev=50
num_test=50
vocab_size=64
train_config=conf/train_quick.yaml
