"""benchmarks.numerical_accuracy: on a tiny grid, Pruned CTC's errors against the dense
FP64 reference stay within the library's tolerances."""


def test_numerical_accuracy_meets_the_library_tolerances(tmp_path, run_program, read_csv):
    run_program("benchmarks.numerical_accuracy", "--vocab-sizes", "300", "--frames", "400", "--seeds", "0",
                "--precision-vocab", "50", "--precision-frames", "400", "--dim", "32",
                "--bias-scales", "0", "0.5", "--output-dir", str(tmp_path))
    (row,) = read_csv(tmp_path / "accuracy_grid.csv")
    assert float(row["loss_error"]) <= 1e-6
    assert float(row["input_grad_error"]) <= 1e-5
    assert float(row["selected_weight_grad_error"]) <= 1e-4
    precision_rows = read_csv(tmp_path / "precision_table.csv")
    assert len(precision_rows) == 10
    assert {r["bias_scale"] for r in precision_rows} == {"0.0", "0.5"}
