"""local.train_bpe, local.prepare_char, local.tokens: token tables in icefall's format."""

from __future__ import annotations

import random

import pytest

from local.prepare_char import char_table
from local.tokens import read_tokens, write_tokens
from local.train_bpe import train_bpe


def _write_text(lang_dir, lines):
    lang_dir.mkdir(parents=True, exist_ok=True)
    (lang_dir / "transcript_words.txt").write_text("".join(line + "\n" for line in lines))


def _english_lines(count, seed=0):
    from local.sentence_grammar import english_sentences

    return [s.upper() for s in english_sentences(count, random.Random(seed))]


@pytest.mark.parametrize("model_type", ["unigram", "bpe"])
def test_bpe_model_has_special_ids_and_round_trips(tmp_path, model_type):
    lines = _english_lines(2000)
    _write_text(tmp_path, lines)
    model = train_bpe(tmp_path, [], vocab_size=200, model_type=model_type, hard_vocab_limit=True)
    import sentencepiece as spm

    processor = spm.SentencePieceProcessor(model_file=str(model))
    table = read_tokens(tmp_path / "tokens.txt")
    assert len(table) == processor.get_piece_size() == 200
    assert (table["<blk>"], table["<sos/eos>"], table["<unk>"]) == (0, 1, 2)
    assert all(table[processor.id_to_piece(i)] == i for i in range(200))
    assert (tmp_path / f"{model_type}_200.model").is_file()
    for line in lines[:200]:
        ids = processor.encode(line)
        assert min(ids) > 2 and processor.decode(ids) == line


def test_vocabulary_larger_than_the_text_allows_gives_fewer_pieces_or_a_clear_error(tmp_path):
    _write_text(tmp_path / "soft", _english_lines(300))
    train_bpe(tmp_path / "soft", [], vocab_size=180_000)
    pieces = len(read_tokens(tmp_path / "soft" / "tokens.txt"))
    assert 50 < pieces < 180_000
    _write_text(tmp_path / "hard", _english_lines(300))
    with pytest.raises(RuntimeError, match="Vocabulary size too high"):
        train_bpe(tmp_path / "hard", [], vocab_size=180_000, hard_vocab_limit=True)


@pytest.mark.slow
def test_180000_piece_unigram_model_on_enough_text(tmp_path):
    rng = random.Random(0)
    words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(5, 9))) for _ in range(300_000)]
    _write_text(tmp_path, (" ".join(rng.choice(words) for _ in range(10)).upper() for _ in range(150_000)))
    train_bpe(tmp_path, [], vocab_size=180_000, hard_vocab_limit=True)
    table = read_tokens(tmp_path / "tokens.txt")
    assert len(table) == 180_000 and table["<unk>"] == 2


def test_bpe_rerun_does_nothing(tmp_path):
    _write_text(tmp_path, _english_lines(500))
    model = train_bpe(tmp_path, [], vocab_size=100)
    stamp = model.stat().st_mtime_ns
    train_bpe(tmp_path, [], vocab_size=100)
    assert model.stat().st_mtime_ns == stamp


def test_char_table_puts_specials_first_then_sorted_characters():
    assert char_table(["今天 天气", "很好", "今天"]) == ["<blk>", "<sos/eos>", "<unk>", "今", "天", "好", "很", "气"]


def test_tokens_file_round_trip_and_bad_lines(tmp_path):
    path = write_tokens(["<blk>", "<sos/eos>", "<unk>", "a"], tmp_path / "tokens.txt")
    assert path.read_text() == "<blk> 0\n<sos/eos> 1\n<unk> 2\na 3\n"
    assert read_tokens(path) == {"<blk>": 0, "<sos/eos>": 1, "<unk>": 2, "a": 3}
    path.write_text("<blk> 0\nbroken\n")
    with pytest.raises(ValueError, match="tokens.txt:2: expected '<symbol> <id>'"):
        read_tokens(path)
    with pytest.raises(ValueError, match="not unique"):
        write_tokens(["a", "a"], tmp_path / "t2.txt")
