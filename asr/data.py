"""The Lhotse data module: lazily read cuts -> DynamicBucketingSampler -> batches.

A batch (from :class:`AsrDataset`) is a dict::

    features     float32 (N, T, F)  log-mel fbank (F = 80, or 128 for the LLM encoders), padded at the end
    feature_lens int64   (N,)        valid frames of each utterance (10 ms frames)
    texts        list[str]           transcripts
    cut_ids      list[str]

sorted by decreasing duration. Training batches are augmented with MUSAN noise
(Lhotse ``CutMix``, in the feature domain) and SpecAugment (Lhotse ``SpecAugment``)
with icefall's settings; validation batches are not.

With ``data.feature_chunk_seconds`` (streaming models: paper App. D.4) the features are
computed from the audio chunk by chunk and SpecAugment runs on each chunk on its own
(:mod:`asr.chunk_features`); MUSAN noise is then mixed into the audio.

Augmentation draws its randomness from a seed made of the run's seed, the epoch
and the batch's cut ids, so a resumed run (see :func:`resumable_sampler_state`)
sees exactly the batches and the augmented features it would have seen.
"""

from __future__ import annotations

import contextlib
import copy
import glob
import hashlib
import logging
import math
import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Tuple, Union

import numpy as np
import torch
from lhotse import CutSet, Fbank, FbankConfig, load_manifest, load_manifest_lazy
from lhotse.dataset import CutConcatenate, CutMix, DynamicBucketingSampler, DynamicCutSampler, SpecAugment
from lhotse.dataset.input_strategies import OnTheFlyFeatures, PrecomputedFeatures
from lhotse.cut import Cut, MixedCut, PaddingCut
from lhotse.lazy import LazyIteratorChain
from torch.utils.data import DataLoader

from asr.chunk_features import PerChunkFeatures
from asr.config import DataOptions, PathLike, TrainOptions
from asr.cut_filters import TrainingCutFilter, cut_text
from asr.tokenizer import Tokenizer



def load_cuts_lazy(paths: Union[PathLike, str], option_name: str = "cuts", seed: int = 0) -> CutSet:
    """A lazily read CutSet from one manifest (``.jsonl`` / ``.jsonl.gz``) or several.

    ``paths`` may be a comma-separated list: the manifests are then interleaved at
    random (``CutSet.mux``, the same order on every pass for a given ``seed``), each
    drawn in proportion to its file size, a stand-in for its number of cuts that
    needs no pass over the data. A missing file is named with ``option_name``.

    An item may also be a glob pattern (``*``, ``?``, ``[...]``), for a corpus stored
    in many pieces, e.g. GigaSpeech XL's ``gigaspeech_XL_split/gigaspeech_cuts_XL.*.jsonl.gz``.
    Its pieces are read one after the other (one open file at a time) in an order
    shuffled once by ``seed``, the same on every pass so that a resumed run reads the
    same sequence; the sampler's shuffle buffer mixes neighbouring pieces. Empty pieces
    are skipped.
    """
    names = [p.strip() for p in str(paths).split(",") if p.strip()]
    if not names:
        raise ValueError(f"{option_name}: no cut manifest given")
    cut_sets = []
    sizes = []
    for name in names:
        if _is_glob_pattern(name):
            cuts, size = _load_pieces(name, option_name, seed)
        else:
            cuts, size = _load_one_manifest(Path(name), option_name), Path(name).stat().st_size
        cut_sets.append(cuts)
        sizes.append(max(size, 1))
    if len(cut_sets) == 1:
        return cut_sets[0]
    return CutSet.mux(*cut_sets, weights=sizes, seed=seed)


def _is_glob_pattern(name: str) -> bool:
    return any(char in name for char in "*?[")


