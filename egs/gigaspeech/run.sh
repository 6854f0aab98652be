#!/usr/bin/env bash
# GigaSpeech recipe. Data stages 0-8, then 10 training, 11 decoding, 12 the WER table, 13 ONNX
# export and sherpa-onnx decoding; 30-34 paper Table 5 (Qwen3-ASR fine-tuned as offline and
# streaming Query-readout LLM-CTC, on the 128-bin features of stage 20).
#   ./run.sh --stage 0 --stop-stage 8 --nj 8      # data (the default stage range)
#   ./run.sh --stage 10 --stop-stage 12           # Zipformer-M, Pruned CTC, 2 GPUs, 60 epochs
#   ./run.sh --stage 30 --stop-stage 34 --table5-model Qwen/Qwen3-ASR-1.7B   # Table 5, one column
# Hyper-parameters live in conf/train.yaml (override: --train-args "data.max_duration=700").
# Scoring applies GigaSpeech's official normalization (fillers, tags) to both sides.
# Stage 6 (features of the training subset, in pieces) can run in several terminals
# at once over disjoint ranges, and resumes where it stopped:
#   ./run.sh --stage 6 --stop-stage 6 --start 0 --stop 500
#   ./run.sh --stage 6 --stop-stage 6 --start 500 --stop 1000
# Stage 0 needs the password of GigaSpeech's authors in download/password.
# Everything is written under this folder: download/, data/manifests, data/fbank,
# data/lang_bpe_<V>, exp/. Each stage skips the work it finds finished, so reruns are
# safe; an interrupted training resumes from its newest checkpoint.
set -euo pipefail
# shellcheck source=../../scripts/recipe_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/recipe_lib.sh"

stop_stage=8
start=0
stop=-1
num_gpus=2
lang_dir=""                    # default: data/lang_bpe_<first of --vocab-sizes>
table5_model=Qwen/Qwen3-ASR-0.6B  # stages 30-34: hub name or folder of a Qwen3-ASR checkpoint
table5_fbank_dir=data/fbank128    # its 128-bin features (stage 20)
table5_projector_hidden=""     # default: the encoder width of 0.6B (896) or 1.7B (1024) from the name
table5_options=(table5_model table5_fbank_dir table5_projector_hidden)
parse_options stage stop_stage nj dl_dir subsets train_subset eval_subsets xl_chunk_size \
  vocab_sizes bpe_model_type gigaspeech_host start stop lang_dir "${training_options[@]}" \
  "${table5_options[@]}" -- "$@"
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

lang_dir=${lang_dir:-data/lang_bpe_${vocab_sizes%% *}}
# Finished pieces only: an interrupted piece leaves gigaspeech_cuts_XL.partial.* files.
train_pieces="$split_dir/gigaspeech_cuts_$train_subset.[0-9]*.jsonl.gz"
eval_sets=() test_sets=()
for subset in $eval_subsets; do
  eval_sets+=("${subset,,}")
  test_sets+=("${subset,,}=$fbank_dir/gigaspeech_cuts_$subset.jsonl.gz")
done
if [ "$stop_stage" -ge 10 ]; then
  training_settings train.lang_dir="$lang_dir" data.train_cuts="$train_pieces" \
    data.valid_cuts="$fbank_dir/gigaspeech_cuts_${eval_subsets%% *}.jsonl.gz" \
    data.musan_cuts="$fbank_dir/musan_cuts.jsonl.gz"
fi

if run_stage 10 "train Zipformer with Pruned CTC ($train_config) into $exp_dir"; then
  # Every piece needs its features (stage 6), else training would see part of the corpus.
  missing=0
  for raw in "$split_dir"/gigaspeech_cuts_"$train_subset"_raw.*.jsonl.gz; do
    [ -f "${raw/_raw./.}" ] || missing=$((missing + 1))
  done
  if [ ! -f "$split_dir/.split.done" ] || [ $missing -gt 0 ]; then
    die "$split_dir: not split, or $missing piece(s) without features: finish stages 5 and 6 first"
  fi
  train_model
fi

