"""Out-of-memory configurations of the head-loss grid: their rows, and their time and
memory extrapolated by a least-squares line in V (App. C.2)."""

from __future__ import annotations

EXTRAPOLATED_FIELDS = ("time_s", "peak_extra_mb", "activation_mb")
FIT_POINTS = 4


def extrapolate_linear(vs, ys, v: float) -> float:
    """Least-squares line y = a v + b through (vs, ys), evaluated at v (>= 2 points)."""
    if len(vs) != len(ys) or len(vs) < 2:
        raise ValueError("extrapolate_linear needs at least two (v, y) points")
    mean_v = sum(vs) / len(vs)
    mean_y = sum(ys) / len(ys)
    spread = sum((x - mean_v) ** 2 for x in vs)
    if spread == 0:
        raise ValueError("extrapolate_linear needs at least two distinct v")
    slope = sum((x - mean_v) * (y - mean_y) for x, y in zip(vs, ys)) / spread
    return mean_y + slope * (v - mean_v)


def extrapolate_oom_rows(rows: list[dict]) -> None:
    """Fills the OOM rows' time and memory from the four largest feasible V of their
    (method, M), in place (App. C.2); fewer than two feasible points: left empty."""
    for row in rows:
        if not row["oom"]:
            continue
        feasible = sorted((r for r in rows if not r["oom"] and r["method"] == row["method"]
                           and r["frames"] == row["frames"]),
                          key=lambda r: r["vocab_size"])[-FIT_POINTS:]
        if len({r["vocab_size"] for r in feasible}) < 2:
            continue
        vocab = [r["vocab_size"] for r in feasible]
        for field in EXTRAPOLATED_FIELDS:
            value = extrapolate_linear(vocab, [float(r[field]) for r in feasible],
                                       row["vocab_size"])
            row[field] = round(value, 4 if field == "time_s" else 1)
        row["extrapolated"] = True


def oom_row(method: str, vocab_size: int, num_frames: int, dim: int, chunk_size: int) -> dict:
    """A configuration that ran out of memory, same columns as ``run_single``'s rows."""
    return dict(method=method, vocab_size=vocab_size, frames=num_frames, dim=dim,
                chunk_size=chunk_size if method != "standard" else "", selected_classes="",
                time_s="", times_s="", peak_extra_mb="", forward_extra_mb="",
                activation_mb="", gradient_mb="", load_start="", load_end="", oom=True,
                extrapolated=False)