def _load_one_manifest(path: Path, option_name: str) -> CutSet:
    if not path.is_file():
        raise FileNotFoundError(f"{option_name}: cut manifest not found: {path}")
    cuts = load_manifest_lazy(path)
    if not isinstance(cuts, CutSet):
        raise ValueError(f"{option_name}: {path} is not a cut manifest (found {type(cuts).__name__})")
    return _with_paths_found(cuts, path)


def _cut_with_files(cut: Optional[Cut]) -> Optional[Cut]:
    """``cut``, or for a MixedCut (what Lhotse's ``pad`` and ``append`` make) its first
    track that reads files (not a PaddingCut): a MixedCut has no features or recording of
    its own."""
    if isinstance(cut, MixedCut):
        return next((track.cut for track in cut.tracks if not isinstance(track.cut, PaddingCut)), None)
    return cut


def _with_paths_found(cuts: CutSet, manifest: Path) -> CutSet:
    """``cuts`` whose relative feature and audio paths (written relative to the recipe's
    folder) are found from any working directory: prefixed with the manifest's nearest
    ancestor folder under which the first cut's files exist, where they are not found as they are."""
    first = _cut_with_files(next(iter(cuts), None))
    if first is None:
        return cuts
    features = first.features.storage_path if first.has_features else None
    sources = [s.source for s in first.recording.sources if s.type == "file"] if first.has_recording else []
    ancestors = list(Path(manifest).resolve().parents)

    def base_of(relative: Optional[str]) -> Optional[Path]:
        if not relative or Path(relative).is_absolute() or Path(relative).exists():
            return None
        return next((folder for folder in ancestors if (folder / relative).exists()), None)

    features_base = base_of(features)
    if features_base is not None:
        cuts = cuts.with_features_path_prefix(str(features_base))
    audio_base = base_of(sources[0] if sources else None)
    if audio_base is not None:
        cuts = cuts.with_recording_path_prefix(str(audio_base))
    return cuts


def _load_pieces(pattern: str, option_name: str, seed: int) -> Tuple[CutSet, int]:
    """The non-empty manifests matching ``pattern`` chained in a seeded order, and their total size."""
    matches = sorted(glob.glob(pattern), key=_natural_sort_key)
    if not matches:
        raise FileNotFoundError(f"{option_name}: no cut manifest matches the pattern {pattern}")
    random.Random(seed).shuffle(matches)
    pieces = []
    for name in matches:
        cuts = load_manifest_lazy(name) if Path(name).stat().st_size > 0 else None
        if cuts is None:
            logging.warning("%s: skipping empty manifest %s", option_name, name)
        elif not isinstance(cuts, CutSet):
            raise ValueError(f"{option_name}: {name} is not a cut manifest (found {type(cuts).__name__})")
        else:
            pieces.append(cuts)
    if not pieces:
        raise ValueError(f"{option_name}: every manifest matching {pattern} is empty")
    size = sum(Path(name).stat().st_size for name in matches)
    return CutSet(LazyIteratorChain(*(piece.data for piece in pieces))), size


def _natural_sort_key(name: str) -> List[Union[int, str]]:
    """``piece.10`` after ``piece.9``: digit runs compare as numbers."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def build_spec_augment(options: DataOptions) -> SpecAugment:
    """Lhotse SpecAugment with the options' settings (icefall: warp 80, 2x27 bins, 10x100 frames)."""
    return SpecAugment(
        time_warp_factor=options.spec_aug_time_warp_factor,
        num_feature_masks=options.spec_aug_num_feature_masks,
        features_mask_size=options.spec_aug_features_mask_size,
        num_frame_masks=options.spec_aug_num_frame_masks,
        frames_mask_size=options.spec_aug_frames_mask_size,
    )


# Lhotse's fbank of zero samples: log of float32's epsilon in every bin (its energy floor).
SILENCE_FBANK = math.log(torch.finfo(torch.float32).eps)


