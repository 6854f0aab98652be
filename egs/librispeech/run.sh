#!/usr/bin/env bash
# LibriSpeech recipe. Data stages 0-5; training and decoding stages start at 10.
#   ./run.sh --stage 0 --stop-stage 5 --nj 8
# Everything is written under this folder: download/, data/manifests, data/fbank,
# data/lang_bpe_<V>. Each stage skips the work it finds finished, so reruns are safe.
set -euo pipefail
# shellcheck source=../../scripts/recipe_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/recipe_lib.sh"

stop_stage=5
parse_options stage stop_stage nj dl_dir parts train_parts speed_perturb vocab_sizes bpe_model_type -- "$@"
recipe_setup

if run_stage 0 "download LibriSpeech and MUSAN (or place/symlink them in $dl_dir)"; then
  # shellcheck disable=SC2086
  download_corpus librispeech --parts $parts
  download_corpus musan
fi

if run_stage 1 "LibriSpeech manifests"; then
  prepare_manifests librispeech "$dl_dir/LibriSpeech" "$parts"
fi

if run_stage 2 "MUSAN manifests"; then
  musan_manifests
fi

if run_stage 3 "LibriSpeech fbank (speed perturbation '$speed_perturb' on $train_parts)"; then
  compute_fbank_parts librispeech "$parts" "$train_parts" "$speed_perturb"
fi

if run_stage 4 "MUSAN fbank"; then
  musan_fbank
fi

if run_stage 5 "BPE models ($bpe_model_type, sizes $vocab_sizes)"; then
  train_supervisions=()
  for part in $train_parts; do
    train_supervisions+=("$manifest_dir/librispeech_supervisions_$part.jsonl.gz")
  done
  train_bpe_models "$vocab_sizes" "$bpe_model_type" "${train_supervisions[@]}"
fi

# Stages 10 and later (training, decoding) are added by the training recipe.
