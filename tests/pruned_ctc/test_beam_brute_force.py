"""Finite-beam pruning against brute-force enumeration of every alignment (T <= 7, K <= 4),
with the retention rule applied literally (k2's output_beam semantics, paper App. B.3)."""

import math

import pytest
import torch

from pruned_ctc import pruned_ctc_loss
from pruned_ctc.alignment import align
from references.ctc_reference import brute_force_loss_and_occupancy


def align_one(scores, target, beam):
    """Runs the library's DP on one utterance with emission scores (T, K)."""
    frames = scores.shape[0]
    relabeled = torch.tensor([target], dtype=torch.int64).reshape(1, len(target))
    result = align(scores, torch.tensor([0]), torch.tensor([frames]), relabeled,
                   torch.tensor([len(target)]), torch.tensor([True]), beam, True)
    return result


def random_case(seed):
    generator = torch.Generator().manual_seed(seed)
    frames = int(torch.randint(2, 8, (1,), generator=generator))
    classes = int(torch.randint(2, 5, (1,), generator=generator))
    length = int(torch.randint(0, min(frames, 3) + 1, (1,), generator=generator))
    target = (torch.randint(1, classes, (length,), generator=generator)).tolist()
    spread = float(torch.rand((), generator=generator)) * 6 + 0.5
    scores = (torch.randn(frames, classes, generator=generator, dtype=torch.float64) * spread)
    scores = scores.log_softmax(-1)
    repeats = sum(a == b for a, b in zip(target, target[1:]))
    if frames < length + repeats:
        target = target[:1]
    return scores, target


@pytest.mark.parametrize("beam", [None, 0.5, 1.5, 3.0, 8.0])
def test_loss_and_occupancy_match_brute_force(beam):
    for seed in range(60):
        scores, target = random_case(seed)
        expected_loss, expected_occupancy, _ = brute_force_loss_and_occupancy(scores, target, beam)
        result = align_one(scores, target, beam)
        assert math.isclose(float(result.losses[0]), expected_loss, rel_tol=1e-12, abs_tol=1e-12), seed
        torch.testing.assert_close(result.occupancy, expected_occupancy, rtol=0, atol=1e-12)


def test_kept_arcs_recombine_into_alignments_below_the_beam():
    """Find a case where the retained set holds an alignment scoring below best - beam;
    such alignments count in the loss, as in k2."""
    beam = 1.0
    for seed in range(2000):
        scores, target = random_case(seed)
        expected_loss, expected_occupancy, retained = brute_force_loss_and_occupancy(
            scores, target, beam)
        best = max(score for _, _, score in retained)
        below = [a for a in retained if a[2] < best - beam]
        if not below:
            continue
        result = align_one(scores, target, beam)
        assert math.isclose(float(result.losses[0]), expected_loss, rel_tol=1e-12)
        torch.testing.assert_close(result.occupancy, expected_occupancy, rtol=0, atol=1e-12)
        # Dropping the recombined alignments would give a different (larger) loss.
        strict = [a[2] for a in retained if a[2] >= best - beam]
        strict_loss = -float(torch.logsumexp(torch.tensor(strict), 0))
        assert strict_loss > expected_loss + 1e-9
        return
    pytest.fail("no recombination case found in 2000 random cases")