def followed_by_silence(cut: Cut, seconds: float) -> Cut:
    """``cut`` with ``seconds`` of silence after it: zero samples where features are
    computed from the audio, frames of :data:`SILENCE_FBANK` where they are read (the
    fbank of zero samples, not Lhotse's default padding of log 1e-10)."""
    return cut.pad(duration=cut.duration + seconds, direction="right", preserve_id=True,
                   pad_feat_value=SILENCE_FBANK)


def preceded_by_silence(cut: Cut, seconds: float) -> Cut:
    """``cut`` after ``seconds`` of silence (as :func:`followed_by_silence`, before it)."""
    return cut.pad(duration=cut.duration + seconds, direction="left", preserve_id=True,
                   pad_feat_value=SILENCE_FBANK)


class AsrDataset(torch.utils.data.Dataset):
    """Map-style dataset indexed by the CutSet of one batch (what a Lhotse sampler yields).

    Args:
        on_the_fly_feats: compute fbank from the audio instead of reading features.
        num_mel_bins: the bins of on-the-fly features.
        noise_cuts: MUSAN cuts to mix in (with features unless on the fly), or None.
        musan_prob: probability of mixing noise into a cut.
        musan_snr: (min, max) SNR in dB, drawn uniformly.
        spec_augment: applied to the padded features, or None.
        seed: base of the per-batch augmentation seed.
        chunk_seconds: > 0: features (and SpecAugment) per chunk of that many seconds
            of audio, for streaming models (App. D.4); 0: per cut.
        concatenate_seconds: > 0: the batch's cuts joined back to back, ``concatenate_gap``
            seconds apart, into cuts of at most that many seconds (training only).
        concatenate_probability: the share of batches joined (drawn from each batch's
            cuts and ``seed``), the others left as they are.
        concatenate_each: "batch": the whole batch joined or not; "cut": each cut drawn
            with ``concatenate_probability``, the drawn ones joined, the rest alone.
        concatenate_max_gap: above ``concatenate_gap``: each joined batch's gap drawn
            uniformly between the two (from the batch's seed); else ``concatenate_gap``.
        concatenate_gap_probability: the share of joined batches whose gap is drawn so
            (the others ``concatenate_gap``).
        trailing_silence_max: > 0: each example (after the joins) padded at its end with
            silence drawn uniformly from [0, trailing_silence_max] s (10 ms steps, from
            the batch's seed), so that not every input ends on a word.
        leading_silence_max: the same before each example (its own draws), so that not
            every input starts on a word, as a stream starts with silence.
        tail_padding_seconds: > 0: every cut followed by that many seconds of silence,
            as a stream's end is fed to a streaming recognizer (``decode.tail_padding_seconds``).
        lead_padding_seconds: > 0: every cut preceded by that many seconds of silence, as
            a stream starts (``decode.lead_padding_seconds``).
    """

    def __init__(
        self,
        *,
        on_the_fly_feats: bool = False,
        num_mel_bins: int = 80,
        noise_cuts: Optional[CutSet] = None,
        musan_prob: float = 0.5,
        musan_snr: Tuple[float, float] = (10.0, 20.0),
        spec_augment: Optional[SpecAugment] = None,
        seed: int = 42,
        chunk_seconds: int = 0,
        concatenate_seconds: float = 0.0,
        concatenate_gap: float = 0.1,
        concatenate_probability: float = 1.0,
        concatenate_each: str = "batch",
        concatenate_max_gap: float = 0.0,
        concatenate_gap_probability: float = 1.0,
        trailing_silence_max: float = 0.0,
        leading_silence_max: float = 0.0,
        tail_padding_seconds: float = 0.0,
        lead_padding_seconds: float = 0.0,
    ) -> None:
        super().__init__()
        if concatenate_each not in ("batch", "cut"):
            raise ValueError(f"concatenate_each must be 'batch' or 'cut', got {concatenate_each!r}")
        self.concatenate_each = concatenate_each
        self.concatenate = (CutConcatenate(gap=concatenate_gap, max_duration=concatenate_seconds)
                            if concatenate_seconds > 0 else None)
        self.gap_range = ((concatenate_gap, concatenate_max_gap) if concatenate_max_gap > concatenate_gap
                          else None)
        self.gap_probability = concatenate_gap_probability
        self.concatenate_probability = concatenate_probability
        silences = {"trailing_silence_max": trailing_silence_max, "leading_silence_max": leading_silence_max,
                    "tail_padding_seconds": tail_padding_seconds, "lead_padding_seconds": lead_padding_seconds}
        for name, seconds in silences.items():
            if not seconds >= 0:
                raise ValueError(f"{name} must be >= 0 (seconds), got {seconds!r}")
            setattr(self, name, seconds)
        self.per_chunk = PerChunkFeatures(chunk_seconds) if chunk_seconds else None
        if on_the_fly_feats:
            self.read_features = OnTheFlyFeatures(Fbank(FbankConfig(num_mel_bins=num_mel_bins)))
        else:
            self.read_features = PrecomputedFeatures()
        self.noise_cuts = noise_cuts
        self.musan_prob = musan_prob
        self.musan_snr = musan_snr
        self.spec_augment = spec_augment
        self.seed = seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """Make augmentation differ between epochs (call before creating the iterator)."""
        self.epoch = epoch

    def __getitem__(self, cuts: CutSet) -> Dict[str, Any]:
        if not isinstance(cuts, CutSet):
            raise TypeError(
                f"AsrDataset is indexed by a CutSet (from a Lhotse sampler), got {type(cuts).__name__}"
            )
        if self.concatenate is not None:
            cuts = self._join(cuts)
        if self.trailing_silence_max > 0 or self.leading_silence_max > 0:
            cuts = self._pad_ends(cuts)
        if self.tail_padding_seconds > 0:
            cuts = CutSet.from_cuts(followed_by_silence(cut, self.tail_padding_seconds) for cut in cuts)
        if self.lead_padding_seconds > 0:
            cuts = CutSet.from_cuts(preceded_by_silence(cut, self.lead_padding_seconds) for cut in cuts)
        cuts = cuts.sort_by_duration(ascending=False)
        batch_seed = self._batch_seed(cuts)
        if self.noise_cuts is not None:
            mix = CutMix(
                self.noise_cuts, snr=self.musan_snr, p=self.musan_prob,
                preserve_id=True, seed=random.Random(batch_seed),
                pad_to_longest=False,  # noise must not lengthen an utterance
            )
            cuts = mix(cuts)
        if self.per_chunk is not None:
            # Seeded as the whole-cut path below: a resumed run draws the same masks.
            with _seeded_global_rngs(batch_seed):
                features, feature_lens = self.per_chunk(cuts, self.spec_augment)
        else:
            features, feature_lens = self.read_features(cuts)
        if self.spec_augment is not None and self.per_chunk is None:
            # (utterance, first frame, number of frames): time warp stays inside each utterance.
            segments = torch.stack(
                [torch.arange(len(cuts)), torch.zeros_like(feature_lens), feature_lens], dim=1
            ).to(torch.int32)
            with _seeded_global_rngs(batch_seed):
                features = self.spec_augment(features, segments)
        return {
            "features": features,
            "feature_lens": feature_lens.to(torch.int64),
            "texts": [cut_text(cut) for cut in cuts],
            "cut_ids": [cut.id for cut in cuts],
        }

    def _join(self, cuts: CutSet) -> CutSet:
        """The batch with the cuts ``concatenate_probability`` and ``concatenate_each``
        draw joined back to back (the same batch draws the same in every run)."""
        concatenate = self.concatenate
        gap_draw = random.Random(self._batch_seed(cuts) ^ 0x6A6A)
        if self.gap_range is not None and (self.gap_probability >= 1.0 or gap_draw.random() < self.gap_probability):
            gap = gap_draw.uniform(*self.gap_range)
            concatenate = CutConcatenate(gap=round(gap, 2), max_duration=self.concatenate.max_duration)
        if self.concatenate_probability >= 1.0:
            return concatenate(cuts)
        draw = random.Random(self._batch_seed(cuts) ^ 0x5A5A)
        if self.concatenate_each == "batch":
            return concatenate(cuts) if draw.random() < self.concatenate_probability else cuts
        drawn = [draw.random() < self.concatenate_probability for _ in cuts]
        if sum(drawn) < 2:
            return cuts
        joined = concatenate(CutSet.from_cuts(cut for cut, chosen in zip(cuts, drawn) if chosen))
        return CutSet.from_cuts([*joined, *(cut for cut, chosen in zip(cuts, drawn) if not chosen)])

    def _pad_ends(self, cuts: CutSet) -> CutSet:
        """Each cut followed by its own draw of 0 to ``trailing_silence_max`` s of silence
        and preceded by one of 0 to ``leading_silence_max`` s (padding, as CutConcatenate's
        gaps; the same batch draws the same in every run, the trailing draws the same
        whether or not leading ones are made)."""
        seed = self._batch_seed(cuts)
        trailing, leading = random.Random(seed ^ 0x7A7A), random.Random(seed ^ 0x1E1E)
        padded = []
        for cut in cuts:
            if self.trailing_silence_max > 0:
                seconds = round(trailing.uniform(0.0, self.trailing_silence_max), 2)
                cut = followed_by_silence(cut, seconds) if seconds > 0 else cut
            if self.leading_silence_max > 0:
                seconds = round(leading.uniform(0.0, self.leading_silence_max), 2)
                cut = preceded_by_silence(cut, seconds) if seconds > 0 else cut
            padded.append(cut)
        return CutSet.from_cuts(padded)

    def _batch_seed(self, cuts: CutSet) -> int:
        digest = hashlib.blake2b(digest_size=8)
        digest.update(f"{self.seed}/{self.epoch}/".encode())
        for cut in cuts:
            digest.update(cut.id.encode())
            digest.update(b"\0")
        return int.from_bytes(digest.digest(), "little") & 0x7FFF_FFFF_FFFF_FFFF


