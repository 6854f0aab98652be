# Data preparation settings of the LibriSpeech recipe (each is also a run.sh option).
# Parts are LibriSpeech's official folder names.
parts="dev-clean dev-other test-clean test-other train-clean-100 train-clean-360 train-other-500"
train_parts="train-clean-100 train-clean-360 train-other-500"
speed_perturb="0.9,1.1"        # factors for the training parts; "" for none
vocab_sizes="500"              # one data/lang_bpe_<V> per size, e.g. "500 5000 180000"
bpe_model_type="unigram"       # or "bpe"
