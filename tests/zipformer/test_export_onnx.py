"""zipformer.export_onnx: the exported graph against PyTorch, sherpa-onnx against our greedy
search, the token-table checks, and the export-friendly relative-position indexing."""

from pathlib import Path

import numpy as np
import pytest
import torch

from zipformer.attention import relative_to_absolute, relative_to_absolute_by_reshape
from zipformer.export_onnx import (
    BLANK_SYMBOLS, CHECK_FRAMES, CTCLogProbs, check_against_pytorch, example_inputs, export_graph, export_model,
    main as export_main, onnx_log_probs, read_token_table)
from zipformer.model import CTCModel
from zipformer.presets import get_preset
from asr.search import ctc_greedy_search

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

TOLERANCE = 1e-3  # max abs difference of log-probs, onnxruntime vs PyTorch


def tiny_model(seed: int = 0) -> CTCModel:
    """Random weights; with V = 500 the head already emits a token every few frames."""
    torch.manual_seed(seed)
    return CTCModel(get_preset("tiny")).eval()


def piece_table(vocab_size: int, blank: str = "<blk>"):
    """A BPE-like table: pieces with and without the word-start mark."""
    symbols = [blank, "<sos/eos>", "<unk>"] + [
        ("\u2581" if i % 3 == 0 else "") + f"p{i}" for i in range(3, vocab_size)]
    return [(symbol, index) for index, symbol in enumerate(symbols)]


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    model = tiny_model()
    paths = export_model(model, piece_table(model.config.vocab_size), tmp_path_factory.mktemp("onnx"))
    return model, paths


def relative_to_absolute_by_definition(scores: torch.Tensor) -> torch.Tensor:
    frames = scores.shape[-2]
    out = torch.empty(*scores.shape[:-1], frames, dtype=scores.dtype)
    for i in range(frames):
        for j in range(frames):
            out[..., i, j] = scores[..., i, frames - 1 - i + j]
    return out


@pytest.mark.parametrize("function", [relative_to_absolute, relative_to_absolute_by_reshape])
@pytest.mark.parametrize("frames", [1, 2, 3, 8, 25])
def test_relative_to_absolute_reads_column_t_minus_1_minus_i_plus_j(function, frames):
    scores = torch.randn(2, 3, frames, 2 * frames - 1, dtype=torch.float64)
    assert torch.equal(function(scores), relative_to_absolute_by_definition(scores))


@pytest.mark.parametrize("function", [relative_to_absolute, relative_to_absolute_by_reshape])
def test_relative_to_absolute_gradient_reaches_only_the_read_columns(function):
    frames = 5
    scores = torch.randn(frames, 2 * frames - 1, dtype=torch.float64, requires_grad=True)
    weights = torch.randn(frames, frames, dtype=torch.float64)
    (function(scores) * weights).sum().backward()
    expected = torch.zeros(frames, 2 * frames - 1, dtype=torch.float64)
    for i in range(frames):
        for j in range(frames):
            expected[i, frames - 1 - i + j] += weights[i, j]
    assert torch.equal(scores.grad, expected)


def test_tracing_takes_the_reshape_form():
    scores = torch.randn(2, 4, 7)
    graph = torch.jit.trace(relative_to_absolute, (scores,)).graph
    kinds = {node.kind() for node in graph.nodes()}
    assert "aten::as_strided" not in kinds and "aten::pad" in kinds


def _compare(model, model_path, features, lengths):
    with torch.no_grad():
        expected, expected_lens = CTCLogProbs(model)(features, lengths)
    got, got_lens = onnx_log_probs(model_path, features, lengths)
    assert got.dtype == torch.float32 and got_lens.dtype == torch.int64
    assert torch.equal(got_lens, expected_lens)
    assert got.shape == expected.shape
    worst = max((got[i, :n] - expected[i, :n]).abs().max().item() for i, n in enumerate(expected_lens))
    assert worst <= TOLERANCE
    ours = ctc_greedy_search(expected, expected_lens, blank_id=0)
    assert ctc_greedy_search(got, got_lens, blank_id=0) == ours
    assert sum(map(len, ours)) > 0  # the head emits tokens: the comparison means something


