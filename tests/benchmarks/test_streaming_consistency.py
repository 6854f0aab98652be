"""benchmarks.streaming_consistency end to end on a tiny random LLM: FP32 parallel and
cached computation agree (App. E's FP32 condition), the cache stays within its bound."""

import pytest

pytest.importorskip("transformers")


def test_streaming_consistency_fp32_agrees_and_the_cache_is_bounded(tmp_path, run_program, read_csv):
    run_program("benchmarks.streaming_consistency", "--layers", "1", "--width", "64", "--utterances", "2",
                "--min-seconds", "3", "--max-seconds", "7", "--histories", "1", "4", "--prompt-len", "3",
                "--output-dir", str(tmp_path), environment=dict(OMP_NUM_THREADS="1"), timeout=300)
    rows = read_csv(tmp_path / "consistency.csv")
    assert len(rows) == 8  # 4 conditions x 2 histories
    for row in rows:
        if row["dtype"] == "float32":
            assert float(row["relative_logit_error"]) <= 1e-5
            assert float(row["greedy_disagreement"]) == 0
    costs = read_csv(tmp_path / "chunk_costs.csv")
    assert len(costs) == 30
    assert max(int(r["cache_during"]) for r in costs) == 3 + 260
    assert max(int(r["cache_after"]) for r in costs) == 3 + 208
    assert "Command: `python -m benchmarks.streaming_consistency" in (tmp_path / "results.md").read_text()