@dataclass
class TrainData:
    """What :func:`build_train_dataloader` returns: the loader and the parts train.py talks to."""

    loader: DataLoader
    sampler: DynamicBucketingSampler
    dataset: AsrDataset
    cut_filter: TrainingCutFilter

    def set_epoch(self, epoch: int) -> None:
        """Start epoch ``epoch`` (a no-op for the sampler right after a restore of that epoch).

        The filter's counters restart with each new epoch (log them with
        ``cut_filter.log_summary()`` when an epoch ends).
        """
        if epoch != self.sampler.epoch:
            self.cut_filter.reset()
        self.sampler.set_epoch(epoch)
        self.dataset.set_epoch(epoch)


def build_train_dataloader(
    options: DataOptions, tokenizer: Tokenizer, output_frames: Callable[[int], int], *,
    seed: int = TrainOptions.seed, world_size: int = 1, rank: int = 0
) -> TrainData:
    """Training loader over ``options.train_cuts`` for one rank, filtered and augmented;
    ``seed`` (asr.train passes ``train.seed``) orders the pieces and the batches and draws
    the augmentation."""
    _check_rank(world_size, rank)
    cut_filter = TrainingCutFilter(tokenizer, output_frames, options.min_cut_duration, options.max_cut_duration)
    cuts = load_cuts_lazy(options.train_cuts, "train_cuts", seed=seed).filter(cut_filter)
    noise_cuts = None
    if options.enable_musan:
        musan_path = Path(options.musan_cuts)
        if not musan_path.is_file():
            raise FileNotFoundError(
                f"musan_cuts: MUSAN cut manifest not found: {musan_path} (set enable_musan: false to train without it)"
            )
        noise_cuts = load_manifest(musan_path)
        _check_noise_cuts(noise_cuts, musan_path, options)
    dataset = AsrDataset(
        on_the_fly_feats=options.on_the_fly_feats,
        num_mel_bins=options.on_the_fly_num_mel_bins,
        noise_cuts=noise_cuts,
        musan_prob=options.musan_prob,
        musan_snr=(options.musan_snr_min, options.musan_snr_max),
        spec_augment=build_spec_augment(options) if options.enable_spec_aug else None,
        seed=seed,
        chunk_seconds=options.feature_chunk_seconds or 0,
        concatenate_seconds=options.concatenate_seconds,
        concatenate_gap=options.concatenate_gap,
        concatenate_probability=options.concatenate_probability,
        concatenate_each=options.concatenate_each,
        concatenate_max_gap=options.concatenate_max_gap,
        concatenate_gap_probability=options.concatenate_gap_probability,
        trailing_silence_max=options.trailing_silence_max,
        leading_silence_max=options.leading_silence_max,
    )
    sampler = DynamicBucketingSampler(
        cuts,
        max_duration=rank_max_duration(options, world_size),
        num_buckets=options.num_buckets,
        shuffle=options.shuffle,
        drop_last=options.drop_last,
        buffer_size=options.num_buckets * 5000,
        world_size=world_size,
        rank=rank,
        seed=seed,
    )
    # Estimating the bucket bins read (and filtered) the first cuts: count epochs only.
    cut_filter.reset()
    loader = _map_style_loader(dataset, sampler, options.num_workers, seed)
    return TrainData(loader=loader, sampler=sampler, dataset=dataset, cut_filter=cut_filter)


