"""Threads and OpenMP wait policies on a busy machine (asr/threads.py): the mini Zipformer's
training step and decoding, idle and beside one busy process."""
