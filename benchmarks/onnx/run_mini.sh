#!/usr/bin/env bash
# Export the egs/mini model to ONNX and decode test-clean four ways, one thread each:
# our decoder (PyTorch, stored fbank), our model from audio (python -m benchmarks.onnx.decode_from_audio)
# and sherpa-onnx with model.onnx and model.int8.onnx.
# Run after egs/mini/run.sh (stages 0-5), from anywhere:
#   benchmarks/onnx/run_mini.sh [exp_dir relative to egs/mini] [data tag]
# The decoded weights are those run.sh decodes: the exact average between the two newest
# checkpoint-*.pt (--iter N --avg 1 --use-averaged-model true).
set -euo pipefail
# This file is benchmarks/onnx/run_mini.sh: the repository is two folders up.
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
exp=${1:-exp/full_pruned_ctc}
tag=${2:-full}
export PYTHONPATH=$repo${PYTHONPATH:+:$PYTHONPATH} OMP_NUM_THREADS=1
cd "$repo/egs/mini"
if ! compgen -G "$exp/checkpoint-*.pt" > /dev/null; then
  echo "ERROR: no $exp/checkpoint-*.pt under $repo/egs/mini: train the model first (cd egs/mini && ./run.sh)" >&2
  exit 1
fi
iteration=$(ls "$exp"/checkpoint-*.pt | sed 's/.*checkpoint-//; s/[.]pt$//' | sort -n | tail -n 1)
suffix=iter-${iteration}_avg-1_use-averaged-model
test_cuts=data/$tag/fbank/librispeech_cuts_test-clean.jsonl.gz
echo "== $(date -u '+%F %T UTC'); $(uptime)"
python -m zipformer.export_onnx --exp-dir "$exp" --iter "$iteration" --avg 1 --use-averaged-model true
echo "== ours (PyTorch, stored fbank), $(uptime)"
python -m asr.decode --exp-dir "$exp" --iter "$iteration" --avg 1 --use-averaged-model true \
  --method ctc-greedy-search ctc-prefix-beam-search --device cpu --test-cuts "$test_cuts"
echo "== ours (PyTorch) from audio, lhotse fbank uncompressed, $(uptime)"
python -m benchmarks.onnx.decode_from_audio --exp-dir "$exp" --iter "$iteration" --avg 1 \
  --use-averaged-model true --test-cuts "$test_cuts" --result-dir "$exp/torch-from-audio"
for model in model model.int8; do
  echo "== sherpa-onnx $model, $(uptime)"
  python -m zipformer.sherpa_decode --model "$exp/onnx-$suffix/$model.onnx" --num-threads 1 \
    --batch-size 1 --test-cuts "$test_cuts"
done
echo "== done $(date -u '+%F %T UTC'); $(uptime)"
