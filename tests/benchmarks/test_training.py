"""benchmarks.training: training throughput of a recipe preset, each loss in a fresh process."""

import dataclasses
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def test_training_benchmark_times_the_presets_model_with_each_loss(tmp_path, run_program, read_csv):
    from asr.config import load_run_config
    from zipformer.model import CTCModel

    preset = REPO / "egs/mini/conf/train.yaml"
    overrides = ["model.preset=tiny", "data.max_duration=6"]
    run_program("benchmarks.training", "--config", str(preset), "--threads", "1", "--warmup", "1", "--steps", "2",
                "--vocab-size", "40", "--output-dir", str(tmp_path), *overrides)
    rows = {r["ctc_loss"]: r for r in read_csv(tmp_path / "training_cpu.csv")}
    assert set(rows) == {"pruned", "standard"}
    config = load_run_config(preset, overrides)
    expected_params = CTCModel(dataclasses.replace(config.model, vocab_size=40, blank_id=0)).num_parameters()
    for row in rows.values():
        assert int(row["threads"]) == 1 and int(row["params"]) == expected_params
        audio_per_batch = float(row["audio_s_per_batch"])
        assert 2.0 <= audio_per_batch <= 6.0  # utterances of 2-4 s, batches up to max_duration
        assert float(row["audio_s_per_s"]) == pytest.approx(
            float(row["batches_per_s"]) * audio_per_batch, rel=0.02)
        assert 0 < float(row["peak_rss_after_warmup_mib"]) <= float(row["peak_rss_mib"])
        assert float(row["cpu_s_per_step"]) > 0
    report = (tmp_path / "training_cpu.md").read_text()
    assert "Command: `python -m benchmarks.training" in report and "Load average" in report
    assert "`egs/mini/conf/train.yaml` with model.preset=tiny data.max_duration=6" in report
