"""local.atomic_io: outputs appear whole or not at all."""

import pytest

from asr.atomic_io import atomic_output, temporary_name


def test_temporary_name_keeps_folder_and_suffixes(tmp_path):
    assert temporary_name(tmp_path / "x_cuts.jsonl.gz") == tmp_path / "x_cuts.partial.jsonl.gz"


def test_output_is_renamed_into_place_on_success(tmp_path):
    final = tmp_path / "sub" / "m.jsonl.gz"
    with atomic_output(final) as partial:
        partial.write_text("done")
        assert not final.exists()
    assert final.read_text() == "done" and not partial.exists()


def test_failure_leaves_neither_output_nor_partial_file(tmp_path):
    final = tmp_path / "m.jsonl.gz"
    with pytest.raises(KeyboardInterrupt):
        with atomic_output(final) as partial:
            partial.write_text("half")
            raise KeyboardInterrupt
    assert list(tmp_path.iterdir()) == []


def test_a_writer_that_writes_nothing_is_an_error(tmp_path):
    with pytest.raises(RuntimeError, match="produced no file"):
        with atomic_output(tmp_path / "m.txt"):
            pass
