"""Specification of asr.tokenizer: BPE and char lexicons behind one interface."""

from pathlib import Path

import pytest

from asr.tokenizer import BpeTokenizer, CharTokenizer, Tokenizer, load_tokenizer

SENTENCES = [
    "THE QUICK BROWN FOX JUMPS OVER THE LAZY DOG",
    "A SMALL CORPUS FOR A SMALL TOKENIZER",
    "SPEECH RECOGNITION WITH PRUNED CTC",
    "HELLO WORLD THIS IS A TEST",
] * 20


@pytest.fixture(scope="module")
def bpe_lang_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import sentencepiece

    lang_dir = tmp_path_factory.mktemp("lang_bpe_40")
    transcript = lang_dir / "transcript_words.txt"
    transcript.write_text("\n".join(SENTENCES) + "\n")
    sentencepiece.SentencePieceTrainer.train(
        input=str(transcript),
        model_prefix=str(lang_dir / "unigram_40"),
        model_type="unigram",
        vocab_size=40,
        character_coverage=1.0,
        user_defined_symbols=["<blk>", "<sos/eos>"],
        unk_id=2,
        bos_id=-1,
        eos_id=-1,
        minloglevel=2,
    )
    (lang_dir / "unigram_40.model").rename(lang_dir / "bpe.model")
    # A BPE lang dir also has a tokens.txt: the model must win over it.
    (lang_dir / "tokens.txt").write_text("<blk> 0\n<sos/eos> 1\n<unk> 2\nX 3\n")
    return lang_dir


@pytest.fixture()
def char_lang_dir(tmp_path: Path) -> Path:
    lang_dir = tmp_path / "lang_char"
    lang_dir.mkdir()
    lines = ["<blk> 0", "<sos/eos> 1", "<unk> 2", "你 3", "好 4", "世 5", "界 6", "#0 7"]
    (lang_dir / "tokens.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return lang_dir


def test_lang_dir_with_bpe_model_gives_bpe_tokenizer(bpe_lang_dir: Path) -> None:
    tokenizer = load_tokenizer(bpe_lang_dir)
    assert isinstance(tokenizer, BpeTokenizer)
    assert isinstance(tokenizer, Tokenizer)
    assert tokenizer.vocab_size == 40
    assert tokenizer.blank_id == 0


def test_bpe_round_trip_and_special_ids(bpe_lang_dir: Path) -> None:
    tokenizer = load_tokenizer(bpe_lang_dir)
    ids = tokenizer.encode(["HELLO WORLD", "THE LAZY DOG"])
    assert len(ids) == 2
    assert all(0 < i < tokenizer.vocab_size for seq in ids for i in seq)
    assert all(i not in (0, 1) for seq in ids for i in seq)
    assert tokenizer.decode(ids[0]) == "HELLO WORLD"
    # Blanks and <sos/eos> in a hypothesis are not text.
    assert tokenizer.decode([0] + ids[1] + [1, 0]) == "THE LAZY DOG"
    assert tokenizer.decode_batch(ids) == ["HELLO WORLD", "THE LAZY DOG"]


def test_bpe_unknown_characters_map_to_unk(bpe_lang_dir: Path) -> None:
    tokenizer = load_tokenizer(bpe_lang_dir)
    assert 2 in tokenizer.encode(["Q@Z"])[0]


def test_char_table_splits_characters_and_drops_spaces(char_lang_dir: Path) -> None:
    tokenizer = load_tokenizer(char_lang_dir)
    assert isinstance(tokenizer, CharTokenizer)
    assert tokenizer.encode(["你好 世界", "好吗"]) == [[3, 4, 5, 6], [4, 2]]
    assert tokenizer.decode([0, 3, 4, 0, 1, 5, 6]) == "你好世界"


def test_char_table_ignores_disambiguation_symbols_in_vocab(char_lang_dir: Path) -> None:
    tokenizer = load_tokenizer(char_lang_dir)
    assert tokenizer.vocab_size == 7
    assert tokenizer.blank_id == 0


def test_missing_files_are_named(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="bpe.model.*tokens.txt"):
        load_tokenizer(tmp_path)
    with pytest.raises(FileNotFoundError, match=str(tmp_path / "nope.model")):
        BpeTokenizer(tmp_path / "nope.model")
    with pytest.raises(FileNotFoundError, match="tokens.txt"):
        CharTokenizer(tmp_path / "tokens.txt")


def test_malformed_char_table_names_line(tmp_path: Path) -> None:
    table = tmp_path / "tokens.txt"
    table.write_text("<blk> 0\n<unk> two\n")
    with pytest.raises(ValueError, match=r"tokens.txt:2"):
        CharTokenizer(table)


def test_char_table_without_blank_is_rejected(tmp_path: Path) -> None:
    table = tmp_path / "tokens.txt"
    table.write_text("<unk> 0\na 1\n")
    with pytest.raises(ValueError, match="<blk>"):
        CharTokenizer(table)


def test_out_of_range_id_is_reported(char_lang_dir: Path) -> None:
    with pytest.raises(ValueError, match="token id 99 out of range"):
        load_tokenizer(char_lang_dir).decode([3, 99])


def test_single_string_is_rejected(char_lang_dir: Path) -> None:
    with pytest.raises(TypeError, match="list of texts"):
        load_tokenizer(char_lang_dir).encode("你好")
