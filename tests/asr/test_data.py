"""Specification of asr.data and asr.cut_filters on a miniature corpus built here."""

import logging
from pathlib import Path
from typing import Dict, List

import pytest
import torch
from lhotse import CutSet, Fbank, FbankConfig, LilcomChunkyWriter

from asr.config import build_section
from asr.cut_filters import TrainingCutFilter, is_alignable, num_adjacent_repeats
from zipformer.encoder import encoder_output_lengths
from asr.config import DataOptions
from asr.data import (
    AsrDataset,
    build_spec_augment,
    build_train_dataloader,
    build_valid_dataloader,
    load_cuts_lazy,
    restore_sampler_state,
    resumable_sampler_state,
)
from asr.tokenizer import CharTokenizer

# 1.5 s -> 150 fbank frames -> 36 encoder frames.
REPEATS_TEXT = "AA BB CC DD EE FF GG"  # 14 tokens, 7 adjacent repeats
CORPUS = {
    # cut id: (duration in seconds, text)
    "too-short": (0.5, "AB"),
    "too-long": (21.0, "AB"),
    "unalignable-tokens": (1.5, "ABCDEFGHIJKLMNOPQRSTUVWXYZABCDEFGHIJK"),  # 37 tokens
    "unalignable-repeats": (1.5, REPEATS_TEXT + " HIJKLMNOPQRSTUVW"),  # 30 tokens + 7 repeats
    "alignable-edge": (1.5, REPEATS_TEXT + " HIJKLMNOPQRSTUV"),  # 29 tokens + 7 repeats = 36
    "utt-a": (1.0, "HELLO WORLD"),
    "utt-b": (1.3, "PRUNED CTC"),
    "utt-c": (1.8, "A SMALL TEST"),
    "utt-d": (2.2, "THE QUICK BROWN FOX"),
    "utt-e": (2.7, "JUMPS OVER"),
    "utt-f": (3.1, "THE LAZY DOG"),
    "utt-g": (3.6, "SPEECH RECOGNITION"),
    "utt-h": (4.0, "ZIPFORMER ENCODER"),
    "utt-i": (4.6, "LHOTSE DATA MODULE"),
}
KEPT = sorted(["alignable-edge"] + [c for c in CORPUS if c.startswith("utt-")])


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory, make_cut_corpus) -> Dict[str, Path]:
    root = tmp_path_factory.mktemp("corpus")
    return make_cut_corpus(root, train=CORPUS, valid={k: CORPUS[k] for k in ("utt-b", "utt-d", "utt-f")})


def options_for(corpus: Dict[str, Path], **overrides) -> DataOptions:
    values = dict(
        train_cuts=str(corpus["train"]), valid_cuts=str(corpus["valid"]), musan_cuts=str(corpus["musan"]),
        max_duration=6.0, num_buckets=2, num_workers=0, drop_last=False,
        enable_musan=False, enable_spec_aug=False,
    )
    values.update(overrides)
    return DataOptions(**values)


def cut_ids_of(batches) -> List[str]:
    return [cut_id for batch in batches for cut_id in batch["cut_ids"]]


def test_cut_ids_are_as_named(corpus: Dict[str, Path]) -> None:
    assert sorted(cut.id for cut in load_cuts_lazy(corpus["train"])) == sorted(CORPUS)


def test_several_manifests_are_interleaved_once_each(corpus: Dict[str, Path], tmp_path: Path) -> None:
    cuts = CutSet.from_cuts(load_cuts_lazy(corpus["train"]))
    first, second = tmp_path / "first.jsonl.gz", tmp_path / "second.jsonl.gz"
    cuts.subset(first=5).to_file(first)
    cuts.subset(last=len(cuts) - 5).to_file(second)
    combined = load_cuts_lazy(f"{first}, {second}", seed=3)
    order = [cut.id for cut in combined]
    assert sorted(order) == sorted(CORPUS)
    assert order == [cut.id for cut in combined]  # the same order on every pass
    with pytest.raises(FileNotFoundError, match="valid_cuts: cut manifest not found: .*missing.jsonl"):
        load_cuts_lazy(f"{first},{tmp_path / 'missing.jsonl'}", "valid_cuts")


