"""Per-chunk features for streaming models (asr.chunk_features, AsrDataset with
chunk_seconds; paper App. D.4): each chunk's fbank from its own samples, nothing outside
the chunk in it, SpecAugment per chunk, seeded as the whole-cut path."""

from pathlib import Path
from typing import Dict, List

import numpy as np
import pytest
import soundfile
import torch
from lhotse import CutSet, Fbank, FbankConfig, Recording

from asr.chunk_features import ChunkFbank, PerChunkFeatures, chunk_frame_count
from asr.config import DataOptions
from asr.data import AsrDataset, build_spec_augment, load_cuts_lazy
from references.kaldi_fbank import kaldi_native_fbank

SAMPLE_RATE = 16000
# Four cuts of 1.2-4.6 s: with 1-second chunks, two to five chunks, short last ones.
CORPUS = {"utt-a": (1.2, "HELLO"), "utt-b": (2.5, "PRUNED CTC"), "utt-c": (3.6, "A SMALL TEST"),
          "utt-d": (4.6, "QUICK BROWN FOX")}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory, make_cut_corpus) -> Dict[str, Path]:
    return make_cut_corpus(tmp_path_factory.mktemp("chunk_corpus"), train=CORPUS, valid={"utt-a": CORPUS["utt-a"]})


@pytest.fixture(scope="module")
def cuts(corpus) -> CutSet:
    return CutSet.from_cuts(load_cuts_lazy(corpus["train"])).sort_by_duration(ascending=False)


