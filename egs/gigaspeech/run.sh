#!/usr/bin/env bash
# GigaSpeech recipe. Data stages 0-8; training and decoding stages start at 10.
#   ./run.sh --stage 0 --stop-stage 8 --nj 8
# Stage 6 (features of the training subset, in pieces) can run in several terminals
# at once over disjoint ranges, and resumes where it stopped:
#   ./run.sh --stage 6 --stop-stage 6 --start 0 --stop 500
#   ./run.sh --stage 6 --stop-stage 6 --start 500 --stop 1000
# Stage 0 needs the password of GigaSpeech's authors in download/password.
# Everything is written under this folder: download/, data/manifests, data/fbank,
# data/lang_bpe_<V>. Each stage skips the work it finds finished, so reruns are safe.
set -euo pipefail
# shellcheck source=../../scripts/recipe_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/recipe_lib.sh"

stop_stage=8
start=0
stop=-1
parse_options stage stop_stage nj dl_dir subsets train_subset eval_subsets xl_chunk_size \
  vocab_sizes bpe_model_type gigaspeech_host start stop -- "$@"
recipe_setup
split_dir=$fbank_dir/gigaspeech_${train_subset}_split

if run_stage 0 "download GigaSpeech and MUSAN (or place/symlink them in $dl_dir)"; then
  # shellcheck disable=SC2086
  download_corpus gigaspeech --parts $subsets --host "$gigaspeech_host" --password-file "$dl_dir/password"
  download_corpus musan
fi

if run_stage 1 "GigaSpeech manifests of $subsets"; then
  prepare_manifests gigaspeech "$dl_dir/GigaSpeech" "$subsets"
fi

if run_stage 2 "MUSAN manifests"; then
  musan_manifests
fi

if run_stage 3 "drop garbage segments, delete punctuation tags"; then
  todo=()
  for subset in $subsets; do
    done_already "$fbank_dir/gigaspeech_cuts_${subset}_raw.jsonl.gz" "text of $subset" || todo+=("$subset")
  done
  if [ ${#todo[@]} -gt 0 ]; then
    python -m local.normalize_text gigaspeech "$manifest_dir" "$fbank_dir" --subsets "${todo[@]}"
  fi
fi

if run_stage 4 "fbank of $eval_subsets"; then
  todo=()
  for subset in $eval_subsets; do
    done_already "$fbank_dir/gigaspeech_cuts_$subset.jsonl.gz" "fbank of $subset" || todo+=("$subset")
  done
  if [ ${#todo[@]} -gt 0 ]; then
    python -m local.compute_fbank --num-jobs "$nj" raw-parts gigaspeech "$fbank_dir" --parts "${todo[@]}"
  fi
fi

if run_stage 5 "split $train_subset into pieces of $xl_chunk_size recordings"; then
  if ! done_already "$split_dir/.split.done" "split of $train_subset"; then
    python -m local.feature_pieces split "$fbank_dir/gigaspeech_cuts_${train_subset}_raw.jsonl.gz" \
      "$split_dir" --chunk-size "$xl_chunk_size"
  fi
fi

if run_stage 6 "fbank of the $train_subset pieces [$start, $stop)"; then
  pieces=("$split_dir"/gigaspeech_cuts_"${train_subset}"_raw.*.jsonl.gz)
  last=$stop
  if [ "$last" -lt 0 ] || [ "$last" -gt ${#pieces[@]} ]; then last=${#pieces[@]}; fi
  pending=0
  for ((index = start; index < last; index++)); do
    [ -f "${pieces[$index]/_raw./.}" ] || pending=$((pending + 1))
  done
  if [ $pending -eq 0 ] && [ -f "$split_dir/.split.done" ]; then
    log "fbank of pieces [$start, $last): all done, skipping"
  else
    python -m local.feature_pieces compute "$split_dir" --start "$start" --stop "$stop" --num-jobs "$nj"
  fi
fi

if run_stage 7 "MUSAN fbank"; then
  musan_fbank
fi

if run_stage 8 "BPE models ($bpe_model_type, sizes $vocab_sizes)"; then
  train_bpe_models "$vocab_sizes" "$bpe_model_type" "$fbank_dir/gigaspeech_cuts_${train_subset}_raw.jsonl.gz"
fi

# Stages 10 and later (training, decoding) are added by the training recipe.
