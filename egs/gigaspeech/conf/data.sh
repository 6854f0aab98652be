# Data preparation settings of the GigaSpeech recipe (each is also a run.sh option).
subsets="XL DEV TEST"          # the training subset first; XS, S, M, L are smaller ones
train_subset="XL"
eval_subsets="DEV TEST"
xl_chunk_size=50               # whole recordings per piece of the training features
vocab_sizes="500"              # one data/lang_bpe_<V> per size, e.g. "500 5000 180000"
bpe_model_type="unigram"       # or "bpe"
gigaspeech_host="tsinghua"     # download mirror: tsinghua, speechocean or magicdata
