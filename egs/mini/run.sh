#!/usr/bin/env bash
# The mini recipe: a small English corpus synthesized on the spot, from audio to WER
# on a laptop CPU (about 15 minutes on 2 cores with the defaults, see RESULTS.md).
#   ./run.sh                      # everything: stages 0-5
#   ./run.sh --ctc-loss standard  # the same with standard (dense) CTC, for comparison
#   ./run.sh --quick 1            # a few-minute smoke run (smaller corpus and model)
#   ./run.sh --stage 4 --stop-stage 5 --train-config conf/train.yaml
# Stages: 0 synthesize the corpus, 1 manifests, 2 fbank, 3 BPE, 4 train, 5 decode.
# Everything is written under this folder (download/, data/, exp/); every stage skips
# the work it finds finished, so a rerun (or a run after a kill) continues where the
# last one stopped.
set -euo pipefail
# shellcheck source=../../scripts/recipe_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/recipe_lib.sh"

stop_stage=5
options=(stage stop_stage nj dl_dir num_train num_dev num_test seed vocab_size ctc_loss
  train_config methods beam quick)
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
case "$ctc_loss" in pruned|standard) ;; *) die "--ctc-loss must be pruned or standard, got '$ctc_loss'" ;; esac
for count in num_train num_dev num_test vocab_size beam; do
  [[ "${!count}" =~ ^[1-9][0-9]*$ ]] || die "--${count//_/-} must be a positive integer, got '${!count}'"
done
recipe_setup
[ -f "$train_config" ] || die "--train-config: file not found: $train_config"

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
      --dev "$num_dev" --test "$num_test" --seed "$seed"
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
  if ! done_already "$lang_dir/tokens.txt" "BPE $vocab_size"; then
    python -m local.train_bpe "$lang_dir" --vocab-size "$vocab_size" \
      --manifests "$manifest_dir/librispeech_supervisions_train-clean-100.jsonl.gz"
  fi
fi

train_settings=(
  train.exp_dir="$exp_dir" train.lang_dir="$lang_dir" model.loss="$ctc_loss"
  data.train_cuts="$fbank_dir/librispeech_cuts_train-clean-100.jsonl.gz"
  data.valid_cuts="$fbank_dir/librispeech_cuts_dev-clean.jsonl.gz"
)
num_epochs=$(python - "$train_config" "${train_settings[@]}" <<'PY'
import sys
from zipformer.run_config import load_run_config
print(load_run_config(sys.argv[1], sys.argv[2:]).train.num_epochs)
PY
)

if run_stage 4 "train a Zipformer with $ctc_loss CTC ($train_config) into $exp_dir"; then
  if ! done_already "$exp_dir/epoch-$num_epochs.pt" "training"; then
    # Resume from the newest checkpoint, if an earlier run was stopped.
    resume=()
    # shellcheck disable=SC2012  # our own file names, newest first
    newest=$(ls -t "$exp_dir"/epoch-*.pt "$exp_dir"/checkpoint-*.pt 2> /dev/null | head -n 1 || true)
    case "$newest" in
      */epoch-*.pt) number=${newest##*/epoch-}; resume=(train.start_epoch=$((${number%.pt} + 1))) ;;
      */checkpoint-*.pt) number=${newest##*/checkpoint-}; resume=(train.start_batch="${number%.pt}") ;;
    esac
    [ ${#resume[@]} -gt 0 ] && log "resuming from $newest"
    python -m zipformer.train --config "$train_config" "${train_settings[@]}" "${resume[@]}"
  fi
fi

if run_stage 5 "decode test-clean ($methods) with the averaged weights of $exp_dir"; then
  # The decoded model is the exact average of the weights between the two newest
  # checkpoint-<batch>.pt files (icefall's --iter N --avg 1 --use-averaged-model true):
  # on this short, small-batch run it removes about a third of the errors (RESULTS.md).
  # shellcheck disable=SC2012  # our own file names
  iterations=$(ls "$exp_dir"/checkpoint-*.pt 2> /dev/null | sed 's/.*checkpoint-//; s/[.]pt$//' | sort -n | tail -n 2 | xargs)
  read -r -a iterations <<< "$iterations"
  [ ${#iterations[@]} -eq 2 ] || die "decoding averages the two newest checkpoint-*.pt of $exp_dir," \
    "found ${#iterations[@]}: train longer than train.save_every_n batches, or keep more (train.keep_last_k)"
  iteration=${iterations[1]}
  summary_key="iter-${iteration}_avg-1_use-averaged-model"
  if ! done_already "$exp_dir/wer-summary-test-clean-$summary_key.txt" "decoding"; then
    # shellcheck disable=SC2086
    python -m zipformer.decode --exp-dir "$exp_dir" --iter "$iteration" --avg 1 \
      --use-averaged-model true --method $methods --beam "$beam" \
      --test-cuts "$fbank_dir/librispeech_cuts_test-clean.jsonl.gz"
  fi
  log "WER on test-clean ($ctc_loss CTC, weights averaged over batches ${iterations[0]}-$iteration, files in $exp_dir):"
  cat "$exp_dir/wer-summary-test-clean-$summary_key.txt"
fi