def test_empty_retained_lattice_is_excluded_with_zero_gradient():
    """A target [1, 1] needs a blank between the repeats; with the blank's logit at -inf no
    alignment has a finite score, so nothing can be retained."""
    dim, vocab = 4, 3
    encoder_out = torch.randn(2, 5, dim, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(vocab, dim, dtype=torch.float64, requires_grad=True)
    bias = torch.tensor([-math.inf, 0.0, 0.0], dtype=torch.float64, requires_grad=True)
    targets = [[1, 1], [1, 2]]
    with pytest.warns(UserWarning, match="empty retained lattice: 1"):
        loss, stats = pruned_ctc_loss(encoder_out, weight, bias, targets, [5, 5], beam=10.0,
                                      reduction="none", return_stats=True)
    assert stats.num_empty_lattice == 1 and stats.excluded.tolist() == [True, False]
    assert loss[0].item() == 0.0 and math.isfinite(loss[1].item())
    loss.sum().backward()
    assert torch.equal(encoder_out.grad[0], torch.zeros_like(encoder_out.grad[0]))
    assert torch.isfinite(encoder_out.grad).all()

    with pytest.warns(UserWarning, match="nonfinite loss: 1"):
        _, exact_stats = pruned_ctc_loss(encoder_out, weight, bias, targets, [5, 5], beam=None,
                                         return_stats=True)
    assert exact_stats.num_nonfinite == 1


def test_small_beam_gradient_end_to_end_matches_brute_force_occupancy():
    """dL/dX = (p - gamma_beta) W over the retained alignments (paper Sec. 3.3)."""
    generator = torch.Generator().manual_seed(11)
    frames, dim, vocab, beam = 6, 5, 9, 2.0
    encoder_out = torch.randn(1, frames, dim, generator=generator, dtype=torch.float64) * 2
    weight = torch.randn(vocab, dim, generator=generator, dtype=torch.float64)
    bias = torch.randn(vocab, generator=generator, dtype=torch.float64)
    target = [4, 7, 4]
    selected = [0, 4, 7]
    x = encoder_out.clone().requires_grad_(True)
    loss = pruned_ctc_loss(x, weight, bias, [target], [frames], beam=beam, chunk_size=4)
    loss.backward()

    log_probs = (encoder_out[0] @ weight.t() + bias).log_softmax(-1)
    expected_loss, occupancy, _ = brute_force_loss_and_occupancy(
        log_probs[:, selected], [1, 2, 1], beam)
    grad_logits = log_probs.exp()
    grad_logits[:, selected] -= occupancy
    assert math.isclose(loss.item(), expected_loss, rel_tol=1e-12)
    torch.testing.assert_close(x.grad[0], grad_logits @ weight, rtol=0, atol=1e-12)


@pytest.mark.parametrize("beam", [None, 100.0, 1000.0])
def test_log_domain_fallback_when_scaled_sums_would_underflow(beam):
    """Scores 800 nats apart inside one frame underflow FP64 probabilities; the scaled
    passes detect it on the support and the sums are redone in the log domain."""
    scores = torch.zeros(6, 3, dtype=torch.float64)
    scores[:3, 2] = -800.0  # label 2 is nearly impossible early ...
    scores[3:, 1] = -800.0  # ... and label 1 late
    scores[2, 0] = -3.0
    expected_loss, expected_occupancy, _ = brute_force_loss_and_occupancy(scores, [1, 2], beam)
    result = align_one(scores, [1, 2], beam)
    assert result.used_log_domain == (beam != 100.0)
    assert math.isclose(float(result.losses[0]), expected_loss, rel_tol=1e-12)
    torch.testing.assert_close(result.occupancy, expected_occupancy, rtol=0, atol=1e-12)


def test_scaled_and_log_domain_sums_agree():
    for seed in range(20):
        scores, target = random_case(seed)
        for beam in (None, 2.0):
            relabeled = torch.tensor([target], dtype=torch.int64).reshape(1, len(target))
            arguments = (scores, torch.tensor([0]), torch.tensor([scores.shape[0]]), relabeled,
                         torch.tensor([len(target)]), torch.tensor([True]), beam, True)
            scaled = align(*arguments)
            logarithmic = align(*arguments, force_log_domain=True)
            assert not scaled.used_log_domain and logarithmic.used_log_domain
            torch.testing.assert_close(scaled.losses, logarithmic.losses, rtol=1e-13, atol=1e-14)
            torch.testing.assert_close(scaled.occupancy, logarithmic.occupancy, rtol=0,
                                       atol=1e-13)