def _check_noise_cuts(noise_cuts: CutSet, musan_path: Path, options: DataOptions) -> None:
    """Refuse MUSAN cuts that cannot be mixed into ``options.train_cuts``, naming both files.

    Mixed in the feature domain (precomputed features), the noise needs features with the
    training features' bin count (80 for the Zipformer recipes, 128 for the LLM encoders of
    App. D.3-D.4); mixed into the audio (on-the-fly or per-chunk features) it needs audio.
    Lhotse would otherwise fail deep inside a data worker, or not at all for a mismatch
    that broadcasts.
    """
    first_noise = next(iter(noise_cuts), None)
    if first_noise is None:
        raise ValueError(f"musan_cuts: {musan_path} holds no cuts")
    if options.on_the_fly_feats or options.feature_chunk_seconds:
        if not first_noise.has_recording:
            raise ValueError(
                f"musan_cuts: {musan_path} has no audio (cut {first_noise.id!r}), but the noise is mixed "
                f"into the audio when features are computed on the fly or per chunk "
                f"(data.on_the_fly_feats / data.feature_chunk_seconds): give MUSAN cuts with recordings"
            )
        return
    first_train = next(iter(load_cuts_lazy(options.train_cuts, "train_cuts")), None)
    if first_train is None or not first_train.has_features:
        return  # an empty set or one without features fails with its own message later
    if not first_noise.has_features:
        raise ValueError(
            f"musan_cuts: {musan_path} has no features (cut {first_noise.id!r}); the noise is mixed in the "
            f"feature domain: compute MUSAN fbank with the training features' {first_train.num_features} bins"
        )
    if first_noise.num_features != first_train.num_features:
        raise ValueError(
            f"musan_cuts: {musan_path} has {first_noise.num_features}-bin features but train_cuts "
            f"{options.train_cuts} has {first_train.num_features}-bin features; compute MUSAN fbank with "
            f"{first_train.num_features} bins (e.g. python -m local.musan --num-mel-bins {first_train.num_features})"
        )


