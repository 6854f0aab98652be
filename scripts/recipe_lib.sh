# shellcheck shell=bash
# Shell helpers shared by the recipes (egs/<corpus>/run.sh): logging, option parsing,
# stage selection, and the data stages that several recipes run the same way.
# Source it first thing in run.sh; it needs bash and the project's python on PATH.
# Sourcing sets recipe_dir (the folder of run.sh), makes this checkout importable,
# sets the defaults every recipe shares (stage, nj, dl_dir) and reads conf/data.sh.

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
