"""benchmarks.head_products: the block schedules it times compute the same products as
single GEMMs (checked against float64), and the program writes its results."""

import pytest
import torch

from benchmarks.head_products.__main__ import frozen_products, trained_products


def reference(frames: torch.Tensor, weight: torch.Tensor):
    logits = frames.double() @ weight.double().t()
    return logits, logits @ weight.double(), logits.t() @ frames.double()


@pytest.mark.parametrize("block_rows", [1, 7, 30, 64])
def test_row_blocks_compute_the_three_products_of_a_trained_head(block_rows):
    generator = torch.Generator().manual_seed(0)
    frames, weight = torch.randn(30, 16, generator=generator), torch.randn(50, 16, generator=generator)
    logits, grad_frames, grad_weight = reference(frames, weight)
    schedules = trained_products(frames, weight, min(block_rows, 30))
    single, blocks = schedules["single"](), schedules["row_blocks"]()
    torch.testing.assert_close(single[0].double(), logits, rtol=1e-5, atol=1e-4)
    for computed in (single, blocks):
        torch.testing.assert_close(computed[1].double(), grad_frames, rtol=1e-5, atol=1e-3)
        torch.testing.assert_close(computed[2].double(), grad_weight, rtol=1e-5, atol=1e-3)


@pytest.mark.parametrize("chunk_size", [1, 8, 50, 4096])
def test_column_chunks_compute_the_two_products_of_a_frozen_head(chunk_size):
    generator = torch.Generator().manual_seed(1)
    frames, weight = torch.randn(20, 12, generator=generator), torch.randn(50, 12, generator=generator)
    _, grad_frames, _ = reference(frames, weight)
    schedules = frozen_products(frames, weight, chunk_size)
    for name in ("single", "column_chunks"):
        torch.testing.assert_close(schedules[name]()[1].double(), grad_frames, rtol=1e-5, atol=1e-3)
        torch.testing.assert_close(schedules[name]()[1].double(), grad_frames, rtol=1e-5, atol=1e-3)  # reruns alike


def test_the_program_writes_times_and_the_floor_ratio(tmp_path, run_program, read_csv):
    run_program("benchmarks.head_products", "--frames", "64", "--vocab-sizes", "300", "--dim", "16", "--runs", "1",
                "--standard-seconds", "300=2.0", "--output-dir", str(tmp_path))
    row, = read_csv(tmp_path / "products.csv")
    assert int(row["vocab_size"]) == 300 and float(row["single_s"]) > 0 and float(row["row_blocks_s"]) > 0
    assert float(row["floor_ratio"]) == pytest.approx(float(row["single_s"]) / 2.0, abs=1e-3)
    assert "Command: `python -m benchmarks.head_products" in (tmp_path / "products.md").read_text()


def test_a_malformed_standard_time_is_named(tmp_path, run_program):
    completed = run_program("benchmarks.head_products", "--frames", "8", "--vocab-sizes", "30", "--dim", "4",
                            "--standard-seconds", "300:2.0", "--output-dir", str(tmp_path), check=False)
    assert completed.returncode != 0 and "--standard-seconds takes V=SECONDS" in completed.stderr