def build_valid_dataloader(options: DataOptions, *, world_size: int = 1, rank: int = 0,
                           tail_padding_seconds: float = 0.0, lead_padding_seconds: float = 0.0) -> DataLoader:
    """Validation loader over ``options.valid_cuts``: no filter, no augmentation, no shuffling;
    each cut followed by ``tail_padding_seconds`` of silence (the decoder's tail padding)
    and preceded by ``lead_padding_seconds``.

    Validation sets are small: a plain dynamic sampler, no bucketing (which would also
    need at least ``num_buckets`` cuts).
    """
    _check_rank(world_size, rank)
    sampler = DynamicCutSampler(
        load_cuts_lazy(options.valid_cuts, "valid_cuts"),
        max_duration=rank_max_duration(options, world_size),
        shuffle=False,
        drop_last=False,
        world_size=world_size,
        rank=rank,
    )
    dataset = AsrDataset(on_the_fly_feats=options.on_the_fly_feats, num_mel_bins=options.on_the_fly_num_mel_bins,
                         chunk_seconds=options.feature_chunk_seconds or 0, tail_padding_seconds=tail_padding_seconds,
                         lead_padding_seconds=lead_padding_seconds)
    # Nothing random happens in validation batches: the seed only names the worker seeds.
    return _map_style_loader(dataset, sampler, options.num_workers, seed=0)


