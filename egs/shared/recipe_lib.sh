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

# The data programs below skip the work they find finished (and say so) by themselves.

# prepare_manifests CORPUS CORPUS_DIR PARTS: Lhotse manifests into data/manifests.
prepare_manifests() {
  # shellcheck disable=SC2086
  python -m local.prepare_manifests "$1" "$2" "$manifest_dir" --parts $3 --num-jobs "$nj"
}

# compute_fbank_parts CORPUS PARTS PERTURBED_PARTS SPEED_FACTORS: fbank of each part
# into data/fbank/<corpus>_cuts_<part>.jsonl.gz; the perturbed parts also get a copy
# of every cut per speed factor.
compute_fbank_parts() {
  # shellcheck disable=SC2086
  python -m local.compute_fbank --num-jobs "$nj" parts "$1" "$manifest_dir" "$fbank_dir" \
    --parts $2 --perturbed-parts $3 --speed-perturb "$4"
}

# musan_manifests: MUSAN manifests from $dl_dir/musan.
musan_manifests() {
  prepare_manifests musan "$dl_dir/musan" "music noise speech"
}

# musan_fbank: fbank of MUSAN in 10 s windows (longer than 5 s) into data/fbank.
musan_fbank() {
  python -m local.musan "$manifest_dir" "$fbank_dir" --num-jobs "$nj"
}

# train_bpe_models VOCAB_SIZES MODEL_TYPE MANIFEST...: data/lang_bpe_<V> for each size.
train_bpe_models() {
  local sizes=$1 model_type=$2 vocab_size
  shift 2
  for vocab_size in $sizes; do
    python -m local.train_bpe "data/lang_bpe_$vocab_size" --manifests "$@" \
      --vocab-size "$vocab_size" --model-type "$model_type"
  done
}

# --- Training and decoding (stages 10-12 of the corpus recipes) -----------------------
# A recipe sets its data paths with training_settings and calls train_model and
# decode_model. Hyper-parameters, the decoding settings and the skip/resume decisions
# live in Python (asr.train, asr.decode) and the recipe's conf/train.yaml only;
# --train-args and --decode-args add section.field=value overrides.
# shellcheck disable=SC2034  # read by each run.sh
training_options=(train_config train_args decode_args exp_dir num_gpus cpu_processes num_nodes node_rank rdzv_endpoint rdzv_id)
train_config=conf/train.yaml   # the preset read by asr.train and asr.decode
train_args=""                  # extra overrides, e.g. "data.max_duration=700 optim.base_lr=0.04"
decode_args=""                 # extra overrides, e.g. "decode.avg=10 decode.beam_size=8"
exp_dir=exp/zipformer_pruned_ctc
num_gpus=1                     # processes per node (torchrun when > 1); 0: one CPU process
cpu_processes=1                # > 1 without GPUs (--num-gpus 0 or 1): torchrun with this many CPU
                               # processes (gloo), one thread each, sharing each batch of
                               # data.max_duration (data.batch_across_ranks): the preset's updates
                               # in less time; decoding shares each test set among them
num_nodes=1                    # > 1: also give --node-rank and --rdzv-endpoint HOST:PORT on every node
node_rank=0
rdzv_endpoint=""
rdzv_id=pruned_ctc

# comma_list ITEM...: the items joined by commas (the manifest lists of asr.train/decode).
comma_list() {
  local IFS=,
  echo "$*"
}

# training_settings OVERRIDE...: the recipe's paths (train.exp_dir=... data.train_cuts=...)
# followed by the user's --train-args, for asr.train and asr.decode.
training_settings() {
  local extra=()
  read -r -a extra <<< "$train_args"
  [ -f "$train_config" ] || die "${config_option:---train-config}: file not found: $train_config"
  local setting
  for setting in "${extra[@]}"; do
    # --train-args "train.exp_dir=..." wins: the stages announce and use that folder.
    case "$setting" in train.exp_dir=*) exp_dir=${setting#train.exp_dir=} ;; esac
  done
  train_settings=(train.exp_dir="$exp_dir" "$@" "${extra[@]}")
}

# cuda_device_count: GPUs torch can see (0 without CUDA).
cuda_device_count() {
  python -c 'import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)'
}

