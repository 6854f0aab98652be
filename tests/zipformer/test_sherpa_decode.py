"""zipformer.sherpa_decode: sherpa-onnx on an exported model decodes what our greedy search
decodes from the same audio (our features: lhotse fbank; sherpa's: kaldi-native-fbank)."""

import ast
from pathlib import Path

import numpy as np
import pytest
import torch
from lhotse import Fbank, FbankConfig, load_manifest

from local.espeak_tts import EspeakSynthesizer, Voice
from zipformer.export_onnx import export_model, read_token_table
from zipformer.model import CTCModel
from zipformer.presets import get_preset
from asr.search import ctc_greedy_search

pytest.importorskip("onnxruntime")
sherpa_decode = pytest.importorskip("zipformer.sherpa_decode")
pytest.importorskip("sherpa_onnx")

SENTENCES = [
    ("the quick brown fox jumps over the lazy dog", Voice("en-us", rate=160)),
    ("she sells sea shells by the sea shore", Voice("en-us+f3", rate=140, pitch=60)),
    ("a few more words for the third test", Voice("en-gb-scotland+m3", rate=180, pitch=35)),
    ("four", Voice("en-us+m1", rate=150)),
]


def our_greedy_symbols(model, table, waves):
    """Our pipeline: lhotse fbank -> PyTorch log-probs -> greedy search -> token symbols."""
    symbols = dict((index, symbol) for symbol, index in table)
    outputs = []
    for wave in waves:
        features = torch.from_numpy(Fbank(FbankConfig(num_mel_bins=80)).extract(wave, 16000))[None]
        with torch.no_grad():
            log_probs, lengths = model.log_probs(features, torch.tensor([features.shape[1]]))
        outputs.append([symbols[i] for i in ctc_greedy_search(log_probs, lengths, blank_id=0)[0]])
    return outputs


def sherpa_text(symbols):
    """sherpa-onnx's text of a token sequence: pieces joined, the word mark a space, stripped."""
    return "".join(symbols).replace("\u2581", " ").strip()


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    torch.manual_seed(0)
    model = CTCModel(get_preset("tiny")).eval()
    symbols = ["<blk>", "<sos/eos>", "<unk>"] + [
        ("\u2581" if i % 3 == 0 else "") + f"p{i}" for i in range(3, model.config.vocab_size)]
    table = [(symbol, index) for index, symbol in enumerate(symbols)]
    paths = export_model(model, table, tmp_path_factory.mktemp("onnx"))
    return model, table, paths


@pytest.fixture(scope="module")
def waves():
    synthesizer = EspeakSynthesizer()
    return [synthesizer.synthesize(text, voice) for text, voice in SENTENCES]


def test_sherpa_onnx_tokens_equal_our_greedy_search(exported, waves):
    model, table, paths = exported
    recognizer = sherpa_decode.make_recognizer(paths["model"], paths["tokens"])
    ours = our_greedy_symbols(model, table, waves)
    theirs = [sherpa_decode.recognize(recognizer, [wave], 16000)[0] for wave in waves]
    # sherpa-onnx reports each token with the word mark already turned into a space.
    assert [tokens for _, tokens in theirs] == [[s.replace("\u2581", " ") for s in symbols] for symbols in ours]
    assert [text for text, _ in theirs] == [sherpa_text(symbols) for symbols in ours]
    assert all(len(symbols) > 3 for symbols in ours)


def test_a_batch_decodes_as_one_utterance_at_a_time(exported, waves):
    _, _, paths = exported
    recognizer = sherpa_decode.make_recognizer(paths["model"], paths["tokens"])
    one_by_one = [sherpa_decode.recognize(recognizer, [wave], 16000)[0] for wave in waves]
    assert sherpa_decode.recognize(recognizer, waves, 16000) == one_by_one


def test_command_writes_scored_files_of_sherpa_hypotheses(tmp_path, make_cut_corpus):
    torch.manual_seed(1)
    model = CTCModel(get_preset("tiny", vocab_size=29)).eval()
    (tmp_path / "corpus").mkdir()
    corpus = make_cut_corpus(tmp_path / "corpus", train={"t1": (1.0, "A")},
                             valid={"v1": (1.5, "AB C"), "v2": (2.0, "HELLO"), "v3": (1.2, "X Y")})
    table = read_token_table(corpus["tokens"])
    paths = export_model(model, table, tmp_path / "onnx", int8=False)
    summary = sherpa_decode.main(["--model", str(paths["model"]), "--test-cuts", f"dev={corpus['valid']}",
                                  "--batch-size", "2"])
    cuts = sorted(load_manifest(corpus["valid"]), key=lambda cut: cut.id)
    expected = [sherpa_text(symbols).split() for symbols in
                our_greedy_symbols(model, table, [cut.load_audio()[0] for cut in cuts])]
    recogs = (tmp_path / "onnx" / "recogs-dev-sherpa-onnx-greedy-search-model.txt").read_text().splitlines()
    hyps = [ast.literal_eval(line.split("hyp=", 1)[1]) for line in recogs if "\thyp=" in line]
    refs = [ast.literal_eval(line.split("ref=", 1)[1]) for line in recogs if "\tref=" in line]
    assert hyps == expected and refs == [["AB", "C"], ["HELLO"], ["X", "Y"]]
    wer = (tmp_path / "onnx" / "wer-summary-dev-model.txt").read_text()
    assert f"sherpa-onnx-greedy-search\t{summary['dev']['wer']}" in wer
    assert summary["dev"]["rtf"] > 0


def test_command_names_a_missing_model(tmp_path):
    with pytest.raises(SystemExit, match="--model: file not found"):
        sherpa_decode.main(["--model", str(tmp_path / "model.onnx"), "--tokens", str(tmp_path / "t.txt"),
                            "--test-cuts", str(tmp_path / "cuts.jsonl.gz")])


def test_sherpa_onnx_ends_the_process_without_a_blank_symbol(exported, tmp_path):
    """Why export_model refuses such tables: sherpa-onnx exits instead of raising."""
    import subprocess
    import sys

    _, table, paths = exported
    tokens = tmp_path / "tokens.txt"
    tokens.write_text("".join(f"{'<b>' if i == 0 else s} {i}\n" for s, i in table), encoding="utf-8")
    program = ("import sys; from zipformer.sherpa_decode import make_recognizer; "
               f"make_recognizer({str(paths['model'])!r}, {str(tokens)!r}); print('loaded')")
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120,
                          cwd=str(Path(__file__).resolve().parents[2]))
    assert done.returncode != 0 and "loaded" not in done.stdout
    assert "<blk> or <eps> or <blank>" in done.stderr + done.stdout
