# shellcheck shell=bash
# Shell helpers shared by the recipes (egs/<corpus>/run.sh): logging, option parsing,
# stage selection, the data stages that several recipes run the same way, and the
# training/decoding stages (10-12) of the corpus recipes.
# Source it first thing in run.sh; it needs bash and the project's python on PATH.
# Sourcing sets recipe_dir (the folder of run.sh), makes this checkout importable,
# sets the defaults every recipe shares (stage, nj, dl_dir, training_options) and
# reads conf/data.sh.

# log MESSAGE...: a time-stamped line naming the recipe script and line that led here.
log() {
  local frame=1
  while [ $frame -lt $((${#BASH_SOURCE[@]} - 1)) ] && [ "${BASH_SOURCE[$frame]##*/}" = recipe_lib.sh ]; do
    frame=$((frame + 1))
  done
  echo -e "$(date '+%Y-%m-%d %H:%M:%S') (${BASH_SOURCE[$frame]##*/}:${BASH_LINENO[$((frame - 1))]}) $*"
}

die() {
  log "ERROR: $*" >&2
  exit 1
}

# parse_options NAME... -- "$@": sets shell variables from "--some-name VALUE" or
# "--some-name=VALUE". Only the listed variables (their defaults already set) may be
# given; "--help" lists them with their current values.
parse_options() {
  local known=()
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do known+=("$1"); shift; done
  [ $# -gt 0 ] && shift
  local option value variable
  while [ $# -gt 0 ]; do
    case "$1" in
      --help|-h)
        echo "Options (current values):"
        for variable in "${known[@]}"; do echo "  --${variable//_/-} '${!variable}'"; done
        exit 0 ;;
      --*=*) option=${1%%=*}; value=${1#*=}; shift ;;
      --*)
        [ $# -ge 2 ] || die "option $1 needs a value"
        option=$1; value=$2; shift 2 ;;
      *) die "unexpected argument '$1': options look like --stage 1 (see --help)" ;;
    esac
    variable=${option#--}
    variable=${variable//-/_}
    if [[ " ${known[*]} " != *" $variable "* ]]; then
      die "unknown option $option; known: $(printf -- '--%s ' "${known[@]//_/-}")"
    fi
    printf -v "$variable" '%s' "$value"
  done
}

# run_stage K DESCRIPTION: true when stage <= K <= stop_stage (and announces it).
# shellcheck disable=SC2154  # stop_stage is set by each run.sh
run_stage() {
  if [ "$stage" -le "$1" ] && [ "$stop_stage" -ge "$1" ]; then
    log "Stage $1: $2"
    return 0
  fi
  return 1
}

# done_already PATH WHAT: true (and says so) when PATH exists, the mark of finished work.
done_already() {
  if [ -e "$1" ]; then
    log "$2: $1 exists, skipping"
    return 0
  fi
  return 1
}

# download_corpus CORPUS [ARGS...]: the corpus folder under $dl_dir, downloaded when missing.
download_corpus() {
  local folder
  case "$1" in
    librispeech) folder=LibriSpeech ;; gigaspeech) folder=GigaSpeech ;; *) folder=$1 ;;
  esac
  if [ -d "$dl_dir/$folder" ] && [ -n "$(ls -A "$dl_dir/$folder")" ]; then
    log "download of $1: $dl_dir/$folder exists, skipping"
    return 0
  fi
  python -m local.download_corpus "$1" "$dl_dir" "${@:2}"
}

# prepare_manifests CORPUS CORPUS_DIR PARTS: Lhotse manifests into data/manifests.
prepare_manifests() {
  local corpus=$1 corpus_dir=$2 parts=$3 part missing=0
  for part in $parts; do
    [ -f "$manifest_dir/${corpus}_recordings_${part}.jsonl.gz" ] || missing=1
  done
  if [ $missing -eq 0 ]; then
    log "$corpus manifests of $parts: in $manifest_dir already, skipping"
    return 0
  fi
  # shellcheck disable=SC2086
  python -m local.prepare_manifests "$corpus" "$corpus_dir" "$manifest_dir" --parts $parts --num-jobs "$nj"
}

# compute_fbank_parts CORPUS PARTS PERTURBED_PARTS SPEED_FACTORS: fbank of each part
# into data/fbank/<corpus>_cuts_<part>.jsonl.gz; the perturbed parts also get a copy
# of every cut per speed factor.
compute_fbank_parts() {
  local corpus=$1 parts=$2 perturbed=$3 factors=$4 part todo=()
  for part in $parts; do
    done_already "$fbank_dir/${corpus}_cuts_${part}.jsonl.gz" "fbank of $corpus $part" || todo+=("$part")
  done
  [ ${#todo[@]} -eq 0 ] && return 0
  # shellcheck disable=SC2086
  python -m local.compute_fbank --num-jobs "$nj" parts "$corpus" "$manifest_dir" "$fbank_dir" \
    --parts "${todo[@]}" --perturbed-parts $perturbed --speed-perturb "$factors"
}

# musan_manifests: MUSAN manifests from $dl_dir/musan.
musan_manifests() {
  prepare_manifests musan "$dl_dir/musan" "music noise speech"
}

# musan_fbank: fbank of MUSAN in 10 s windows (longer than 5 s) into data/fbank.
musan_fbank() {
  done_already "$fbank_dir/musan_cuts.jsonl.gz" "MUSAN fbank" && return 0
  python -m local.musan "$manifest_dir" "$fbank_dir" --num-jobs "$nj"
}

# train_bpe_models VOCAB_SIZES MODEL_TYPE MANIFEST...: data/lang_bpe_<V> for each size.
train_bpe_models() {
  local sizes=$1 model_type=$2 vocab_size
  shift 2
  for vocab_size in $sizes; do
    local lang_dir=data/lang_bpe_$vocab_size
    done_already "$lang_dir/tokens.txt" "BPE $vocab_size" && continue
    python -m local.train_bpe "$lang_dir" --manifests "$@" \
      --vocab-size "$vocab_size" --model-type "$model_type"
  done
}

# --- Training and decoding (stages 10-12 of the corpus recipes) -----------------------
# A recipe sets its data paths (train_cuts, valid_cuts, test_cuts, lang_dir) and calls
# train_model, decode_model and print_error_rates. Hyper-parameters come from the
# recipe's conf/train.yaml only; --train-args adds section.field=value overrides.
# shellcheck disable=SC2034  # read by each run.sh
training_options=(train_config train_args exp_dir num_gpus num_nodes node_rank rdzv_endpoint rdzv_id
  epoch avg use_averaged_model decoding_methods beam decode_args)
train_config=conf/train.yaml   # model/data/train preset read by zipformer/train.py
train_args=""                  # extra overrides, e.g. "data.max_duration=700 train.base_lr=0.04"
exp_dir=exp/zipformer_pruned_ctc
num_gpus=1                     # processes per node (torchrun when > 1); 0: one CPU process
num_nodes=1                    # > 1: also give --node-rank and --rdzv-endpoint HOST:PORT on every node
node_rank=0
rdzv_endpoint=""
rdzv_id=pruned_ctc
epoch=""                       # decode epoch-<epoch>.pt; default: the last epoch of training
avg=15                         # icefall's decoder defaults: --avg 15 --use-averaged-model true
use_averaged_model=true
decoding_methods="ctc-prefix-beam-search ctc-greedy-search"
beam=4                         # prefix beam search (paper Sec. 5.2)
decode_args=""                 # extra zipformer.decode options, e.g. "--max-duration 600"

# comma_list ITEM...: the items joined by commas (the manifest lists of zipformer.train/decode).
comma_list() {
  local IFS=,
  echo "$*"
}

# training_settings PATH_OVERRIDE...: sets train_settings (the recipe's paths, then the
# user's --train-args) and reads num_epochs and exp_dir of the resulting configuration.
training_settings() {
  local extra=() values
  read -r -a extra <<< "$train_args"
  train_settings=("$@" "${extra[@]}")
  [ -f "$train_config" ] || die "--train-config: file not found: $train_config"
  values=$(python - "$train_config" "${train_settings[@]}" <<'PY'
import sys
from zipformer.run_config import load_run_config
try:
    config = load_run_config(sys.argv[1], sys.argv[2:])
except (ValueError, FileNotFoundError) as error:
    sys.exit(f"ERROR: --train-config {sys.argv[1]} / --train-args: {error}")
print(config.train.num_epochs, config.train.exp_dir)
PY
  ) || die "cannot read the training configuration"
  num_epochs=${values%% *}
  exp_dir=${values#* }
}

# newest_checkpoint: the checkpoint written last in $exp_dir (epoch-N.pt or checkpoint-B.pt), or "".
newest_checkpoint() {
  # shellcheck disable=SC2012  # names are ours: epoch-N.pt, checkpoint-B.pt
  ls -t "$exp_dir"/epoch-*.pt "$exp_dir"/checkpoint-*.pt 2> /dev/null | head -n 1 || true
}

# cuda_device_count: GPUs torch can see (0 without CUDA).
cuda_device_count() {
  python -c 'import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)'
}

# train_model: zipformer.train with $train_config and $train_settings into $exp_dir;
# skipped when epoch-<num_epochs>.pt exists, resumed from the newest checkpoint otherwise.
# One process on one GPU or the CPU, torchrun for several GPUs or nodes.
train_model() {
  done_already "$exp_dir/epoch-$num_epochs.pt" "training" && return 0
  local resume=() newest number launcher gpus
  newest=$(newest_checkpoint)
  case "$newest" in
    */epoch-*.pt) number=${newest##*/epoch-}; resume=(train.start_epoch=$((${number%.pt} + 1))) ;;
    */checkpoint-*.pt) number=${newest##*/checkpoint-}; resume=(train.start_batch="${number%.pt}") ;;
  esac
  [ ${#resume[@]} -gt 0 ] && log "training: resuming from $newest (${resume[*]})"
  [[ "$num_gpus" =~ ^[0-9]+$ ]] || die "--num-gpus must be a whole number, got '$num_gpus'"
  [[ "$num_nodes" =~ ^[1-9][0-9]*$ ]] || die "--num-nodes must be a positive integer, got '$num_nodes'"
  launcher=(python -m zipformer.train)
  if [ "$num_nodes" -gt 1 ]; then
    [ -n "$rdzv_endpoint" ] || die "--num-nodes $num_nodes needs --rdzv-endpoint HOST:PORT (the same on every node)"
    [ "$num_gpus" -ge 1 ] || die "--num-nodes $num_nodes needs --num-gpus >= 1"
    launcher=(python -m torch.distributed.run --nnodes "$num_nodes" --node-rank "$node_rank"
      --nproc-per-node "$num_gpus" --rdzv-backend c10d --rdzv-endpoint "$rdzv_endpoint"
      --rdzv-id "$rdzv_id" -m zipformer.train)
    log "training on node $node_rank of $num_nodes, $num_gpus processes here (exp dir must be shared)"
  elif [ "$num_gpus" -gt 1 ]; then
    gpus=$(cuda_device_count)
    if [ "$gpus" -eq 0 ]; then
      log "training: no CUDA device, one CPU process instead of $num_gpus GPUs"
    elif [ "$gpus" -lt "$num_gpus" ]; then
      die "--num-gpus $num_gpus but only $gpus CUDA device(s) are visible"
    else
      launcher=(python -m torch.distributed.run --standalone --nproc-per-node "$num_gpus" -m zipformer.train)
      log "training on $num_gpus GPUs"
    fi
  fi
  "${launcher[@]}" --config "$train_config" "${train_settings[@]}" "${resume[@]}"
  [ -f "$exp_dir/epoch-$num_epochs.pt" ] || die "training stopped before $exp_dir/epoch-$num_epochs.pt" \
    "(train.max_batches?); rerun the stage to resume"
}

# decode_suffix: icefall's checkpoint part of the result file names.
decode_suffix() {
  local suffix="epoch-${epoch}_avg-$avg"
  case "${use_averaged_model,,}" in
    true|1|yes) suffix+="_use-averaged-model" ;;
    false|0|no) ;;
    *) die "--use-averaged-model must be true or false, got '$use_averaged_model'" ;;
  esac
  echo "$suffix"
}

# method_key METHOD: the setting's name in wer-summary files.
method_key() {
  if [ "$1" = ctc-prefix-beam-search ]; then echo "$1_beam-$beam"; else echo "$1"; fi
}

# decode_model NAME=CUTS... -- DECODE_OPTION...: recogs-/errs-/wer-summary- files of each
# test set for every method in $decoding_methods; skipped when every summary lists them.
decode_model() {
  local test_sets=() options=() item name method summary missing=0
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do test_sets+=("$1"); shift; done
  [ $# -gt 0 ] && shift
  options=("$@")
  epoch=${epoch:-$num_epochs}
  for item in "${test_sets[@]}"; do
    name=${item%%=*}
    summary="$exp_dir/wer-summary-$name-$(decode_suffix).txt"
    for method in $decoding_methods; do
      grep -q "^$(method_key "$method")"$'\t' "$summary" 2> /dev/null || missing=1
    done
  done
  if [ $missing -eq 0 ]; then
    log "decoding: $exp_dir/wer-summary-*-$(decode_suffix).txt list every method, skipping"
    return 0
  fi
  local extra=()
  read -r -a extra <<< "$decode_args"
  # shellcheck disable=SC2086  # methods are words
  python -m zipformer.decode --exp-dir "$exp_dir" --epoch "$epoch" --avg "$avg" \
    --use-averaged-model "$use_averaged_model" --method $decoding_methods --beam "$beam" \
    --test-cuts "$(comma_list "${test_sets[@]}")" "${options[@]}" "${extra[@]}"
}

# print_error_rates UNIT NAME...: the WER/CER of every test set and method, from the
# wer-summary files of decode_model.
print_error_rates() {
  local unit=$1 name method summary rate
  shift
  epoch=${epoch:-$num_epochs}
  log "$unit (%) of $exp_dir, $(decode_suffix):"
  printf '%-16s' "test set"
  for method in $decoding_methods; do printf ' %30s' "$(method_key "$method")"; done
  printf '\n'
  for name in "$@"; do
    summary="$exp_dir/wer-summary-$name-$(decode_suffix).txt"
    [ -f "$summary" ] || die "no results for $name: $summary is missing (run stage 11)"
    printf '%-16s' "$name"
    for method in $decoding_methods; do
      rate=$(awk -F '\t' -v key="$(method_key "$method")" '$1 == key { print $2 }' "$summary")
      printf ' %30s' "${rate:-missing}"
    done
    printf '\n'
  done
}

# recipe_setup: common settings once the options are parsed; moves into the recipe folder.
recipe_setup() {
  case "$dl_dir" in /*) ;; *) dl_dir=$PWD/$dl_dir ;; esac
  cd "$recipe_dir" || exit 1
  manifest_dir=data/manifests
  fbank_dir=data/fbank
  mkdir -p "$manifest_dir" "$fbank_dir"
  log "stages $stage..$stop_stage, nj=$nj, download dir $dl_dir, python $(command -v python)"
}

recipe_dir=$(cd "$(dirname "${BASH_SOURCE[1]}")" && pwd)
repo_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export PYTHONPATH="$repo_dir${PYTHONPATH:+:$PYTHONPATH}"
stage=0
nj=$(( $(nproc) < 15 ? $(nproc) : 15 ))
dl_dir=$recipe_dir/download
if [ -f "$recipe_dir/conf/data.sh" ]; then
  # shellcheck disable=SC1091
  source "$recipe_dir/conf/data.sh"
fi
