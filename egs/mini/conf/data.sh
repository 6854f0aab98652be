# shellcheck shell=bash disable=SC2034  # sourced by run.sh
# Settings of the mini recipe (each is also a run.sh option, e.g. --num-train 5000).
# The corpus is synthesized with espeak-ng (local/make_mini_corpus.py) in LibriSpeech
# layout: train-clean-100, dev-clean and test-clean; test and dev sentences never
# occur in training, and every utterance has its own random voice and speaking rate.
num_train=15000                # training utterances (unique sentences: data beats epochs)
num_dev=200
num_test=200
seed=0                         # the corpus is a function of its sizes and seed
vocab_size=500                 # BPE pieces (blank, <sos/eos>, <unk> included): most of the
                               # 630 words of the grammar become one piece (15% WER vs 19% at 128)
ctc_loss=pruned                # pruned (Pruned CTC) or standard (dense head + torch CTC)
train_config=conf/train.yaml   # the preset read by asr.train and asr.decode
quick=0                        # 1: a few-minute smoke run (conf/quick.sh overrides the above)
