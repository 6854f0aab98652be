"""decode.blank_penalty (icefall's --blank-penalty): subtracted from blank's log-probability
at every frame before the CTC searches. References: brute-force enumeration of every
alignment of the penalized scores, the textbook prefix beam search of test_search.py on
an explicitly penalized copy, and argmax over that copy."""

from __future__ import annotations

import pytest
import torch

from asr.config import DecodeOptions
from asr.decode import decoding_settings
from asr.decode_methods import BatchOutputs, SearchSettings, ctc_search, method_of
from asr.search import ctc_greedy_search, ctc_prefix_beam_search, penalized_argmax
from asr.streaming_search import StreamingGreedySearch, StreamingPrefixBeamSearch
from references.ctc_search_reference import brute_force_label_log_probs, peaky_log_probs, reference_prefix_beam_search


def penalized_copy(log_probs: torch.Tensor, blank_id: int, penalty: float) -> torch.Tensor:
    scores = log_probs.clone()
    scores[..., blank_id] -= penalty
    return scores


@pytest.mark.parametrize("blank_id", [0, 3, 6])
@pytest.mark.parametrize("penalty", [-1.0, 0.4, 2.5])
def test_penalized_argmax_equals_the_argmax_of_the_penalized_scores(blank_id, penalty):
    generator = torch.Generator().manual_seed(blank_id)
    log_probs = (2.0 * torch.randn(4, 50, 7, generator=generator)).log_softmax(-1)
    expected = penalized_copy(log_probs, blank_id, penalty).argmax(-1)
    assert torch.equal(penalized_argmax(log_probs, blank_id, penalty), expected)
    lengths = torch.tensor([50, 31, 1, 0])
    assert ctc_greedy_search(log_probs, lengths, blank_id, penalty) == ctc_greedy_search(
        penalized_copy(log_probs, blank_id, penalty), lengths, blank_id)


def test_a_positive_penalty_emits_more_tokens_and_zero_changes_nothing():
    log_probs = peaky_log_probs(3, 40, 9, seed=4, min_boost=0.0, max_boost=3.0)
    lengths = torch.full((3,), 40)
    counts = [sum(map(len, ctc_greedy_search(log_probs, lengths, 0, penalty))) for penalty in (-2.0, 0.0, 2.0)]
    assert counts[0] < counts[1] < counts[2]
    assert ctc_greedy_search(log_probs, lengths, 0, 0.0) == ctc_greedy_search(log_probs, lengths, 0)


@pytest.mark.parametrize("blank_id", [0, 2])
@pytest.mark.parametrize("penalty", [-0.7, 0.8])
def test_unbounded_prefix_beam_is_the_exact_maximum_of_the_penalized_scores(blank_id, penalty):
    generator = torch.Generator().manual_seed(7 + blank_id)
    log_probs = (2.0 * torch.randn(1, 5, 4, generator=generator, dtype=torch.float64)).log_softmax(-1)
    exact = brute_force_label_log_probs(penalized_copy(log_probs, blank_id, penalty)[0], blank_id)
    nbest = ctc_prefix_beam_search(log_probs, torch.tensor([5]), beam=500, blank_id=blank_id,
                                   return_nbest=True, blank_penalty=penalty)[0]
    assert len(nbest) == len(exact)
    for hypothesis in nbest:
        assert hypothesis.log_prob == pytest.approx(exact[tuple(hypothesis.tokens)], abs=1e-9)
    assert tuple(nbest[0].tokens) == max(exact, key=exact.get)


@pytest.mark.parametrize("beam", [1, 4])
def test_pruned_prefix_beam_matches_the_reference_on_the_penalized_scores(beam):
    # float64: the search subtracts the penalty in float64, as the copy then does.
    log_probs = peaky_log_probs(4, 30, 12, seed=beam, min_boost=0.0, max_boost=4.0).double()
    for blank_id, token_penalty, penalty in ((0, 0.0, 1.0), (5, 0.7, 0.3), (11, -0.3, -0.6)):
        nbest = ctc_prefix_beam_search(log_probs, torch.full((4,), 30), beam=beam, blank_id=blank_id,
                                       token_penalty=token_penalty, return_nbest=True, blank_penalty=penalty)
        scores = penalized_copy(log_probs, blank_id, penalty)
        for utterance, hypotheses in enumerate(nbest):
            reference = dict(reference_prefix_beam_search(scores[utterance], beam, blank_id, token_penalty))
            assert {tuple(h.tokens) for h in hypotheses} == set(reference)
            for hypothesis in hypotheses:
                assert hypothesis.log_prob == pytest.approx(reference[tuple(hypothesis.tokens)], abs=1e-9)


@pytest.mark.parametrize("sizes", [[40], [13, 13, 13, 1], [7, 0, 20, 13]])
def test_streaming_searches_with_a_penalty_equal_the_offline_ones(sizes):
    generator = torch.Generator().manual_seed(len(sizes))
    log_probs = (2.0 * torch.randn(40, 7, generator=generator, dtype=torch.float64)).log_softmax(-1)
    for penalty in (0.9, -0.4):
        beam = StreamingPrefixBeamSearch(beam=4, blank_id=2, token_penalty=0.3, blank_penalty=penalty)
        greedy = StreamingGreedySearch(blank_id=2, blank_penalty=penalty)
        for chunk in torch.split(log_probs, sizes):
            beam.advance(chunk)
            greedy.advance(chunk)
        offline = ctc_prefix_beam_search(log_probs[None], torch.tensor([40]), beam=4, blank_id=2, token_penalty=0.3,
                                         return_nbest=True, blank_penalty=penalty)[0]
        assert [h.tokens for h in beam.nbest()] == [h.tokens for h in offline]
        assert [h.log_prob for h in beam.nbest()] == pytest.approx([h.log_prob for h in offline], abs=1e-9)
        assert greedy.best() == ctc_greedy_search(log_probs[None], torch.tensor([40]), 2, penalty)[0]