# train_model: asr.train with $train_config and $train_settings. It resumes from the newest
# checkpoint of the experiment folder by itself and says so when training is finished.
# One process on one GPU or the CPU, torchrun for several GPUs or nodes. A recipe that sets
# virtual_ranks=N (> 1) has its one process train as N ranks sharing each batch
# (train.virtual_ranks, data.batch_across_ranks): the updates of --cpu-processes N.
train_model() {
  local launcher gpus
  [[ "$num_gpus" =~ ^[0-9]+$ ]] || die "--num-gpus must be a whole number, got '$num_gpus'"
  [[ "$num_nodes" =~ ^[1-9][0-9]*$ ]] || die "--num-nodes must be a positive integer, got '$num_nodes'"
  [[ "$cpu_processes" =~ ^[1-9][0-9]*$ ]] || die "--cpu-processes must be a positive integer, got '$cpu_processes'"
  launcher=(python -m asr.train)
  local device=()
  if [ "$cpu_processes" -gt 1 ]; then
    [ "$num_gpus" -le 1 ] && [ "$num_nodes" -eq 1 ] ||
      die "--cpu-processes $cpu_processes trains on one machine's CPU: not with --num-gpus $num_gpus or --num-nodes $num_nodes"
    launcher=(python -m torch.distributed.run --standalone --nproc-per-node "$cpu_processes" -m asr.train)
    device=(train.device=cpu data.batch_across_ranks=true)
    log "training in $cpu_processes CPU processes (gloo; one thread each unless OMP_NUM_THREADS is set;" \
      "each draws 1/$cpu_processes of every batch)"
  elif [ "$num_nodes" -gt 1 ]; then
    [ -n "$rdzv_endpoint" ] || die "--num-nodes $num_nodes needs --rdzv-endpoint HOST:PORT (the same on every node)"
    [ "$num_gpus" -ge 1 ] || die "--num-nodes $num_nodes needs --num-gpus >= 1"
    launcher=(python -m torch.distributed.run --nnodes "$num_nodes" --node-rank "$node_rank"
      --nproc-per-node "$num_gpus" --rdzv-backend c10d --rdzv-endpoint "$rdzv_endpoint"
      --rdzv-id "$rdzv_id" -m asr.train)
    log "training on node $node_rank of $num_nodes, $num_gpus processes here (exp dir must be shared)"
  elif [ "$num_gpus" -gt 1 ]; then
    gpus=$(cuda_device_count)
    if [ "$gpus" -eq 0 ]; then
      log "training: no CUDA device, one CPU process instead of $num_gpus GPUs"
    elif [ "$gpus" -lt "$num_gpus" ]; then
      die "--num-gpus $num_gpus but only $gpus CUDA device(s) are visible"
    else
      launcher=(python -m torch.distributed.run --standalone --nproc-per-node "$num_gpus" -m asr.train)
      log "training on $num_gpus GPUs"
    fi
  fi
  if [ "${virtual_ranks:-1}" -gt 1 ] && [ "${launcher[*]}" = "python -m asr.train" ]; then
    device=(data.batch_across_ranks=true train.virtual_ranks="$virtual_ranks")
    log "training as $virtual_ranks ranks in one process (train.virtual_ranks: each draws 1/$virtual_ranks of" \
      "every batch, the updates of $virtual_ranks processes)"
  fi
  "${launcher[@]}" --config "$train_config" "${device[@]}" "${train_settings[@]}"
}

# decode_model NAME=CUTS...: asr.decode of the test sets with $train_config's decode section
# and --decode-args; it skips test sets whose results exist and prints the error-rate table.
# With --cpu-processes N the N processes share each test set (torchrun, batch by batch).
decode_model() {
  local extra=() launcher=(python -m asr.decode) device=()
  read -r -a extra <<< "$decode_args"
  [[ "$cpu_processes" =~ ^[1-9][0-9]*$ ]] || die "--cpu-processes must be a positive integer, got '$cpu_processes'"
  if [ "$cpu_processes" -gt 1 ]; then
    launcher=(python -m torch.distributed.run --standalone --nproc-per-node "$cpu_processes" -m asr.decode)
    device=(decode.device=cpu)
  fi
  "${launcher[@]}" --config "$train_config" "${device[@]}" "${train_settings[@]}" \
    decode.test_cuts="$(comma_list "$@")" "${extra[@]}"
}

# export_onnx_and_decode NAME=CUTS...: the weights the decode section chooses, exported to
# ONNX for sherpa-onnx (model.onnx, model.int8.onnx, tokens.txt in <exp_dir>/onnx-<suffix>),
# and the test sets decoded with sherpa-onnx from their audio, scored like asr.decode.
export_onnx_and_decode() {
  local extra=() settings model onnx_dir
  read -r -a extra <<< "$decode_args"
  settings=("${train_settings[@]}" decode.test_cuts="$(comma_list "$@")" "${extra[@]}")
  onnx_dir=$(python -m zipformer.export_onnx --config "$train_config" "${settings[@]}" | sed -n 's#^wrote \(.*\)/model.onnx$#\1#p')
  [ -n "$onnx_dir" ] || die "ONNX export wrote no model.onnx"
  for model in model model.int8; do
    python -m zipformer.sherpa_decode --model "$onnx_dir/$model.onnx" --config "$train_config" "${settings[@]}"
  done
}

# recipe_setup: common settings once the options are parsed; moves into the recipe folder.
recipe_setup() {
  case "$dl_dir" in /*) ;; *) dl_dir=$PWD/$dl_dir ;; esac
  cd "$recipe_dir" || exit 1
  manifest_dir=data/manifests
  fbank_dir=data/fbank
  local last_stage
  last_stage=$(grep -oE 'run_stage [0-9]+' "$recipe_dir/run.sh" | awk '{print $2}' | sort -n | tail -1)
  if [ -n "$last_stage" ] && [ "$stage" -gt "$last_stage" ]; then
    die "--stage $stage: this recipe's stages are 0..$last_stage (see the stage list at the top of run.sh)"
  fi
  [ "$stage" -le "$stop_stage" ] || die "--stage $stage is after --stop-stage $stop_stage: no stage would run"
  mkdir -p "$manifest_dir" "$fbank_dir"
  log "stages $stage..$stop_stage, nj=$nj, download dir $dl_dir, python $(command -v python)"
}

recipe_dir=$(cd "$(dirname "${BASH_SOURCE[1]}")" && pwd)
repo_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)  # this file is egs/shared/recipe_lib.sh
export PYTHONPATH="$repo_dir${PYTHONPATH:+:$PYTHONPATH}"
stage=0
nj=$(( $(nproc) < 15 ? $(nproc) : 15 ))
dl_dir=$recipe_dir/download
if [ -f "$recipe_dir/conf/data.sh" ]; then
  # shellcheck disable=SC1091
  source "$recipe_dir/conf/data.sh"
fi