def resumable_sampler_state(sampler: DynamicBucketingSampler, batches_consumed: int) -> Dict[str, Any]:
    """The sampler's state as if it had yielded exactly ``batches_consumed`` batches this epoch.

    A DataLoader with workers draws batches ahead of the training loop, so the
    sampler itself is past the batch being trained on; this state resumes at the
    first batch the loop has not yet used.
    """
    state = copy.deepcopy(sampler.state_dict())
    epoch = state["diagnostics"]["current_epoch"]
    epoch_stats = state["diagnostics"]["stats_per_epoch"][epoch]
    drawn = epoch_stats["kept_batches"] + epoch_stats["discarded_batches"]
    if not 0 <= batches_consumed <= drawn:
        raise ValueError(
            f"batches_consumed={batches_consumed} but the sampler has drawn {drawn} batches in epoch {epoch}"
        )
    epoch_stats["kept_batches"] = batches_consumed
    epoch_stats["discarded_batches"] = 0
    return state


def restore_sampler_state(sampler: DynamicBucketingSampler, state: Mapping[str, Any]) -> None:
    """Load a :func:`resumable_sampler_state` (the mapping is not modified)."""
    sampler.load_state_dict(copy.deepcopy(dict(state)))


def _map_style_loader(dataset: AsrDataset, sampler: Union[DynamicBucketingSampler, DynamicCutSampler],
                      num_workers: int, seed: int) -> DataLoader:
    # batch_size=None: each sampler item is already a batch (a CutSet). The private
    # generator keeps iterator creation (worker seeds) off torch's global RNG, which a
    # resumed run restores from its checkpoint.
    return DataLoader(
        dataset, sampler=sampler, batch_size=None, num_workers=num_workers,
        generator=torch.Generator().manual_seed(seed),
    )


def rank_max_duration(options: DataOptions, world_size: int) -> float:
    """Seconds of audio in one rank's batch: ``data.max_duration``, or its share of it
    with ``data.batch_across_ranks``."""
    return options.max_duration / world_size if options.batch_across_ranks else options.max_duration


def _check_rank(world_size: int, rank: int) -> None:
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"need 0 <= rank < world_size, got rank={rank}, world_size={world_size}")


@contextlib.contextmanager
def _seeded_global_rngs(seed: int) -> Iterator[None]:
    """Seed python's, numpy's and torch's global RNGs (Lhotse SpecAugment draws from all
    three), then restore them so the training loop's own random stream is untouched."""
    python_state = random.getstate()
    numpy_state = np.random.get_state()
    with torch.random.fork_rng(devices=[]):
        random.seed(seed)
        np.random.seed(seed % 2**32)
        torch.manual_seed(seed)
        try:
            yield
        finally:
            random.setstate(python_state)
            np.random.set_state(numpy_state)
