"""The physical constants every part of the toolkit shares."""

SAMPLE_RATE = 16000  # Hz: the audio every model and feature pipeline reads
FRAME_SHIFT_SECONDS = 0.01  # the fbank hop: 100 feature frames per second
FRAMES_PER_SECOND = 100
QWEN3_HEAD_ROWS = 151_936  # rows of Qwen3's vocabulary head (its tokenizer uses 151,669 of them)