def _write_pieces(corpus: Dict[str, Path], folder: Path, count: int) -> List[List[str]]:
    """The training cuts split into ``count`` piece manifests ``cuts.<i>.jsonl.gz``; ids per piece."""
    cuts = CutSet.from_cuts(load_cuts_lazy(corpus["train"]))
    folder.mkdir()
    pieces = [cuts.subset(cut_ids=[c.id for c in cuts][i::count]) for i in range(count)]
    for index, piece in enumerate(pieces):
        piece.to_file(folder / f"cuts.{index}.jsonl.gz")
    return [[c.id for c in piece] for piece in pieces]


def test_a_glob_pattern_reads_every_piece_once_one_piece_after_another(corpus: Dict[str, Path], tmp_path: Path) -> None:
    pieces = _write_pieces(corpus, tmp_path / "split", 12)
    cuts = load_cuts_lazy(str(tmp_path / "split" / "cuts.*.jsonl.gz"), seed=7)
    order = [cut.id for cut in cuts]
    assert sorted(order) == sorted(CORPUS)
    # Whole pieces in a row (never interleaved), in a seeded order that every pass repeats.
    runs = []
    for cut_id in order:
        piece = next(i for i, ids in enumerate(pieces) if cut_id in ids)
        if not runs or runs[-1] != piece:
            runs.append(piece)
    assert sorted(runs) == list(range(12))
    assert order == [cut.id for cut in cuts]
    assert order == [cut.id for cut in load_cuts_lazy(str(tmp_path / "split" / "cuts.*.jsonl.gz"), seed=7)]
    assert runs != list(range(12))  # shuffled, not in file order


def test_a_glob_pattern_mixes_with_plain_manifests_and_skips_empty_pieces(corpus: Dict[str, Path], tmp_path: Path) -> None:
    pieces = _write_pieces(corpus, tmp_path / "split", 3)
    (tmp_path / "split" / "cuts.3.jsonl.gz").write_bytes(b"")
    extra = tmp_path / "extra.jsonl.gz"
    CutSet.from_cuts(load_cuts_lazy(corpus["valid"])).modify_ids(lambda i: f"valid-{i}").to_file(extra)
    order = [cut.id for cut in load_cuts_lazy(f"{tmp_path}/split/cuts.*.jsonl.gz,{extra}", seed=1)]
    assert sorted(order) == sorted([i for ids in pieces for i in ids] + ["valid-utt-b", "valid-utt-d", "valid-utt-f"])


def test_a_glob_pattern_without_matches_is_named(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"train_cuts: no cut manifest matches the pattern .*nothing\.\*\.jsonl\.gz"):
        load_cuts_lazy(str(tmp_path / "nothing.*.jsonl.gz"), "train_cuts")


def test_batches_hold_padded_features_lengths_texts_and_ids(corpus: Dict[str, Path]) -> None:
    loader = build_valid_dataloader(options_for(corpus))
    cuts = {cut.id: cut for cut in load_cuts_lazy(corpus["valid"])}
    batches = list(loader)
    assert sorted(cut_ids_of(batches)) == sorted(cuts)
    for batch in batches:
        features, lens = batch["features"], batch["feature_lens"]
        assert features.dtype == torch.float32 and features.ndim == 3 and features.shape[2] == 80
        assert features.shape[0] == len(batch["texts"]) == len(batch["cut_ids"]) == lens.shape[0]
        assert features.shape[1] == lens.max().item()
        assert lens.tolist() == sorted(lens.tolist(), reverse=True)
        for cut_id, text, length in zip(batch["cut_ids"], batch["texts"], lens.tolist()):
            assert text == CORPUS[cut_id][1]
            assert length == cuts[cut_id].num_frames


def test_train_loader_keeps_filtered_cuts_within_max_duration(corpus: Dict[str, Path]) -> None:
    train = build_train_dataloader(options_for(corpus), CharTokenizer(corpus["tokens"]), encoder_output_lengths)
    train.set_epoch(1)
    batches = list(train.loader)
    assert sorted(cut_ids_of(batches)) == KEPT
    assert all(sum(CORPUS[c][0] for c in b["cut_ids"]) <= 6.0 for b in batches)
    assert train.cut_filter.summary().startswith("cut filter: kept 10 of 14 cuts, dropped 4")
    train.set_epoch(2)
    assert train.cut_filter.kept == train.cut_filter.dropped == 0


