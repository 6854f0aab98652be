#!/usr/bin/env bash
# AISHELL-1 recipe. Data stages 0-5, then 10 training, 11 decoding, 12 the CER table, 13 ONNX
# export and sherpa-onnx decoding.
#   ./run.sh --stage 0 --stop-stage 5 --nj 8      # data (the default stage range)
#   ./run.sh --stage 10 --stop-stage 12           # Zipformer-M, Pruned CTC, 1 GPU, 120 epochs
# Hyper-parameters live in conf/train.yaml (override: --train-args "train.base_lr=0.04").
# Everything is written under this folder: download/, data/manifests, data/fbank,
# data/lang_char, exp/. Each stage skips the work it finds finished, so reruns are
# safe; an interrupted training resumes from its newest checkpoint.
set -euo pipefail
# shellcheck source=../shared/recipe_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../shared/recipe_lib.sh"

stop_stage=5
num_gpus=1
parse_options stage stop_stage nj dl_dir train_parts speed_perturb "${training_options[@]}" -- "$@"
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

train_cuts=()
for part in $train_parts; do train_cuts+=("$fbank_dir/aishell_cuts_$part.jsonl.gz"); done
test_sets=("dev=$fbank_dir/aishell_cuts_dev.jsonl.gz" "test=$fbank_dir/aishell_cuts_test.jsonl.gz")
if [ "$stop_stage" -ge 10 ]; then
  training_settings train.lang_dir=data/lang_char \
    data.train_cuts="$(comma_list "${train_cuts[@]}")" data.valid_cuts="$fbank_dir/aishell_cuts_dev.jsonl.gz" \
    data.musan_cuts="$fbank_dir/musan_cuts.jsonl.gz"
fi

if run_stage 10 "train Zipformer with Pruned CTC ($train_config) into $exp_dir"; then
  train_model
fi

if run_stage 11 "decode dev and test, scoring characters"; then
  decode_model "${test_sets[@]}"
fi

if run_stage 12 "CER table (decodes nothing that stage 11 decoded)"; then
  decode_model "${test_sets[@]}"
fi

if run_stage 13 "export to ONNX and decode the test sets with sherpa-onnx"; then
  export_onnx_and_decode "${test_sets[@]}"
fi
