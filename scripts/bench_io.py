"""What every analysis script writes the same way: atomic CSV and text files, and the
provenance lines (command, machine, torch version, date) that head each result file."""

from __future__ import annotations

import csv
import datetime
import os
import platform
import sys
from pathlib import Path

import torch


def write_csv(rows: list[dict], path: Path) -> None:
    """Writes rows (the first row's keys are the columns) to ``path`` atomically."""
    temporary = path.with_name("." + path.name + ".tmp")
    with open(temporary, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    os.replace(temporary, path)


def write_text(text: str, path: Path) -> None:
    temporary = path.with_name("." + path.name + ".tmp")
    temporary.write_text(text)
    os.replace(temporary, path)


def machine_description(device: str) -> str:
    if device == "cuda":
        return torch.cuda.get_device_name(0)
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    return (f"{model}, {os.cpu_count()} cores, {torch.get_num_threads()} torch threads, "
            f"load average {load} when written")


def provenance_lines(device: str) -> list[str]:
    """Markdown lines: the command that ran, the machine, torch and the date."""
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    command = "python " + " ".join([Path(sys.argv[0]).as_posix()] + sys.argv[1:])
    return [f"Command: `{command}`", "",
            f"Machine: {machine_description(device)}; torch {torch.__version__}; date {stamp}"]


def add_grid_arguments(parser) -> None:
    """The CPU grid shared by the analyses: vocabularies, frames per batch, seeds."""
    parser.add_argument("--vocab-sizes", type=int, nargs="+",
                        default=[500, 2000, 10000, 50000, 100000])
    parser.add_argument("--frames", type=int, nargs="+", default=[2000, 4000])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