def test_filters_drop_exactly_the_expected_cuts_and_report(corpus: Dict[str, Path], caplog) -> None:
    cut_filter = TrainingCutFilter(CharTokenizer(corpus["tokens"]), encoder_output_lengths, min_duration=1.0,
                                   max_duration=20.0)
    kept = [cut.id for cut in load_cuts_lazy(corpus["train"]).filter(cut_filter)]
    assert sorted(kept) == KEPT
    counts = (cut_filter.kept, cut_filter.dropped_too_short, cut_filter.dropped_too_long, cut_filter.dropped_unalignable)
    assert counts == (len(KEPT), 1, 1, 2)
    with caplog.at_level(logging.INFO):
        cut_filter.log_summary()
    assert "kept 10 of 14 cuts, dropped 4 (1 shorter than 1 s, 1 longer than 20 s, 2 with more tokens" in caplog.text


def test_alignability_counts_repeats() -> None:
    assert encoder_output_lengths(150) == 36
    assert encoder_output_lengths(6) == 0
    assert num_adjacent_repeats([3, 3, 4, 3, 3, 3]) == 3
    assert is_alignable(36, [5] * 18)  # 18 tokens + 17 repeats = 35
    assert is_alignable(36, [5] * 18 + [6])  # 36
    assert not is_alignable(36, [5] * 18 + [6, 6])  # 20 + 18 = 38


def test_sampler_ranks_see_disjoint_cuts_that_cover_all(corpus: Dict[str, Path]) -> None:
    tokenizer = CharTokenizer(corpus["tokens"])
    seen = []
    for rank in (0, 1):
        train = build_train_dataloader(options_for(corpus, max_duration=5.0), tokenizer, encoder_output_lengths,
                                       world_size=2, rank=rank)
        train.set_epoch(3)
        seen.append([cut.id for batch in train.sampler for cut in batch])
    assert not set(seen[0]) & set(seen[1])
    assert sorted(seen[0] + seen[1]) == KEPT


def test_ranks_sharing_each_batch_draw_their_share_of_max_duration(corpus: Dict[str, Path]) -> None:
    """data.batch_across_ranks: two ranks each draw batches of at most max_duration / 2
    seconds, disjoint and covering every kept cut; without it each rank fills max_duration."""
    tokenizer = CharTokenizer(corpus["tokens"])

    def rank_batches(across: bool) -> List[List[List[str]]]:
        batches = []
        for rank in (0, 1):
            train = build_train_dataloader(options_for(corpus, max_duration=10.0, batch_across_ranks=across),
                                           tokenizer, encoder_output_lengths, world_size=2, rank=rank)
            train.set_epoch(1)
            batches.append([[cut.id for cut in batch] for batch in train.sampler])
        return batches

    def seconds(batch: List[str]) -> float:
        return sum(CORPUS[cut_id][0] for cut_id in batch)

    shared = rank_batches(across=True)
    assert all(seconds(batch) <= 5.0 for rank in shared for batch in rank)
    ids = [[cut_id for batch in rank for cut_id in batch] for rank in shared]
    assert not set(ids[0]) & set(ids[1]) and sorted(ids[0] + ids[1]) == KEPT
    assert any(seconds(batch) > 5.0 for rank in rank_batches(across=False) for batch in rank)


