"""benchmarks.beam_sweep: the alignment-beam sweep on synthetic and on real features."""

import gzip
import json
from pathlib import Path


def test_beam_sweep_reaches_the_numerical_floor_at_a_wide_beam(tmp_path, run_program, read_csv):
    run_program("benchmarks.beam_sweep", "--vocab-sizes", "300", "--frames", "400", "--seeds", "0",
                "--beams", "5", "150", "--dim", "32", "--output-dir", str(tmp_path))
    rows = read_csv(tmp_path / "discarded_mass_cpu.csv")
    by_beam = {float(r["beam"]): float(r["max_delta"]) for r in rows}
    assert by_beam[150.0] <= 1e-11 < by_beam[5.0]
    assert "Command: `python -m benchmarks.beam_sweep" in (tmp_path / "results_cpu.md").read_text()


def test_beam_sweep_on_real_features_reads_a_recipes_relative_feature_paths(tmp_path, make_cut_corpus,
                                                                            run_program, read_csv):
    recipe = tmp_path / "recipe"
    recipe.mkdir()
    cuts = {f"utt-{i}": (2.0 + 0.5 * i, text) for i, text in
            enumerate(["HELLO WORLD", "A SMALL TEST", "BEAMS AND LATTICES", "ONE MORE"])}
    corpus = make_cut_corpus(recipe, train=cuts, valid={"v": (1.5, "V")})
    lang_dir = tmp_path / "lang_char"
    lang_dir.mkdir()
    (lang_dir / "tokens.txt").write_text(corpus["tokens"].read_text())
    # As a recipe writes them: feature paths relative to the recipe folder.
    manifest = recipe / "data/fbank/cuts_train.jsonl.gz"
    manifest.parent.mkdir(parents=True)
    with gzip.open(corpus["train"], "rt") as source, gzip.open(manifest, "wt") as target:
        for line in source:
            cut = json.loads(line)
            cut["features"]["storage_path"] = str(Path(cut["features"]["storage_path"]).relative_to(recipe))
            target.write(json.dumps(cut) + "\n")
    output = tmp_path / "out"
    run_program("benchmarks.beam_sweep", "--cuts", str(manifest), "--lang-dir", str(lang_dir), "--preset", "tiny",
                "--seeds", "0", "1", "--beams", "3", "150", "--max-duration", "6", "--output-dir", str(output))
    required = read_csv(output / "required_beam_real_tiny_v29_cpu.csv")
    assert {r["seed"] for r in required} == {"0", "1"}
    assert sum(int(r["utterances"]) for r in required if r["seed"] == "0") == len(cuts)
    by_beam = {}
    for row in read_csv(output / "discarded_mass_real_tiny_v29_cpu.csv"):
        by_beam[float(row["beam"])] = max(by_beam.get(float(row["beam"]), 0.0), float(row["max_delta"]))
    assert by_beam[150.0] <= 1e-11 < by_beam[3.0]
    assert "randomly initialized" in (output / "results_real_tiny_v29_cpu.md").read_text()


def test_beam_sweep_names_the_missing_corpus_and_how_to_make_it(tmp_path, run_program):
    missing = tmp_path / "no_cuts.jsonl.gz"
    completed = run_program("benchmarks.beam_sweep", "--cuts", str(missing), check=False, timeout=120)
    assert completed.returncode != 0
    assert str(missing) in completed.stderr
    assert "cd egs/mini && ./run.sh --stop-stage 3" in completed.stderr
    # The lang dir that recipe builds (egs/mini/conf/data.sh: vocab_size=500).
    assert "egs/mini/data/full/lang_bpe_500" in completed.stderr
