#!/usr/bin/env bash
# LibriSpeech recipe. Data stages 0-5, then 10 training, 11 decoding, 12 the WER table,
# 13 ONNX export and sherpa-onnx decoding.
#   ./run.sh --stage 0 --stop-stage 5 --nj 8      # data (the default stage range)
#   ./run.sh --stage 10 --stop-stage 12           # Zipformer-M, Pruned CTC, 2 GPUs, 100 epochs
# Hyper-parameters live in conf/train.yaml (override: --train-args "data.max_duration=700").
# Everything is written under this folder: download/, data/manifests, data/fbank,
# data/lang_bpe_<V>, exp/. Each stage skips the work it finds finished, so reruns are
# safe; an interrupted training resumes from its newest checkpoint.
set -euo pipefail
# shellcheck source=../shared/recipe_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../shared/recipe_lib.sh"

stop_stage=5
num_gpus=2
lang_dir=""                    # default: data/lang_bpe_<first of --vocab-sizes>
parse_options stage stop_stage nj dl_dir parts train_parts speed_perturb vocab_sizes bpe_model_type \
  lang_dir "${training_options[@]}" -- "$@"
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

lang_dir=${lang_dir:-data/lang_bpe_${vocab_sizes%% *}}
train_cuts=() valid_cuts=() test_sets=()
for part in $train_parts; do train_cuts+=("$fbank_dir/librispeech_cuts_$part.jsonl.gz"); done
for part in $parts; do
  case "$part" in
    dev-*) valid_cuts+=("$fbank_dir/librispeech_cuts_$part.jsonl.gz") ;;
    test-*) test_sets+=("$part=$fbank_dir/librispeech_cuts_$part.jsonl.gz") ;;
  esac
done
if [ "$stop_stage" -ge 10 ]; then
  training_settings train.lang_dir="$lang_dir" \
    data.train_cuts="$(comma_list "${train_cuts[@]}")" data.valid_cuts="$(comma_list "${valid_cuts[@]}")" \
    data.musan_cuts="$fbank_dir/musan_cuts.jsonl.gz"
fi

if run_stage 10 "train Zipformer with Pruned CTC ($train_config) into $exp_dir"; then
  train_model
fi

if run_stage 11 "decode ${test_sets[*]%%=*}"; then
  decode_model "${test_sets[@]}"
fi

if run_stage 12 "WER table (decodes nothing that stage 11 decoded)"; then
  decode_model "${test_sets[@]}"
fi

if run_stage 13 "export to ONNX and decode the test sets with sherpa-onnx"; then
  export_onnx_and_decode "${test_sets[@]}"
fi