@pytest.mark.parametrize("frames", [9, 10, 11, 57, 400, 3000])  # every residue mod 4
def test_onnxruntime_log_probs_match_pytorch_on_one_utterance(exported, frames):
    model, paths = exported
    features = torch.randn(1, frames, 80, generator=torch.Generator().manual_seed(frames))
    _compare(model, paths["model"], features, torch.tensor([frames]))


@pytest.mark.parametrize("frames", [9, 130, 1500])
def test_onnxruntime_log_probs_match_pytorch_on_a_padded_batch(exported, frames):
    model, paths = exported
    features = torch.randn(3, frames, 80, generator=torch.Generator().manual_seed(frames))
    _compare(model, paths["model"], features, torch.tensor([max(9, frames // 3), frames, 9]))


def test_graph_has_sherpa_onnx_inputs_outputs_and_metadata(exported):
    model, paths = exported
    graph = onnx.load(str(paths["model"]))
    shapes = {value.name: [d.dim_param or d.dim_value for d in value.type.tensor_type.shape.dim]
              for value in list(graph.graph.input) + list(graph.graph.output)}
    assert [value.name for value in graph.graph.input] == ["x", "x_lens"]
    assert [value.name for value in graph.graph.output] == ["log_probs", "log_probs_len"]
    assert isinstance(shapes["x"][0], str) and isinstance(shapes["x"][1], str) and shapes["x"][2] == 80
    assert isinstance(shapes["log_probs"][1], str) and shapes["log_probs"][2] == model.config.vocab_size
    metadata = {prop.key: prop.value for prop in graph.metadata_props}
    assert metadata["model_type"] == "zipformer2_ctc"
    assert {"version", "model_author", "comment"} <= metadata.keys()


def test_int8_model_quantizes_the_matmuls_and_keeps_the_contract(exported):
    model, paths = exported
    graph = onnx.load(str(paths["int8"]))
    operators = {node.op_type for node in graph.graph.node}
    assert "MatMulInteger" in operators or "DynamicQuantizeMatMul" in operators
    assert paths["int8"].stat().st_size < 0.75 * paths["model"].stat().st_size  # convolutions stay float
    assert {prop.key: prop.value for prop in graph.metadata_props}["model_type"] == "zipformer2_ctc"
    features = torch.randn(2, 200, 80, generator=torch.Generator().manual_seed(1))
    lengths = torch.tensor([200, 150])
    got, got_lens = onnx_log_probs(paths["int8"], features, lengths)
    with torch.no_grad():
        expected, expected_lens = model.log_probs(features, lengths)
    assert torch.equal(got_lens, expected_lens) and got.shape == expected.shape


def test_tokens_txt_is_the_checked_table(exported):
    model, paths = exported
    assert read_token_table(paths["tokens"]) == piece_table(model.config.vocab_size)


@pytest.mark.parametrize("blank", BLANK_SYMBOLS)
def test_every_blank_name_sherpa_knows_is_accepted(tmp_path, blank):
    model = tiny_model()
    paths = export_model(model, piece_table(model.config.vocab_size, blank), tmp_path, int8=False)
    assert read_token_table(paths["tokens"])[0] == (blank, 0)


def test_a_table_without_a_blank_sherpa_knows_is_refused_before_writing(tmp_path):
    model = tiny_model()
    with pytest.raises(ValueError, match=r"blank \(id 0\) is '<b>'.*<blk>, <eps>, <blank>.*none of them"):
        export_model(model, piece_table(model.config.vocab_size, "<b>"), tmp_path / "out", token_source="t.txt")
    assert not (tmp_path / "out").exists()


def test_a_blank_name_sherpa_finds_first_on_another_id_is_refused(tmp_path):
    model = tiny_model()
    table = piece_table(model.config.vocab_size, "<eps>")
    table[5] = ("<blk>", 5)  # sherpa-onnx would take id 5 as the blank
    with pytest.raises(ValueError, match=r"'<blk>' has id 5"):
        export_model(model, table, tmp_path, token_source="t.txt")


def test_a_table_of_the_wrong_size_is_refused(tmp_path):
    model = tiny_model()
    with pytest.raises(ValueError, match="expected one symbol for each id 0..499"):
        export_model(model, piece_table(model.config.vocab_size)[:-1], tmp_path, token_source="t.txt")


def test_command_exports_a_training_checkpoint(tmp_path):
    model = tiny_model(seed=3)
    lang_dir = tmp_path / "lang"
    lang_dir.mkdir()
    table = piece_table(model.config.vocab_size)
    (lang_dir / "tokens.txt").write_text("".join(f"{s} {i}\n" for s, i in table), encoding="utf-8")
    checkpoint = tmp_path / "epoch-1.pt"
    torch.save({"model": model.state_dict(), "config": {"model": model.config.to_dict(),
                                                         "train": {"lang_dir": str(lang_dir)}}}, checkpoint)
    paths = export_main(["--checkpoint", str(checkpoint), "--int8", "false", "--comment", "unit test"])
    assert paths["model"] == tmp_path / "onnx-epoch-1" / "model.onnx"
    assert read_token_table(paths["tokens"]) == table
    features = torch.randn(1, 100, 80, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        expected, _ = model.log_probs(features, torch.tensor([100]))
    got, _ = onnx_log_probs(paths["model"], features, torch.tensor([100]))
    assert (got - expected).abs().max().item() <= TOLERANCE


def test_command_names_a_missing_checkpoint(tmp_path):
    with pytest.raises(SystemExit, match="--checkpoint: file not found"):
        export_main(["--checkpoint", str(tmp_path / "nope.pt")])


def test_check_frames_cover_every_length_class_of_the_two_halvings():
    assert sorted(frames % 4 for frames in CHECK_FRAMES) == [0, 1, 2, 3]


def export_with_the_example_length_fixed(model, path):
    """A TorchScript graph with T fixed to the example's: it serves that length only."""
    with torch.no_grad():
        torch.onnx.export(CTCLogProbs(model).eval(), example_inputs(model.config.feature_dim), str(path),
                          dynamo=False, opset_version=13, input_names=["x", "x_lens"],
                          output_names=["log_probs", "log_probs_len"], dynamic_axes={"x": {0: "N"}})


def test_a_graph_that_serves_only_some_lengths_is_refused_and_deleted(tmp_path, monkeypatch):
    model = tiny_model()
    monkeypatch.setattr("zipformer.export_onnx.export_graph",
                        lambda model, path, exporter, opset: export_with_the_example_length_fixed(model, path))
    with pytest.raises(RuntimeError, match=r"fails on a batch of T = 120 frames.*does not serve every input length"):
        export_model(model, piece_table(model.config.vocab_size), tmp_path)
    assert not (tmp_path / "model.onnx").exists() and not (tmp_path / "tokens.txt").exists()


def test_the_default_graph_passes_the_length_check(exported):
    model, paths = exported
    assert check_against_pytorch(model, paths["model"]) <= TOLERANCE


@pytest.mark.slow
def test_dynamo_exporter_gives_the_same_log_probs_at_every_length(tmp_path):
    model = tiny_model()
    paths = export_model(model, piece_table(model.config.vocab_size), tmp_path, exporter="dynamo", int8=False)
    for frames in (9, 10, 700, 701):
        features = torch.randn(2, frames, 80, generator=torch.Generator().manual_seed(frames))
        _compare(model, paths["model"], features, torch.tensor([frames, 9]))
