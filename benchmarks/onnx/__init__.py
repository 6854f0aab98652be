"""The ONNX export against our PyTorch decoder on egs/mini (run_mini.sh) and our model
decoded from audio (python -m benchmarks.onnx.decode_from_audio)."""
