#!/usr/bin/env bash
# GigaSpeech recipe. Data stages 0-8, then 10 training, 11 decoding, 12 the WER table, 13 ONNX
# export and sherpa-onnx decoding; 20-25 LLM-CTC and LLM-CE on a frozen speech encoder
# (20 128-bin fbank, 21 the Zipformer as encoder, 22/23 LLM-CTC train/decode, 24/25 LLM-CE);
# 30-34 paper Table 5 (Qwen3-ASR fine-tuned as offline and streaming Query-readout LLM-CTC,
# on the 128-bin features of stage 20).
#   ./run.sh --stage 0 --stop-stage 8 --nj 8      # data (the default stage range)
#   ./run.sh --stage 10 --stop-stage 12           # Zipformer-M, Pruned CTC, 2 GPUs, 60 epochs
#   ./run.sh --stage 20 --stop-stage 25 --num-gpus 8 --llm Qwen/Qwen3-8B --llm-encoder spear \
#     --llm-encoder-path download/spear-xlarge-speech-audio-v2-icefall   # Table 3's SPEAR-Qwen3-8B
#   ./run.sh --stage 30 --stop-stage 34 --table5-model Qwen/Qwen3-ASR-1.7B   # Table 5, one column
# LLM settings live in conf/llm_<ctc|ce>_<spear|zipformer|qwen3_asr>.yaml (over conf/llm_base.yaml
# and conf/llm_<ctc|ce>_base.yaml), those of a Qwen3 size in conf/llm_<ctc|ce>_<14b|32b>.yaml
# (--llm-args, --llm-decode-args override them as --train-args does for stages 10-13).
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
# shellcheck source=../shared/recipe_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../shared/recipe_lib.sh"

stop_stage=8
start=0
stop=-1
num_gpus=2
lang_dir=""                    # default: data/lang_bpe_<first of --vocab-sizes>
llm=Qwen/Qwen3-8B              # stages 22-25: any Qwen3 (0.6B-32B) hub name, or a local folder
llm_encoder=spear              # spear (Table 3), zipformer (stage 10's model) or qwen3_asr
llm_encoder_path=""            # default: the conf's model.encoder_path (zipformer: stage 21's file)
llm_args=""                    # section.field=value overrides of the LLM training, e.g. "data.max_duration=100"
llm_decode_args=""             # and of its decoding, e.g. "decode.beam_size=8"
table5_model=Qwen/Qwen3-ASR-0.6B  # stages 30-34: hub name or folder of a Qwen3-ASR checkpoint
table5_fbank_dir=data/fbank128    # its 128-bin features (stage 20)
table5_projector_hidden=""     # default: the encoder width of 0.6B (896) or 1.7B (1024) from the name
table5_options=(table5_model table5_fbank_dir table5_projector_hidden)
parse_options stage stop_stage nj dl_dir subsets train_subset eval_subsets xl_chunk_size \
  vocab_sizes bpe_model_type gigaspeech_host start stop lang_dir llm llm_encoder llm_encoder_path \
  llm_args llm_decode_args "${training_options[@]}" "${table5_options[@]}" -- "$@"
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
  python -m local.feature_pieces compute "$split_dir" --start "$start" --stop "$stop" --num-jobs "$nj"
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
  python -m local.feature_pieces check "$split_dir" --finish "stages 5 and 6"
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

# --- LLM-CTC and LLM-CE (paper Sec. 4, 5.3, Table 3; App. D.2-D.4) ----------------------
zipformer_exp=$exp_dir
fbank128_dir=data/fbank128
if [ "$stop_stage" -ge 20 ] && [ "$stage" -le 29 ]; then
  case "$llm_encoder" in
    spear|qwen3_asr) llm_fbank_dir=$fbank128_dir ;;
    zipformer) llm_fbank_dir=$fbank_dir ;;
    *) die "--llm-encoder must be spear, zipformer or qwen3_asr, got '$llm_encoder'" ;;
  esac
fi