def test_resumed_sampler_yields_exactly_the_remaining_batches(corpus: Dict[str, Path]) -> None:
    # A worker prefetches batches, so the sampler runs ahead of the training loop.
    options = options_for(corpus, max_duration=5.0, num_workers=1, enable_spec_aug=True, enable_musan=True)
    tokenizer = CharTokenizer(corpus["tokens"])
    uninterrupted = build_train_dataloader(options, tokenizer, encoder_output_lengths)
    uninterrupted.set_epoch(2)
    expected = list(uninterrupted.loader)
    assert len(expected) >= 4

    interrupted = build_train_dataloader(options, tokenizer, encoder_output_lengths)
    interrupted.set_epoch(2)
    iterator = iter(interrupted.loader)
    consumed = [next(iterator), next(iterator)]
    state = resumable_sampler_state(interrupted.sampler, batches_consumed=len(consumed))
    del iterator

    resumed = build_train_dataloader(options, tokenizer, encoder_output_lengths)
    restore_sampler_state(resumed.sampler, state)
    resumed.set_epoch(2)
    remaining = list(resumed.loader)
    assert cut_ids_of(consumed + remaining) == cut_ids_of(expected)
    for got, want in zip(consumed + remaining, expected):
        torch.testing.assert_close(got["features"], want["features"], rtol=0, atol=0)


def test_spec_augment_has_icefall_settings() -> None:
    spec_augment = build_spec_augment(DataOptions())
    settings = spec_augment.state_dict()
    assert settings["time_warp_factor"] == 80
    assert (settings["num_feature_masks"], settings["features_mask_size"]) == (2, 27)
    assert (settings["num_frame_masks"], settings["frames_mask_size"]) == (10, 100)


def _masked_runs(is_masked: torch.Tensor) -> List[int]:
    runs, length = [], 0
    for flag in is_masked.tolist() + [False]:
        if flag:
            length += 1
        elif length:
            runs.append(length)
            length = 0
    return runs


def test_spec_augment_masks_at_most_the_documented_counts_and_sizes() -> None:
    spec_augment = build_spec_augment(DataOptions(spec_aug_time_warp_factor=0))
    spec_augment.p = 1.0  # Lhotse applies it to 90% of utterances by default
    frame_run_counts = []
    for seed in range(3):
        torch.manual_seed(seed)
        features = torch.randn(1, 7000, 80)  # long enough for all 10 frame masks (15% of 7000 > 10 x 100)
        augmented = spec_augment(features)[0]
        mean = features.mean()
        bin_runs = _masked_runs((augmented == mean).all(dim=0))
        frame_runs = _masked_runs((augmented == mean).all(dim=1))
        # Masks may overlap or touch, so check counts and total widths (each mask < size).
        assert len(bin_runs) <= 2 and sum(bin_runs) <= 2 * 26
        assert len(frame_runs) <= 10 and sum(frame_runs) <= 10 * 99
        assert (augmented != features[0]).any()
        frame_run_counts.append(len(frame_runs))
    assert max(frame_run_counts) >= 6


def test_training_augmentation_changes_features_but_validation_does_not(corpus: Dict[str, Path]) -> None:
    cuts = CutSet.from_cuts(c for c in load_cuts_lazy(corpus["train"]) if c.id in ("utt-g", "utt-h", "utt-i"))
    plain = AsrDataset()[cuts]
    reference = torch.stack([torch.from_numpy(c.load_features()[:100]) for c in cuts.sort_by_duration(ascending=False)])
    torch.testing.assert_close(plain["features"][:, :100], reference, atol=0, rtol=0)
    spec_augment = build_spec_augment(DataOptions())
    spec_augment.p = 1.0
    augmented = AsrDataset(spec_augment=spec_augment)[cuts]
    assert augmented["features"].shape == plain["features"].shape
    for index in range(3):
        assert not torch.equal(augmented["features"][index], plain["features"][index])


def test_on_the_fly_features_match_stored_ones(corpus: Dict[str, Path]) -> None:
    cuts = CutSet.from_cuts(c for c in load_cuts_lazy(corpus["train"]) if c.id in ("utt-a", "utt-d"))
    stored = AsrDataset()[cuts]
    computed = AsrDataset(on_the_fly_feats=True)[cuts]
    assert computed["cut_ids"] == stored["cut_ids"]
    assert torch.equal(computed["feature_lens"], stored["feature_lens"])
    # Lilcom storage is lossy: agreement to its precision. The last frame of a shorter
    # utterance differs: batched extraction sees the padding after its end.
    for index, length in enumerate(stored["feature_lens"].tolist()):
        torch.testing.assert_close(
            computed["features"][index, : length - 1], stored["features"][index, : length - 1], atol=0.1, rtol=0
        )


