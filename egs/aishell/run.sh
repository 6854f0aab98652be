#!/usr/bin/env bash
# AISHELL-1 recipe. Data stages 0-5; training and decoding stages start at 10.
#   ./run.sh --stage 0 --stop-stage 5 --nj 8
# Everything is written under this folder: download/, data/manifests, data/fbank,
# data/lang_char. Each stage skips the work it finds finished, so reruns are safe.
set -euo pipefail
# shellcheck source=../../scripts/recipe_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/recipe_lib.sh"

stop_stage=5
parse_options stage stop_stage nj dl_dir train_parts speed_perturb -- "$@"
recipe_setup

if run_stage 0 "download AISHELL-1 and MUSAN (or place/symlink them in $dl_dir)"; then
  download_corpus aishell
  download_corpus musan
fi

if run_stage 1 "AISHELL-1 manifests"; then
  prepare_manifests aishell "$dl_dir/aishell" "$parts"
fi

if run_stage 2 "MUSAN manifests"; then
  musan_manifests
fi

if run_stage 3 "AISHELL-1 fbank (speed perturbation '$speed_perturb' on $train_parts)"; then
  compute_fbank_parts aishell "$parts" "$train_parts" "$speed_perturb"
fi

if run_stage 4 "MUSAN fbank"; then
  musan_fbank
fi

if run_stage 5 "character table data/lang_char"; then
  if ! done_already data/lang_char/tokens.txt "character table"; then
    train_supervisions=()
    for part in $train_parts; do
      train_supervisions+=("$manifest_dir/aishell_supervisions_$part.jsonl.gz")
    done
    python -m local.prepare_char data/lang_char --manifests "${train_supervisions[@]}"
  fi
fi

# Stages 10 and later (training, decoding) are added by the training recipe.