def test_decode_settings_give_one_key_per_penalty_for_ctc_searches_only():
    options = DecodeOptions(methods=("ctc-greedy-search", "ctc-prefix-beam-search", "llm-greedy-search",
                                     "ctc-streaming-greedy-search"),
                            token_penalty=0.3, blank_penalty=(0.0, 0.5, 1.0, 0.5), history_seconds=(2,))
    assert options.blank_penalty == (0.0, 0.5, 1.0)
    assert [(s.key, s.blank_penalty) for s in decoding_settings(options)] == [
        ("ctc-greedy-search", 0.0), ("ctc-greedy-search_blank-penalty-0.5", 0.5),
        ("ctc-greedy-search_blank-penalty-1", 1.0),
        ("ctc-prefix-beam-search_beam-4_token-penalty-0.3", 0.0),
        ("ctc-prefix-beam-search_beam-4_token-penalty-0.3_blank-penalty-0.5", 0.5),
        ("ctc-prefix-beam-search_beam-4_token-penalty-0.3_blank-penalty-1", 1.0),
        ("llm-greedy-search", 0.0),
        ("ctc-streaming-greedy-search_history-2s", 0.0),
        ("ctc-streaming-greedy-search_blank-penalty-0.5_history-2s", 0.5),
        ("ctc-streaming-greedy-search_blank-penalty-1_history-2s", 1.0)]
    assert DecodeOptions(blank_penalty=0.25).blank_penalty == (0.25,)
    assert not method_of("llm-beam-search").uses_blank_penalty


def test_seam_merge_names_the_streaming_settings_only():
    from llm_ctc.streaming.table import best_setting

    options = DecodeOptions(methods=("ctc-greedy-search", "ctc-streaming-prefix-beam-search"), token_penalty=0.3,
                            history_seconds=(2, 8), seam_merge_seconds=0.64)
    keys = [s.key for s in decoding_settings(options)]
    assert keys == ["ctc-greedy-search",
                    "ctc-streaming-prefix-beam-search_beam-4_token-penalty-0.3_seam-merge-0.64s_history-2s",
                    "ctc-streaming-prefix-beam-search_beam-4_token-penalty-0.3_seam-merge-0.64s_history-8s"]
    # The tables read the history of a merged setting as of any other.
    assert best_setting({keys[1]: 1.0, keys[2]: 2.0, "ctc-streaming-prefix-beam-search_beam-4_history-2s": 3.0},
                        2, "beam") == keys[1]
    with pytest.raises(ValueError, match="decode.seam_merge_seconds merges the seams of the ctc-streaming-\\* methods"):
        DecodeOptions(methods=("ctc-greedy-search",), seam_merge_seconds=0.32)
    with pytest.raises(ValueError, match="decode.seam_merge_seconds must be a finite number of seconds >= 0"):
        DecodeOptions(methods=("ctc-streaming-greedy-search",), seam_merge_seconds=-0.32)


@pytest.mark.parametrize("bad", [(float("nan"),), (), (float("inf"), 0.0)])
def test_bad_blank_penalties_are_refused_by_name(bad):
    with pytest.raises(ValueError, match="decode.blank_penalty must be one or more finite numbers"):
        DecodeOptions(blank_penalty=bad)
    with pytest.raises((ValueError, TypeError), match="blank_penalty"):
        ctc_prefix_beam_search(torch.zeros(1, 2, 3), torch.tensor([2]), blank_penalty=float("nan"))


def test_the_override_reads_a_list_of_penalties():
    from asr.config import load_run_config

    assert load_run_config(None, ["decode.blank_penalty=0,0.5,-1.5"]).decode.blank_penalty == (0.0, 0.5, -1.5)
    with pytest.raises(ValueError, match="decode.blank_penalty"):
        load_run_config(None, ["decode.blank_penalty=half"])


class ArgmaxOnlyModel:
    """A stand-in recognizer: its best_frame_ids is the plain argmax (no penalty)."""

    def __init__(self, log_probs):
        self.scores = log_probs

    def best_frame_ids(self, features, feature_lens):
        return self.scores.argmax(-1), feature_lens

    def log_probs(self, features, feature_lens):
        return self.scores, feature_lens


def test_greedy_search_with_a_penalty_reads_the_log_probs_not_the_argmax_shortcut():
    log_probs = peaky_log_probs(2, 30, 6, seed=9, min_boost=0.0, max_boost=2.0)
    lengths = torch.full((2,), 30)
    model = ArgmaxOnlyModel(log_probs)
    plain = BatchOutputs(model, None, lengths, ["ctc-greedy-search"])
    penalized = BatchOutputs(model, None, lengths, ["ctc-greedy-search"], penalize_blank=True)
    settings = SearchSettings(blank_id=0, blank_penalty=1.5)
    method = method_of("ctc-greedy-search")
    assert not plain.ctc_outputs()[0].is_floating_point()
    assert method.run(penalized, settings, None).ids == ctc_greedy_search(penalized_copy(log_probs, 0, 1.5), lengths)
    with pytest.raises(ValueError, match="a blank penalty needs the log-probabilities"):
        ctc_search("ctc-greedy-search", plain.ctc_outputs()[0], lengths, 0, blank_penalty=1.5)