def test_on_the_fly_features_take_the_configured_bin_count(corpus: Dict[str, Path]) -> None:
    cut = next(c for c in load_cuts_lazy(corpus["train"]) if c.id == "utt-d")
    batch = AsrDataset(on_the_fly_feats=True, num_mel_bins=128)[CutSet.from_cuts([cut])]
    expected = torch.from_numpy(cut.compute_features(Fbank(FbankConfig(num_mel_bins=128))))
    assert batch["features"].shape == (1, expected.shape[0], 128)
    torch.testing.assert_close(batch["features"][0], expected, rtol=1e-5, atol=1e-4)
    with pytest.raises(ValueError, match="data.on_the_fly_num_mel_bins must be positive"):
        DataOptions(on_the_fly_num_mel_bins=0)


def test_musan_mixing_changes_features_and_keeps_ids(corpus: Dict[str, Path]) -> None:
    cuts = CutSet.from_cuts(c for c in load_cuts_lazy(corpus["train"]) if c.id in ("utt-c", "utt-e"))
    noise = CutSet.from_cuts(load_cuts_lazy(corpus["musan"]))
    plain = AsrDataset()[cuts]
    mixed = AsrDataset(noise_cuts=noise, musan_prob=1.0, musan_snr=(10.0, 10.0))[cuts]
    assert mixed["cut_ids"] == plain["cut_ids"] and mixed["texts"] == plain["texts"]
    assert torch.equal(mixed["feature_lens"], plain["feature_lens"])
    assert not torch.allclose(mixed["features"], plain["features"])
    never = AsrDataset(noise_cuts=noise, musan_prob=0.0)[cuts]
    torch.testing.assert_close(never["features"], plain["features"])


def test_musan_features_of_another_bin_count_or_without_audio_are_refused(
    corpus: Dict[str, Path], tmp_path: Path
) -> None:
    tokenizer = CharTokenizer(corpus["tokens"])
    noise = CutSet.from_cuts(load_cuts_lazy(corpus["musan"])).drop_features()
    wide = noise.compute_and_store_features(
        extractor=Fbank(FbankConfig(num_mel_bins=128)), storage_path=tmp_path / "feats128",
        storage_type=LilcomChunkyWriter, num_jobs=1,
    )
    wide.to_file(tmp_path / "musan128.jsonl.gz")
    with pytest.raises(ValueError, match=r"musan_cuts: .*musan128.jsonl.gz has 128-bin features but train_cuts "
                                         r".* has 80-bin features; .*--num-mel-bins 80"):
        build_train_dataloader(
            options_for(corpus, enable_musan=True, musan_cuts=str(tmp_path / "musan128.jsonl.gz")),
            tokenizer, encoder_output_lengths,
        )
    # Mixed into the audio (per-chunk features), the bin count does not matter but audio does.
    build_train_dataloader(
        options_for(corpus, enable_musan=True, musan_cuts=str(tmp_path / "musan128.jsonl.gz"),
                    feature_chunk_seconds=2),
        tokenizer, encoder_output_lengths,
    )
    CutSet.from_cuts(load_cuts_lazy(corpus["musan"])).drop_recordings().to_file(tmp_path / "no_audio.jsonl.gz")
    noise.to_file(tmp_path / "no_features.jsonl.gz")
    with pytest.raises(ValueError, match=r"musan_cuts: .*no_audio.jsonl.gz has no audio"):
        build_train_dataloader(
            options_for(corpus, enable_musan=True, musan_cuts=str(tmp_path / "no_audio.jsonl.gz"),
                        feature_chunk_seconds=2),
            tokenizer, encoder_output_lengths,
        )
    with pytest.raises(ValueError, match=r"musan_cuts: .*no_features.jsonl.gz has no features"):
        build_train_dataloader(
            options_for(corpus, enable_musan=True, musan_cuts=str(tmp_path / "no_features.jsonl.gz")),
            tokenizer, encoder_output_lengths,
        )
    # The matching 80-bin noise of the corpus passes.
    build_train_dataloader(options_for(corpus, enable_musan=True), tokenizer, encoder_output_lengths)