def lhotse_fbank(samples: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(Fbank(FbankConfig(num_mel_bins=80)).extract(samples, SAMPLE_RATE))


def wav_samples(cut) -> np.ndarray:
    """The cut's audio read directly from its wav (not through Lhotse's cut)."""
    samples, rate = soundfile.read(cut.recording.sources[0].source, dtype="float32")
    assert rate == SAMPLE_RATE
    return samples


def test_batch_features_are_each_chunks_own_fbank_concatenated(cuts) -> None:
    batch = AsrDataset(chunk_seconds=1)[cuts]
    for index, cut in enumerate(cuts):
        samples = wav_samples(cut)
        pieces = [samples[start:start + SAMPLE_RATE] for start in range(0, len(samples), SAMPLE_RATE)]
        expected = torch.cat([lhotse_fbank(piece) for piece in pieces])
        assert [chunk_frame_count(len(piece)) for piece in pieces][:-1] == [100] * (len(pieces) - 1)
        assert int(batch["feature_lens"][index]) == expected.shape[0] == cut.num_frames
        assert torch.equal(batch["features"][index, :expected.shape[0]], expected)
        assert not batch["features"][index, expected.shape[0]:].any()


def test_chunk_features_differ_from_whole_cut_features_near_boundaries(cuts) -> None:
    """The test above can fail: slicing the cut's fbank is not the same thing."""
    cut = cuts[0]
    per_chunk = AsrDataset(chunk_seconds=1)[CutSet.from_cuts([cut])]["features"][0]
    whole = lhotse_fbank(wav_samples(cut))
    assert torch.equal(per_chunk[2:98], whole[2:98])  # windows inside the first chunk
    assert not torch.equal(per_chunk[99], whole[99])  # its last window reaches into the second


def test_audio_outside_a_chunk_leaves_its_features_unchanged(cuts, tmp_path: Path) -> None:
    cut = cuts[0]
    samples = wav_samples(cut)
    louder = samples.copy()
    louder[SAMPLE_RATE:2 * SAMPLE_RATE] *= 5.0  # only the second 1-second chunk
    path = tmp_path / "louder.wav"
    soundfile.write(path, louder, SAMPLE_RATE, subtype="FLOAT")
    changed = Recording.from_file(path, recording_id="louder").to_cut()
    original, modified = (PerChunkFeatures(1).cut_features(c) for c in (cut, changed))
    assert torch.equal(modified[:100], original[:100]) and torch.equal(modified[200:], original[200:])
    # log-energy scales with the square of the amplitude: log(25) in every bin of the second chunk
    torch.testing.assert_close(modified[100:200] - original[100:200],
                               torch.full((100, 80), float(np.log(25.0))), atol=1e-3, rtol=0)


@pytest.mark.parametrize("length", [80, 100, 139, 200, 239, 240, 900])
def test_a_short_last_chunk_has_the_kaldi_frames_of_its_own_samples(length: int) -> None:
    """Lhotse's Fbank refuses fewer than 140 samples; the one frame of a 5-15 ms tail
    (windows reflected at the chunk's edges) is Kaldi's, as kaldi-native-fbank computes it."""
    samples = np.random.default_rng(length).normal(scale=0.1, size=length).astype(np.float32)
    features = ChunkFbank(80)(samples)
    reference = kaldi_native_fbank(samples)
    assert features.shape == reference.shape == ((length + 80) // 160, 80)
    assert np.abs(features.numpy() - reference).max() <= 2e-3  # float32 rounding near the log floor


def test_a_tail_under_half_a_hop_has_no_frames() -> None:
    assert ChunkFbank(80)(np.ones(79, dtype=np.float32)).shape == (0, 80)


def test_the_number_of_bins_follows_the_stored_features(cuts) -> None:
    assert PerChunkFeatures(1).cut_features(cuts[0]).shape[1] == cuts[0].num_features == 80
    assert ChunkFbank(128)(np.zeros(3200, dtype=np.float32)).shape == (20, 128)


def always_spec_augment(**overrides) -> object:
    spec_augment = build_spec_augment(DataOptions(spec_aug_time_warp_factor=0, **overrides))
    spec_augment.p = 1.0  # every chunk augmented
    return spec_augment


def masked_frame_runs(augmented: torch.Tensor, plain: torch.Tensor) -> List[tuple]:
    """(first, last, value) of each run of frames set to one value in every bin."""
    runs, start = [], None
    constant = (augmented == augmented[:, :1]).all(dim=1) & (augmented != plain).any(dim=1)
    for t in range(augmented.shape[0] + 1):
        inside = t < augmented.shape[0] and bool(constant[t]) and (
            start is None or float(augmented[t, 0]) == float(augmented[start, 0]))
        if start is not None and not inside:
            runs.append((start, t - 1, float(augmented[start, 0])))
            start = None
        if start is None and t < augmented.shape[0] and bool(constant[t]):
            start = t
    return runs


def test_spec_augment_masks_stay_in_their_chunk_and_take_its_mean(cuts) -> None:
    plain = AsrDataset(chunk_seconds=1)[cuts]
    augmented = AsrDataset(chunk_seconds=1, spec_augment=always_spec_augment(), seed=3)[cuts]
    assert torch.equal(augmented["feature_lens"], plain["feature_lens"])
    runs_seen = 0
    for index in range(len(cuts)):
        length = int(plain["feature_lens"][index])
        clean, masked = plain["features"][index, :length], augmented["features"][index, :length]
        for first, last, value in masked_frame_runs(masked, clean):
            chunk = first // 100
            assert last // 100 == chunk, f"a time mask crosses a chunk boundary: frames {first}-{last}"
            chunk_mean = clean[100 * chunk:100 * (chunk + 1)].mean()
            assert value == pytest.approx(float(chunk_mean), abs=1e-5)
            runs_seen += 1
    assert runs_seen >= 4


def test_spec_augment_draws_other_masks_for_each_chunk(cuts) -> None:
    """Frequency masks of the 4.6-second cut: each 1-second chunk masks other bins."""
    cut = CutSet.from_cuts([cuts[0]])
    plain = AsrDataset(chunk_seconds=1)[cut]["features"][0]
    augmented = AsrDataset(chunk_seconds=1, spec_augment=always_spec_augment(), seed=5)[cut]["features"][0]
    # A frequency mask sets a bin to one value over the whole chunk (time masks span <= 15 frames).
    masked_bins = [tuple(torch.nonzero(((augmented[c:c + 100] == augmented[c:c + 1]).all(dim=0)
                                        & (augmented[c:c + 100] != plain[c:c + 100]).any(dim=0))).flatten().tolist())
                   for c in range(0, 400, 100)]
    assert all(masked_bins) and len(set(masked_bins)) == len(masked_bins)


def test_per_chunk_spec_augment_is_reproducible_per_seed_and_epoch(cuts) -> None:
    def draw(seed: int, epoch: int) -> torch.Tensor:
        dataset = AsrDataset(chunk_seconds=1, spec_augment=always_spec_augment(), seed=seed)
        dataset.set_epoch(epoch)
        return dataset[cuts]["features"]

    torch.manual_seed(0)
    first = draw(7, 1)
    torch.manual_seed(1)  # the global generators' state does not matter
    assert torch.equal(draw(7, 1), first)
    assert not torch.equal(draw(7, 2), first)


def test_musan_noise_is_mixed_into_each_chunks_audio(corpus, cuts) -> None:
    noise = CutSet.from_cuts(load_cuts_lazy(corpus["musan"]))
    plain = AsrDataset(chunk_seconds=1)[cuts]
    mixed = AsrDataset(chunk_seconds=1, noise_cuts=noise, musan_prob=1.0, musan_snr=(10.0, 10.0))[cuts]
    assert mixed["cut_ids"] == plain["cut_ids"] and torch.equal(mixed["feature_lens"], plain["feature_lens"])
    for index in range(len(cuts)):
        length = int(plain["feature_lens"][index])
        # Noise 10 dB below the speech raises the log-energies of (nearly) every frame.
        assert (mixed["features"][index, :length] != plain["features"][index, :length]).any(dim=1).all()


def test_a_cut_without_audio_is_named(cuts) -> None:
    cut = cuts[0].drop_recording()
    with pytest.raises(ValueError, match=f"cut {cut.id} has no recording"):
        PerChunkFeatures(1).cut_features(cut)


def test_chunk_seconds_must_be_whole_positive_seconds() -> None:
    with pytest.raises(ValueError, match="data.feature_chunk_seconds must be >= 1"):
        PerChunkFeatures(0)


def test_concatenated_training_cuts_are_their_members_back_to_back(cuts) -> None:
    """data.concatenate_seconds: one cut of every member's audio with the gap between,
    its text the members' texts in that order, its features computed per chunk over all."""
    gap = 0.5
    batch = AsrDataset(chunk_seconds=1, concatenate_seconds=30, concatenate_gap=gap)[cuts]
    assert len(batch["texts"]) == 1
    from lhotse.dataset import CutConcatenate

    joined, = CutConcatenate(gap=gap, max_duration=30)(cuts)
    by_text = {c.supervisions[0].text: c for c in cuts}
    members = [by_text[s.text] for s in sorted(joined.supervisions, key=lambda s: s.start)]
    assert sorted(c.id for c in members) == sorted(c.id for c in cuts)
    assert batch["texts"][0] == " ".join(c.supervisions[0].text for c in members)  # the audio's order
    audio, start = joined.load_audio()[0], 0
    for member in members:  # each member's samples at its place, the gap between
        own = wav_samples(member)
        np.testing.assert_allclose(audio[start:start + len(own)], own, atol=1e-6)
        start += len(own) + round(gap * SAMPLE_RATE)
    samples = sum(len(wav_samples(c)) for c in members) + round(gap * SAMPLE_RATE) * (len(members) - 1)
    pieces = [min(SAMPLE_RATE, samples - start) for start in range(0, samples, SAMPLE_RATE)]
    assert int(batch["feature_lens"][0]) == sum(chunk_frame_count(p) for p in pieces)
    first = wav_samples(members[0])[:SAMPLE_RATE]
    assert torch.allclose(batch["features"][0, :100], lhotse_fbank(first), atol=1e-4)
    short = AsrDataset(chunk_seconds=1, concatenate_seconds=5, concatenate_gap=gap)[cuts]
    assert all(len(t.split()) < sum(len(c.supervisions[0].text.split()) for c in members) for t in short["texts"])
    with pytest.raises(ValueError, match="data.concatenate_seconds must be >= 0"):
        DataOptions(concatenate_seconds=-1)


def test_a_share_of_batches_is_joined_and_a_rerun_joins_the_same(cuts) -> None:
    """data.concatenate_probability: each batch joined or not by a draw from its own cuts
    (and the run's seed)."""
    import itertools

    pairs = [CutSet.from_cuts(pair) for pair in itertools.combinations(cuts, 2)]

    def joined(probability: float, seeds=range(25)) -> List[bool]:
        datasets = [AsrDataset(concatenate_seconds=60, concatenate_probability=probability, seed=s) for s in seeds]
        return [len(d[pair]["texts"]) == 1 for d in datasets for pair in pairs]

    half = joined(0.5)
    assert len(half) == 150 and 51 <= sum(half) <= 99, f"{sum(half)} of 150 joined at 0.5"  # +-4 sd
    assert joined(0.5) == half
    assert not any(joined(0.0, [0])) and all(joined(1.0, [0]))
    with pytest.raises(ValueError, match=r"data.concatenate_probability must be in \[0, 1\]"):
        DataOptions(concatenate_probability=1.5)


def test_each_cut_drawn_for_a_join_mixes_joined_and_single_sentences_in_every_batch(cuts) -> None:
    """data.concatenate_each=cut: each cut drawn with concatenate_probability, the drawn ones
    joined (one example, as 60 s hold them), the others alone: every sentence once, batches
    that hold both, as many joined sentences as the draws give; "batch" joins all or none."""
    texts = [c.supervisions[0].text for c in cuts]

    def batch_texts(seed: int, each: str) -> List[str]:
        dataset = AsrDataset(concatenate_seconds=60, concatenate_probability=0.5, concatenate_each=each, seed=seed)
        return dataset[cuts]["texts"]

    joined_sentences, mixed = 0, 0
    for seed in range(100):
        out = batch_texts(seed, "cut")
        assert out == batch_texts(seed, "cut")  # a rerun draws the same
        single = [t for t in out if t in texts]
        joined = [t for t in out if t not in texts]
        assert len(joined) <= 1, out
        members = [t for t in texts if t not in single]
        if joined:
            assert len(members) >= 2 and sorted(joined[0].split()) == sorted(" ".join(members).split())
        else:
            assert len(single) == len(texts)
        joined_sentences += len(members)
        mixed += bool(joined) and bool(single)
        whole = batch_texts(seed, "batch")
        assert len(whole) == 1 or sorted(whole) == sorted(texts)
    # Per batch: k ~ Binomial(4, 1/2) drawn, joined when k >= 2: mean 1.75 sentences (sd 1.30),
    # both kinds when k is 2 or 3 (10 in 16); bounds +-4 sd over 100 batches.
    assert 123 <= joined_sentences <= 227, joined_sentences
    assert 43 <= mixed <= 82, mixed
    with pytest.raises(ValueError, match="data.concatenate_each must be 'batch' or 'cut'"):
        DataOptions(concatenate_each="update")


def test_a_gap_range_draws_each_joined_batchs_silence_between_its_bounds(cuts) -> None:
    """data.concatenate_max_gap: each joined batch's silence between sentences drawn from
    [concatenate_gap, concatenate_max_gap] (in 10 ms steps) by the batch's seed: the joined
    cut spans its sentences and n - 1 such gaps; a rerun draws the same; without the range,
    always concatenate_gap."""
    total = sum(cut.duration for cut in cuts)

    def gap_of(seed: int, low: float, high: float, share: float = 1.0) -> float:
        dataset = AsrDataset(concatenate_seconds=120, concatenate_gap=low, concatenate_max_gap=high, seed=seed,
                             concatenate_gap_probability=share)
        [joined] = list(dataset._join(cuts))
        return (joined.duration - total) / (len(cuts) - 1)

    gaps = [gap_of(seed, 0.0, 0.5) for seed in range(40)]
    assert all(-1e-9 <= gap <= 0.5 + 1e-9 and abs(gap * 100 - round(gap * 100)) < 1e-6 for gap in gaps), gaps
    assert min(gaps) < 0.1 and max(gaps) > 0.4 and len({round(gap, 2) for gap in gaps}) > 20
    assert gaps[:5] == [gap_of(seed, 0.0, 0.5) for seed in range(5)]
    assert gap_of(0, 0.25, 0.0) == pytest.approx(0.25) and gap_of(1, 0.25, 0.0) == pytest.approx(0.25)
    # data.concatenate_gap_probability = 1/2: about half the joined batches keep concatenate_gap
    # (0 here: back to back), the others drawn; bounds +-4 sd of Binomial(100, 1/2).
    halves = [gap_of(seed, 0.0, 0.5, share=0.5) for seed in range(100)]
    assert 30 <= sum(abs(gap) < 1e-9 for gap in halves) <= 70
    assert max(halves) > 0.4 and halves[:5] == [gap_of(seed, 0.0, 0.5, share=0.5) for seed in range(5)]
    with pytest.raises(ValueError, match=r"data.concatenate_gap_probability must be in \[0, 1\]"):
        DataOptions(concatenate_gap_probability=1.5)
    with pytest.raises(ValueError, match="data.concatenate_max_gap 0.1 is below data.concatenate_gap 0.2"):
        DataOptions(concatenate_gap=0.2, concatenate_max_gap=0.1)


@pytest.mark.parametrize("side", ["trailing", "leading"])
def test_silence_pads_each_example_with_its_own_draw_of_zeros(cuts, side) -> None:
    """data.trailing_silence_max (data.leading_silence_max): each example followed
    (preceded) by 0 to that many seconds of silence in 10 ms steps, drawn per example from
    the batch's seed: its chunk features are those of its own samples followed (preceded)
    by that many zero samples, its words moved with them; a rerun draws the same."""
    plain = AsrDataset(chunk_seconds=1)[cuts]
    silences = []
    for seed in range(12):
        dataset = AsrDataset(chunk_seconds=1, seed=seed, **{f"{side}_silence_max": 0.5})
        batch = dataset[cuts]
        assert batch["texts"] == plain["texts"] and batch["cut_ids"] == plain["cut_ids"]
        assert torch.equal(dataset[cuts]["features"], batch["features"])
        padded_cuts = {c.id: c for c in dataset._pad_ends(cuts)}
        for index, cut in enumerate(cuts):
            padded = padded_cuts[cut.id]
            seconds = padded.duration - cut.duration
            assert -1e-9 <= seconds <= 0.5 + 1e-9 and abs(seconds * 100 - round(seconds * 100)) < 1e-6
            silences.append(round(seconds, 2))
            zeros = np.zeros(round(seconds * SAMPLE_RATE), np.float32)
            samples = np.concatenate([wav_samples(cut), zeros] if side == "trailing" else [zeros, wav_samples(cut)])
            expected = torch.cat([lhotse_fbank(samples[start:start + SAMPLE_RATE])
                                  for start in range(0, len(samples), SAMPLE_RATE)])
            assert int(batch["feature_lens"][index]) == expected.shape[0]
            torch.testing.assert_close(batch["features"][index, :expected.shape[0]], expected, atol=1e-4, rtol=0)
            start = padded.supervisions[0].start - cut.supervisions[0].start
            assert abs(start - (0.0 if side == "trailing" else seconds)) < 1e-6
    assert len(set(silences)) > 20 and min(silences) < 0.1 and max(silences) > 0.4, silences
    with pytest.raises(ValueError, match=f"data.{side}_silence_max must be >= 0"):
        DataOptions(**{f"{side}_silence_max": -0.1})


def test_trailing_silence_follows_a_join_and_keeps_its_draws_beside_leading_silence(cuts) -> None:
    """After a join: one example, its members back to back, then its own silence. With
    leading silence as well, each example's trailing silence is the one drawn without it."""
    joined = AsrDataset(concatenate_seconds=60, concatenate_gap=0.0, trailing_silence_max=0.5, seed=1)
    [example] = list(joined._pad_ends(joined._join(cuts)))
    assert 0 <= example.duration - sum(cut.duration for cut in cuts) <= 0.5 + 1e-9
    assert example.supervisions[-1].end <= sum(cut.duration for cut in cuts) + 1e-6
    for seed in range(6):
        leading = {c.id: c.duration for c in AsrDataset(leading_silence_max=0.5, seed=seed)._pad_ends(cuts)}
        trailing = {c.id: c.duration for c in AsrDataset(trailing_silence_max=0.3, seed=seed)._pad_ends(cuts)}
        both = AsrDataset(leading_silence_max=0.5, trailing_silence_max=0.3, seed=seed)._pad_ends(cuts)
        for cut, padded in zip(cuts, both):
            assert padded.id == cut.id
            assert abs(padded.duration - (leading[cut.id] - cut.duration) - trailing[cut.id]) < 1e-6


@pytest.mark.parametrize("side", ["tail", "lead"])
def test_padding_puts_the_same_zeros_at_every_cut(cuts, side) -> None:
    """The decoder's tail (lead) padding (decode.tail_padding_seconds, decode.lead_padding_seconds):
    every cut followed (preceded) by exactly that much silence, its chunk features those of
    its own samples and the zero samples; read features (whole-cut) end (start) in frames
    equal to Lhotse's fbank of zeros."""
    option = {f"{side}_padding_seconds": 0.37}
    batch = AsrDataset(chunk_seconds=1, **option)[cuts]
    for index, cut in enumerate(cuts):
        zeros = np.zeros(round(0.37 * SAMPLE_RATE), np.float32)
        samples = np.concatenate([wav_samples(cut), zeros] if side == "tail" else [zeros, wav_samples(cut)])
        expected = torch.cat([lhotse_fbank(samples[start:start + SAMPLE_RATE])
                              for start in range(0, len(samples), SAMPLE_RATE)])
        assert int(batch["feature_lens"][index]) == expected.shape[0] == cut.num_frames + 37
        torch.testing.assert_close(batch["features"][index, :expected.shape[0]], expected, atol=1e-4, rtol=0)
    read = AsrDataset(**option)[cuts]
    silence = lhotse_fbank(np.zeros(SAMPLE_RATE, np.float32))[0]
    for index, cut in enumerate(cuts):
        stored = torch.from_numpy(cut.load_features())
        frames = stored.shape[0]
        assert int(read["feature_lens"][index]) == frames + 37
        own, padding = (slice(0, frames), slice(frames, frames + 37)) if side == "tail" else \
            (slice(37, frames + 37), slice(0, 37))
        # (Lhotse mixes a MixedCut's tracks in the energy domain: 1e-6 of rounding)
        torch.testing.assert_close(read["features"][index, own], stored, atol=1e-5, rtol=0)
        torch.testing.assert_close(read["features"][index, padding], silence.expand(37, -1), atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match=f"{side}_padding_seconds must be >= 0"):
        AsrDataset(**{f"{side}_padding_seconds": -0.5})