if run_stage 20 "128-bin fbank of $eval_subsets, the $train_subset pieces [$start, $stop) and MUSAN into $fbank128_dir"; then
  if [ "$llm_encoder" = zipformer ]; then
    log "--llm-encoder zipformer reads the 80-bin features of stages 4-6: nothing to do"
  else
    raws=()
    for subset in $eval_subsets; do raws+=("$fbank_dir/gigaspeech_cuts_${subset}_raw.jsonl.gz"); done
    python -m local.fbank_bins --num-mel-bins 128 --num-jobs "$nj" --out-dir "$fbank128_dir" "${raws[@]}"
    [ -f "$split_dir/.split.done" ] || die "$split_dir: not split: run stage 5 first"
    pieces=("$split_dir"/gigaspeech_cuts_"${train_subset}"_raw.*.jsonl.gz)
    last=$stop
    if [ "$last" -lt 0 ] || [ "$last" -gt ${#pieces[@]} ]; then last=${#pieces[@]}; fi
    python -m local.fbank_bins --num-mel-bins 128 --num-jobs "$nj" \
      --out-dir "$fbank128_dir/gigaspeech_${train_subset}_split" "${pieces[@]:$start:$((last - start))}"
    # The noise is mixed into the features: 128 bins as well (MUSAN manifests: stage 2).
    python -m local.musan --num-mel-bins 128 --num-jobs "$nj" "$manifest_dir" "$fbank128_dir"
  fi
fi

if run_stage 21 "the Zipformer of $zipformer_exp as a frozen speech encoder ($zipformer_exp/decoding.pt)"; then
  if [ "$llm_encoder" = zipformer ]; then
    python -m local.export_decoding_weights "$zipformer_exp" "$zipformer_exp/decoding.pt"
  else
    log "--llm-encoder $llm_encoder: nothing to do"
  fi
fi

# llm_settings OBJECTIVE: train_config, exp_dir and the settings of LLM-<OBJECTIVE> with
# --llm on --llm-encoder, and those of the Qwen3 size in the --llm name (App. D.3: activation
# checkpointing, peak lr, microbatch and accumulation; conf/llm_<ctc|ce>_<size>.yaml).
llm_settings() {
  local objective=$1 name settings=() size_line size_settings=()
  name=$(basename "$llm" | tr '[:upper:]' '[:lower:]')
  train_config=conf/llm_${objective}_${llm_encoder}.yaml
  exp_dir=exp/llm_${objective}_${llm_encoder}_${name}
  settings=(model.llm="$llm"
    data.train_cuts="$llm_fbank_dir/gigaspeech_${train_subset}_split/gigaspeech_cuts_$train_subset.[0-9]*.jsonl.gz"
    data.valid_cuts="$llm_fbank_dir/gigaspeech_cuts_${eval_subsets%% *}.jsonl.gz"
    data.musan_cuts="$llm_fbank_dir/musan_cuts.jsonl.gz")
  if [ -n "$llm_encoder_path" ]; then
    settings+=(model.encoder_path="$llm_encoder_path")
  elif [ "$llm_encoder" = zipformer ]; then
    settings+=(model.encoder_path="$zipformer_exp/decoding.pt")
  fi
  size_line=$(python -m local.llm_size_settings "$train_config" "$llm")
  read -r -a size_settings <<< "$size_line"
  if [ ${#size_settings[@]} -gt 0 ]; then
    log "settings for $name (App. D.3): ${size_settings[*]}"
    settings+=("${size_settings[@]}")
  fi
  train_args=$llm_args
  decode_args=$llm_decode_args
  training_settings "${settings[@]}"
}

# llm_test_sets: NAME=CUTS of the eval subsets in the features the encoder reads.
llm_test_sets() {
  local subset
  llm_sets=()
  for subset in $eval_subsets; do llm_sets+=("${subset,,}=$llm_fbank_dir/gigaspeech_cuts_$subset.jsonl.gz"); done
}

# require_llm_features: every training piece has the features the encoder reads.
require_llm_features() {
  local stage_of_features=20
  [ "$llm_fbank_dir" = "$fbank_dir" ] && stage_of_features=6
  python -m local.feature_pieces check "$split_dir" --features-dir "$llm_fbank_dir/gigaspeech_${train_subset}_split" \
    --finish "stages 5 and $stage_of_features"
}

for objective in ctc ce; do
  if [ "$objective" = ctc ]; then train_stage=22; else train_stage=24; fi
  if [ "$stage" -le $((train_stage + 1)) ] && [ "$stop_stage" -ge $train_stage ]; then
    llm_settings $objective
    llm_test_sets
    if run_stage $train_stage "train LLM-${objective^^} ($train_config, $llm on $llm_encoder) into $exp_dir"; then
      require_llm_features
      train_model
    fi
    if run_stage $((train_stage + 1)) "decode ${eval_sets[*]} with LLM-${objective^^} of $exp_dir"; then
      decode_model "${llm_sets[@]}"
    fi
  fi
done

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
    data.valid_cuts="$table5_fbank_dir/gigaspeech_cuts_${eval_subsets%% *}.jsonl.gz"
    data.musan_cuts="$table5_fbank_dir/musan_cuts.jsonl.gz")
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
  python -m llm_ctc.streaming.table --offline "$table5_offline" --streaming "$table5_streaming" \
    --sets "${eval_sets[@]}"
fi