def test_missing_manifest_and_unknown_option_are_named(tmp_path: Path, corpus: Dict[str, Path]) -> None:
    with pytest.raises(FileNotFoundError, match="train_cuts: cut manifest not found: .*nope.jsonl.gz"):
        build_train_dataloader(options_for(corpus, train_cuts=str(tmp_path / "nope.jsonl.gz")), CharTokenizer(corpus["tokens"]), encoder_output_lengths)
    with pytest.raises(FileNotFoundError, match="musan_cuts"):
        build_train_dataloader(
            options_for(corpus, enable_musan=True, musan_cuts=str(tmp_path / "musan.jsonl.gz")),
            CharTokenizer(corpus["tokens"]), encoder_output_lengths,
        )
    with pytest.raises(ValueError, match="unknown data option.*max_durration"):
        build_section(DataOptions, {"max_durration": 100}, [], "data")
    with pytest.raises(ValueError, match="musan_prob must be in"):
        DataOptions(musan_prob=1.5)


def test_relative_feature_and_audio_paths_are_found_from_another_directory(make_cut_corpus, tmp_path, monkeypatch):
    """A recipe writes paths relative to its folder; decoding from the repository root
    (the README's commands) must still find the files."""
    import numpy as np
    from lhotse import load_manifest

    from asr.data import load_cuts_lazy

    recipe = tmp_path / "recipe"
    recipe.mkdir()
    corpus = make_cut_corpus(recipe, train={"r-1": (1.1, "HI")}, valid={"r-2": (1.2, "HO")})
    expected = {cut.id: (cut.load_features(), cut.load_audio()) for cut in load_manifest(corpus["train"])}

    def relative(cut):
        cut.features.storage_path = str(Path(cut.features.storage_path).relative_to(recipe))
        for source in cut.recording.sources:
            source.source = str(Path(source.source).relative_to(recipe))
        return cut

    manifest = recipe / "data" / "cuts_relative.jsonl.gz"
    manifest.parent.mkdir()
    load_manifest(corpus["train"]).map(relative).to_file(manifest)
    monkeypatch.chdir(tmp_path)  # elsewhere: the paths are not found as they are
    for cut in load_cuts_lazy(manifest):
        assert not Path(load_manifest(manifest)[0].features.storage_path).exists()
        np.testing.assert_array_equal(cut.load_features(), expected[cut.id][0])
        np.testing.assert_array_equal(cut.load_audio(), expected[cut.id][1])


def test_padded_cuts_with_relative_paths_are_found_from_another_directory(make_cut_corpus, tmp_path, monkeypatch):
    """Cuts padded with Lhotse (MixedCuts: a PaddingCut track before the cut's own) with
    paths relative to the recipe's folder load the same features from elsewhere."""
    import numpy as np
    from lhotse import load_manifest

    from asr.data import SILENCE_FBANK, load_cuts_lazy

    recipe = tmp_path / "recipe"
    recipe.mkdir()
    corpus = make_cut_corpus(recipe, train={"r-1": (1.1, "HI"), "r-3": (0.9, "HA")}, valid={"r-2": (1.2, "HO")})

    def padded(cut):
        return cut.pad(duration=cut.duration + 0.5, direction="left", preserve_id=True, pad_feat_value=SILENCE_FBANK)

    expected = {cut.id: padded(cut).load_features() for cut in load_manifest(corpus["train"])}

    def relative(cut):
        cut.features.storage_path = str(Path(cut.features.storage_path).relative_to(recipe))
        for source in cut.recording.sources:
            source.source = str(Path(source.source).relative_to(recipe))
        return padded(cut)

    manifest = recipe / "data" / "cuts_padded.jsonl.gz"
    manifest.parent.mkdir()
    load_manifest(corpus["train"]).map(relative).to_file(manifest)
    monkeypatch.chdir(tmp_path)
    loaded = list(load_cuts_lazy(manifest))
    assert sorted(cut.id for cut in loaded) == sorted(expected)
    for cut in loaded:
        assert type(cut).__name__ == "MixedCut"
        features = cut.load_features()
        assert np.all(features[:40] == np.float32(SILENCE_FBANK))  # 0.5 s of silence first (10 ms frames)
        np.testing.assert_array_equal(features, expected[cut.id])
