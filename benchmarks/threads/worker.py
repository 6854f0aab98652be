"""One measurement in a fresh process (the OpenMP settings are read when torch loads):
median seconds of the mini Zipformer's training step (8 utterances of 5 s, 80-dim fbank)
and of decoding the same batch (log-probs + greedy search).

    python -m benchmarks.threads.worker THREADS STEPS     (THREADS 0: asr.threads.choose_threads)
"""

from __future__ import annotations

import argparse
import json
import statistics
import time


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.threads.worker", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("threads", type=int, help="torch threads (0: asr.threads.choose_threads)")
    parser.add_argument("steps", type=int, help="training and decoding steps (the first 2 are not timed)")
    args = parser.parse_args()
    threads, steps = args.threads, args.steps
    import asr  # noqa: F401  (first: its OpenMP settings must precede torch's loading)
    import torch

    from asr.config import load_run_config
    from asr.search import ctc_greedy_search
    from asr.train_step import training_step
    from asr.trainee import build_trainee, seed_everything

    from asr.threads import choose_threads

    chosen = choose_threads(threads)  # 0: the toolkit's choice, the cores idle now
    config = load_run_config("egs/mini/conf/train.yaml")
    seed_everything(0)
    trainee = build_trainee(config, torch.device("cpu"), 500, 0)
    generator = torch.Generator().manual_seed(0)
    batch = {"features": torch.randn(8, 500, 80, generator=generator), "feature_lens": torch.full((8,), 500)}
    targets = [torch.randint(1, 500, (20,), generator=generator).tolist() for _ in range(8)]
    train, decode = [], []
    for step in range(1, steps + 1):
        started = time.perf_counter()
        training_step(trainee, batch, targets, step)
        train.append(time.perf_counter() - started)
        started = time.perf_counter()
        with torch.inference_mode():
            log_probs, lengths = trainee.model.log_probs(batch["features"], batch["feature_lens"])
            ctc_greedy_search(log_probs, lengths)
        decode.append(time.perf_counter() - started)
    warm = 2  # the first steps allocate and warm the caches
    print(json.dumps({"threads": chosen, "train_s": statistics.median(train[warm:]),
                      "decode_s": statistics.median(decode[warm:])}))


if __name__ == "__main__":
    main()