if run_stage 11 "decode ${eval_sets[*]}, GigaSpeech scoring normalization"; then
  decode_model "${test_sets[@]}"
fi

if run_stage 12 "WER table (decodes nothing that stage 11 decoded)"; then
  decode_model "${test_sets[@]}"
fi

if run_stage 13 "export to ONNX and decode the test sets with sherpa-onnx"; then
  export_onnx_and_decode "${test_sets[@]}"
fi

# --- Paper Table 5: offline and streaming Query-readout LLM-CTC from Qwen3-ASR -----------
# (Sec. 4.3, 5.4, App. D.4.) conf/table5_qwen3_asr.yaml fine-tunes --table5-model (LoRA on
# its language model, its projector, the query and the blank offset; encoder and head
# frozen) on the 128-bin features in --table5-fbank-dir: 30 offline, 32 streaming (2 s
# chunks, one history of 1-8 s per batch); 31 and 33 decode dev and test by prefix beam
# search (beam 4, token penalty 0.7), 33 chunk by chunk at h = 2, 4, 8 s with the KV cache;
# 34 prints the table. --train-args / --decode-args apply to both models.
table5_name=$(basename "$table5_model" | tr '[:upper:]' '[:lower:]')
table5_offline=exp/table5_offline_$table5_name
table5_streaming=exp/table5_streaming_$table5_name
if [ "$stop_stage" -ge 30 ] && [ "$stage" -le 34 ]; then
  if [ -z "$table5_projector_hidden" ]; then
    case "$table5_name" in
      *0.6b*) table5_projector_hidden=896 ;;
      *1.7b*) table5_projector_hidden=1024 ;;
      *) die "--table5-model $table5_model: give --table5-projector-hidden (its encoder width; 0.6B: 896, 1.7B: 1024)" ;;
    esac
  fi
  table5_sets=()
  for subset in $eval_subsets; do
    table5_sets+=("${subset,,}=$table5_fbank_dir/gigaspeech_cuts_$subset.jsonl.gz")
  done
  train_config=conf/table5_qwen3_asr.yaml
  table5_settings=(model.llm="$table5_model" model.encoder_path="$table5_model"
    model.projector_hidden="$table5_projector_hidden"
    data.train_cuts="$table5_fbank_dir/gigaspeech_${train_subset}_split/gigaspeech_cuts_$train_subset.[0-9]*.jsonl.gz"
    data.valid_cuts="$table5_fbank_dir/gigaspeech_cuts_${eval_subsets%% *}.jsonl.gz")
  table5_decode_args=$decode_args
fi

# table5_model_settings offline|streaming: exp_dir and train_settings of one Table 5 model.
table5_model_settings() {
  if [ "$1" = offline ]; then
    exp_dir=$table5_offline
    training_settings "${table5_settings[@]}"
  else
    exp_dir=$table5_streaming
    training_settings "${table5_settings[@]}" model.streaming=true
  fi
}

if run_stage 30 "Table 5 offline: fine-tune $table5_model as Query-readout LLM-CTC into $table5_offline"; then
  table5_model_settings offline
  train_model
fi

if run_stage 31 "Table 5 offline: decode ${eval_sets[*]} with $table5_offline"; then
  table5_model_settings offline
  decode_args="decode.methods=ctc-prefix-beam-search $table5_decode_args"
  decode_model "${table5_sets[@]}"
fi

if run_stage 32 "Table 5 streaming: fine-tune $table5_model with model.streaming into $table5_streaming"; then
  table5_model_settings streaming
  train_model
fi

if run_stage 33 "Table 5 streaming: decode ${eval_sets[*]} with $table5_streaming at h = 2, 4, 8 s"; then
  table5_model_settings streaming
  decode_args="decode.methods=ctc-streaming-prefix-beam-search decode.history_seconds=2,4,8 $table5_decode_args"
  decode_model "${table5_sets[@]}"
fi

if run_stage 34 "Table 5: offline and streaming WER side by side"; then
  python -m llm_ctc.streaming_table --offline "$table5_offline" --streaming "$table5_streaming" \
    --sets "${eval_sets[@]}"
fi
