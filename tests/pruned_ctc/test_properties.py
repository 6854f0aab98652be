"""Property-based: random shapes, targets, blanks and chunks against the dense reference."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pruned_ctc import pruned_ctc_loss
from references.ctc_reference import dense_reference, is_alignable, relative_error


@st.composite
def problems(draw):
    vocab_size = draw(st.integers(2, 60))
    blank_id = draw(st.integers(0, vocab_size - 1))
    num_utterances = draw(st.integers(1, 4))
    frame_counts = draw(st.lists(st.integers(1, 12), min_size=num_utterances,
                                 max_size=num_utterances))
    labels = st.integers(0, vocab_size - 2).map(lambda c: c + (c >= blank_id))
    targets = [draw(st.lists(labels, min_size=0, max_size=8)) for _ in range(num_utterances)]
    chunk_size = draw(st.integers(1, 70))
    beam = draw(st.sampled_from([None, 100.0]))
    seed = draw(st.integers(0, 2 ** 16))
    return vocab_size, blank_id, frame_counts, targets, chunk_size, beam, seed


@pytest.mark.filterwarnings("ignore::pruned_ctc.ExcludedUtteranceWarning")
@settings(max_examples=40, deadline=None)
@given(problems())
def test_random_problems_match_dense_reference(problem):
    vocab_size, blank_id, frame_counts, targets, chunk_size, beam, seed = problem
    generator = torch.Generator().manual_seed(seed)
    dim = 6
    encoder_out = torch.randn(len(frame_counts), max(frame_counts), dim, generator=generator,
                              dtype=torch.float64)
    weight = torch.randn(vocab_size, dim, generator=generator, dtype=torch.float64)
    bias = torch.randn(vocab_size, generator=generator, dtype=torch.float64)
    reference = dense_reference(encoder_out, weight, bias, targets, frame_counts, blank_id)
    tensors = [t.clone().requires_grad_(True) for t in (encoder_out, weight, bias)]
    losses, stats = pruned_ctc_loss(*tensors, targets, frame_counts, blank_id=blank_id,
                                    chunk_size=chunk_size, beam=beam, reduction="none",
                                    return_stats=True)
    expected_excluded = [not is_alignable(t, n) for t, n in zip(targets, frame_counts)]
    assert stats.excluded.tolist() == expected_excluded
    if all(expected_excluded):
        assert losses.abs().sum() == 0
        return
    losses.sum().backward()
    assert relative_error(losses, reference[0]) <= 1e-10
    for tensor, expected in zip(tensors, reference[1:]):
        assert relative_error(tensor.grad, expected) <= 1e-9
