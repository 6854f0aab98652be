"""Measure the mini Zipformer's training step and decoding with one and two threads, with
torch's OpenMP defaults, ``OMP_WAIT_POLICY=PASSIVE`` and the toolkit's GOMP_SPINCOUNT
(asr/threads.py), on idle cores and beside one busy process (a Python loop), each setting
in a fresh process; writes ``results_cpu.md`` and ``threads_cpu.csv``::

    python -m benchmarks.threads --steps 8 --output-dir benchmarks/threads
"""

from __future__ import annotations

import argparse
import csv
import datetime
import json
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Dict, List

from asr.atomic_io import write_text_atomically
from asr.threads import DEFAULT_SPIN_COUNT

# name -> (threads, environment that differs from a plain process's)
SETTINGS = {
    "the toolkit's default: idle cores at the start, GOMP_SPINCOUNT=1000": (0, {}),
    "2 threads, OpenMP defaults": (2, {}),
    "2 threads, OMP_WAIT_POLICY=PASSIVE": (2, {"OMP_WAIT_POLICY": "PASSIVE"}),
    f"2 threads, GOMP_SPINCOUNT={DEFAULT_SPIN_COUNT} (the toolkit's default)": (2, {}),
    "1 thread": (1, {}),
}


def measure(threads: int, extra: Dict[str, str], steps: int, toolkit_default: bool) -> Dict[str, float]:
    environment = {key: value for key, value in os.environ.items()
                   if key not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY", "OMP_NUM_THREADS")}
    environment.update(extra)
    if threads:
        environment["OMP_NUM_THREADS"] = str(threads)
    if not toolkit_default and "OMP_WAIT_POLICY" not in extra:
        # What torch does on its own: libgomp's default spin count (asr sets none when
        # GOMP_SPINCOUNT is given).
        environment["GOMP_SPINCOUNT"] = "300000"
    output = subprocess.run([sys.executable, "-m", "benchmarks.threads.worker", str(threads), str(steps)],
                            env=environment, capture_output=True, text=True, check=True).stdout
    return json.loads(output.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(prog=f"python -m {__package__}", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=8, help="steps per setting (the first 2 are not timed)")
    parser.add_argument("--output-dir", type=Path, default=Path("benchmarks/threads"))
    args = parser.parse_args()
    rows: List[dict] = []
    load_before = "/".join(f"{x:.2f}" for x in os.getloadavg())
    for competing in (False, True):
        busy = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if competing else None
        try:
            for name, (threads, extra) in SETTINGS.items():
                result = measure(threads, extra, args.steps, toolkit_default="GOMP_SPINCOUNT" in name)
                result["threads"] = int(result["threads"])
                rows.append({"machine": "busy (one competing process)" if competing else "idle", "setting": name,
                             **{key: round(value, 3) for key, value in result.items()}})
                print(rows[-1], flush=True)
        finally:
            if busy is not None:
                busy.kill()
    idle = {row["setting"]: row for row in rows if row["machine"] == "idle"}
    lines = ["# Threads and OpenMP wait policies on a busy 2-core machine", "",
             f"Command: `python -m benchmarks.threads --steps {args.steps}`", "",
             f"Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores; "
             f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC; load before {load_before}", "",
             "The mini Zipformer (`egs/mini/conf/train.yaml`), a batch of 8 utterances of 5 s: median seconds "
             f"of the training step and of decoding (log-probs + greedy search) over steps 3-{args.steps}, each "
             "setting in a fresh process. Speed vs idle: the same setting's idle time over this one.", "",
             "| machine | setting | threads | training step (s) | speed vs idle | decoding (s) |",
             "|---|---|---|---|---|---|"]
    for row in rows:
        speed = idle[row["setting"]]["train_s"] / row["train_s"]
        lines.append(f"| {row['machine']} | {row['setting']} | {row['threads']} | {row['train_s']:.3f} | {speed:.0%} | "
                     f"{row['decode_s']:.3f} |")
    args.output_dir.mkdir(parents=True, exist_ok=True)
    write_text_atomically(args.output_dir / "results_cpu.md", "\n".join(lines) + "\n")
    with open(args.output_dir / "threads_cpu.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
