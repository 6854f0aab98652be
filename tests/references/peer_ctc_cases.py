"""Test cases of other CTC implementations, as logits (N, T, V) float32.

The facts (inputs, expected losses and gradients, tolerances) come from the public test
files named in each case's ``source``; where a peer draws random inputs, ours are drawn
here with the same shapes and the expectation is the peer's formula, computed in float64.
A tolerance (rtol, atol) is the peer's own; expected gradients are d(sum_n w_n L_n)/d
logits with the case's ``weights`` (1 each unless given).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

NAN, NEG_INF = float("nan"), float("-inf")


@dataclass
class PeerCase:
    name: str
    source: str
    logits: torch.Tensor  # (N, T, V) float32; frames beyond frame_counts may hold NaN
    targets: list
    frame_counts: list
    blank_id: int
    expected_losses: Optional[torch.Tensor] = None
    loss_tolerance: tuple = (0.0, 0.0)
    expected_gradient: Optional[torch.Tensor] = None
    gradient_tolerance: tuple = (0.0, 0.0)
    weights: Optional[list] = None
    excluded: Optional[list] = None  # utterances whose loss the peer reports as infinite


# Alex Graves' example as TensorFlow's ctc_loss_op_test.py (testBasic) gives it, blank 5:
# per-frame probabilities (the inputs are their logs), losses and gradients.
GRAVES_PROBABILITIES = [
    [[0.633766, 0.221185, 0.0917319, 0.0129757, 0.0142857, 0.0260553],
     [0.111121, 0.588392, 0.278779, 0.0055756, 0.00569609, 0.010436],
     [0.0357786, 0.633813, 0.321418, 0.00249248, 0.00272882, 0.0037688],
     [0.0663296, 0.643849, 0.280111, 0.00283995, 0.0035545, 0.00331533],
     [0.458235, 0.396634, 0.123377, 0.00648837, 0.00903441, 0.00623107]],
    [[0.30176, 0.28562, 0.0831517, 0.0862751, 0.0816851, 0.161508],
     [0.24082, 0.397533, 0.0557226, 0.0546814, 0.0557528, 0.19549],
     [0.230246, 0.450868, 0.0389607, 0.038309, 0.0391602, 0.202456],
     [0.280884, 0.429522, 0.0326593, 0.0339046, 0.0326856, 0.190345],
     [0.423286, 0.315517, 0.0338439, 0.0393744, 0.0339315, 0.154046]]]
GRAVES_GRADIENTS = [
    [[-0.366234, 0.221185, 0.0917319, 0.0129757, 0.0142857, 0.0260553],
     [0.111121, -0.411608, 0.278779, 0.0055756, 0.00569609, 0.010436],
     [0.0357786, 0.633813, -0.678582, 0.00249248, 0.00272882, 0.0037688],
     [0.0663296, -0.356151, 0.280111, 0.00283995, 0.0035545, 0.00331533],
     [-0.541765, 0.396634, 0.123377, 0.00648837, 0.00903441, 0.00623107]],
    [[-0.69824, 0.28562, 0.0831517, 0.0862751, 0.0816851, 0.161508],
     [0.24082, -0.602467, 0.0557226, 0.0546814, 0.0557528, 0.19549],
     [0.230246, 0.450868, 0.0389607, 0.038309, 0.0391602, -0.797544],
     [0.280884, -0.570478, 0.0326593, 0.0339046, 0.0326856, 0.190345],
     [-0.576714, 0.315517, 0.0338439, 0.0393744, 0.0339315, 0.154046]]]
GRAVES_TARGETS = [[0, 1, 2, 1, 0], [0, 1, 1, 0]]
GRAVES_LOSSES = [3.34211, 5.42262]


def _graves(name, source, tolerance, padding_frames=0, blank_first=False):
    """Graves' batch, optionally padded with NaN frames and with the classes rolled so
    that the blank comes first (MXNet's blank_label='first')."""
    logits = torch.tensor(GRAVES_PROBABILITIES, dtype=torch.float32).log()
    gradient = torch.tensor(GRAVES_GRADIENTS, dtype=torch.float32)
    logits = torch.cat([logits, torch.full((2, padding_frames, 6), NAN)], dim=1)
    gradient = torch.cat([gradient, torch.zeros(2, padding_frames, 6)], dim=1)
    targets, blank_id = GRAVES_TARGETS, 5
    if blank_first:
        logits, gradient = logits.roll(1, dims=2), gradient.roll(1, dims=2)
        targets, blank_id = [[c + 1 for c in t] for t in targets], 0
    return PeerCase(name, source, logits, targets, [5, 5], blank_id,
                    torch.tensor(GRAVES_LOSSES), tolerance, gradient, tolerance)


def _random_logits(shape, seed, low=None):
    generator = torch.Generator().manual_seed(seed)
    if low is None:
        return torch.randn(*shape, generator=generator)
    return torch.rand(*shape, generator=generator)  # uniform [0, 1), warp-ctc's genActs


def _one_to_one(logits, targets, frame_counts, weights):
    """optax's expectations where |target| = T (one alignment, no blank): loss = -sum_t
    log p_t(y_t), gradient w (softmax - onehot(y)) on valid frames, 0 beyond."""
    log_probs = logits.double().log_softmax(-1)
    losses, gradient = [], torch.zeros_like(log_probs)
    for n, (target, frames) in enumerate(zip(targets, frame_counts)):
        losses.append(-sum(float(log_probs[n, t, c]) for t, c in enumerate(target)))
        gradient[n, :frames] = log_probs[n, :frames].exp()
        gradient[n, torch.arange(frames), torch.tensor(target)] -= 1.0
        gradient[n] *= weights[n]
    return torch.tensor(losses, dtype=torch.float64), gradient


def _optax_padded():
    """optax _classification_test.py, test_with_one_to_one_alignment_and_paddings: 5
    utterances of 3-5 frames padded to 7, 13 classes, distinct labels; the loss is
    averaged over the batch; rtol 1e-6 on CPU, elementwise, for losses and gradients."""
    rng = np.random.default_rng(1234)
    logits = torch.tensor(rng.normal(size=(5, 7, 13)), dtype=torch.float32)
    frame_counts = rng.integers(3, 6, size=5).tolist()
    targets = [rng.permutation(np.arange(1, 13))[:n].tolist() for n in frame_counts]
    weights = [0.2] * 5
    losses, gradient = _one_to_one(logits, targets, frame_counts, weights)
    return PeerCase("optax_one_to_one_padded", "google-deepmind/optax "
                    "optax/losses/_classification_test.py", logits, targets, frame_counts, 0,
                    losses, (1e-6, 0.0), gradient, (1e-6, 0.0), weights)


def _optax_no_repeats():
    """optax test_with_one_to_one_alignment: 8 x 50 frames, 40 classes, no label equal
    to its predecessor; loss = -sum_t log p_t(y_t), rtol 1e-6."""
    generator = torch.Generator().manual_seed(5)
    logits = torch.randn(8, 50, 40, generator=generator)
    targets = []
    for _ in range(8):
        sequence = [int(torch.randint(1, 40, (1,), generator=generator))]
        while len(sequence) < 50:
            label = int(torch.randint(1, 40, (1,), generator=generator))
            if label != sequence[-1]:
                sequence.append(label)
        targets.append(sequence)
    losses, _ = _one_to_one(logits, targets, [50] * 8, [1.0] * 8)
    return PeerCase("optax_one_to_one", "google-deepmind/optax "
                    "optax/losses/_classification_test.py", logits, targets, [50] * 8, 0,
                    losses, (1e-6, 0.0))


def _optax_repeats():
    """optax test_repeat_with_one_to_one_alignment: repeated labels in exactly as many
    frames as the minimal alignment needs; loss = minus its log-probability, rtol 1e-6."""
    targets = [[1, 2, 2, 3], [2, 3, 4, 4], [1, 1, 1, 1], [1, 1, 2, 3], [1, 1, 1, 2]]
    alignments = [[1, 2, 0, 2, 3], [2, 3, 4, 0, 4], [1, 0, 1, 0, 1, 0, 1], [1, 0, 1, 2, 3],
                  [1, 0, 1, 0, 1, 2]]
    logits = _random_logits((5, 7, 5), seed=6)
    log_probs = logits.double().log_softmax(-1)
    losses = torch.tensor([-sum(float(log_probs[n, t, c]) for t, c in enumerate(a))
                           for n, a in enumerate(alignments)], dtype=torch.float64)
    return PeerCase("optax_repeats_minimal_alignment", "google-deepmind/optax "
                    "optax/losses/_classification_test.py", logits, targets,
                    [len(a) for a in alignments], 0, losses, (1e-6, 0.0))


def _warp_small():
    """warp-ctc tests/test_cpu.cpp small_test: exp(-loss) = p_0(1) p_1(2) within 1e-6,
    i.e. 1e-6 / p on the loss."""
    logits = torch.tensor([[[0.1, 0.6, 0.1, 0.1, 0.1], [0.1, 0.1, 0.6, 0.1, 0.1]]])
    probs = logits.double().softmax(-1)
    probability = float(probs[0, 0, 1] * probs[0, 1, 2])
    return PeerCase("warp_ctc_small", "baidu-research/warp-ctc tests/test_cpu.cpp", logits,
                    [[1, 2]], [2], 0, torch.tensor([-math.log(probability)]),
                    (0.0, 1e-6 / probability))


def _warp_labels(length, vocab_size, generator):
    """Random labels with warp-ctc's genLabels repeat: three equal labels in the middle."""
    labels = torch.randint(1, vocab_size, (length,), generator=generator).tolist()
    if length >= 3:
        labels[length // 2 - 1] = labels[length // 2 + 1] = labels[length // 2]
    return labels


def _warp_grad_check(vocab_size, frames, length, batch):
    """warp-ctc test_cpu.cpp run_tests sizes: uniform [0, 1) activations, gradients
    against central differences (its bound is looser than the float64 reference's here)."""
    generator = torch.Generator().manual_seed(vocab_size * 1000 + batch)
    logits = torch.rand(batch, frames, vocab_size, generator=generator)
    targets = [_warp_labels(length, vocab_size, generator) for _ in range(batch)]
    return PeerCase(f"warp_ctc_grad_check_{vocab_size}x{frames}x{length}x{batch}",
                    "baidu-research/warp-ctc tests/test_cpu.cpp", logits, targets,
                    [frames] * batch, 0)


def _warp_impossible_label():
    """warp-ctc test_cpu.cpp inf_test: 15 classes, 50 frames, 10 labels, the first label
    2, whose class has probability 0 at every frame: the loss is infinite and no gradient
    may be NaN (here: the utterance is excluded, its gradient exactly 0)."""
    generator = torch.Generator().manual_seed(15)
    logits = torch.rand(1, 50, 15, generator=generator)
    logits[0, :, 2] = NEG_INF
    targets = [_warp_labels(10, 15, generator)]
    targets[0][0] = 2
    return PeerCase("warp_ctc_impossible_label", "baidu-research/warp-ctc tests/test_cpu.cpp",
                    logits, targets, [50], 0, excluded=[True])


K2_TOLERANCE = (1e-5, 1e-8)  # torch.allclose's defaults, which k2's tests use
K2_SOURCE = "k2-fsa/k2 k2/python/tests/ctc_loss_test.py"
K2_FRAMES = {
    "k2_ctc_case1": ([[0.2] * 5], [1], 1.6094379425049),
    "k2_ctc_case2": (torch.arange(1, 16, dtype=torch.float32).reshape(3, 5).tolist(), [3, 3],
                     7.355742931366),
    "k2_ctc_case3": ([[-5, -4, -3, -2, -1], [-10, -9, -8, -7, -6], [-15, -14, -13, -12, -11]],
                     [2, 3], 4.938850402832),
}


def _k2_cases():
    cases = [PeerCase(name, K2_SOURCE, torch.tensor([frames], dtype=torch.float32), [target],
                      [len(frames)], 0, torch.tensor([loss]), K2_TOLERANCE)
             for name, (frames, target, loss) in K2_FRAMES.items()]
    # test_case4: the three in one batch (3, 2, 1 order), zero-padded, losses scaled.
    order = ["k2_ctc_case3", "k2_ctc_case2", "k2_ctc_case1"]
    logits = torch.zeros(3, 3, 5)
    for n, name in enumerate(order):
        frames = torch.tensor(K2_FRAMES[name][0], dtype=torch.float32)
        logits[n, :frames.shape[0]] = frames
    cases.append(PeerCase("k2_ctc_case4_batch", K2_SOURCE, logits,
                          [K2_FRAMES[name][1] for name in order], [3, 3, 1], 0,
                          torch.tensor([K2_FRAMES[name][2] for name in order]), K2_TOLERANCE,
                          weights=[1.0, -2.0, 3.5]))
    return cases


MXNET_TOLERANCE = (1e-4, 1e-3)  # assert_almost_equal's float32 defaults (mxnet test_utils.py)
MXNET_SOURCE = "apache/mxnet tests/python/unittest/test_operator.py"


def _mxnet_cases():
    """test_ctc_loss tests 1-2 and test_ctc_loss_with_large_classes; blank first, label 0
    ends a padded label row. Inputs are (T, N, V) there."""
    acts1 = [[[1.2, 3.4, 1.2, -0.1, -2.34]] * 2, [[0.1, 0.2, 0.3, 0.22, 0.123]] * 2,
             [[-15, -14, -13, -12, -11]] * 2]
    acts2 = [[[-5, -4, -3, -2, -1], [1.2, 3.4, 1.2, -0.1, -2.34]],
             [[-10, -9, -8, -7, -6], [0.1, 0.2, 0.3, 0.22, 0.123]],
             [[-15, -14, -13, -12, -11], [-15, -14.2, -13.5, -12.2, -11.22]]]
    # 6,000 classes: column i of a (6000, 16) table is arange(6000) rolled by i, over 13,
    # the table then read in memory order as (8 frames, 2 utterances, 6000).
    table = (torch.arange(6000).unsqueeze(1) - torch.arange(16).unsqueeze(0)) % 6000 / 13.0
    large = table.to(torch.float32).reshape(8, 2, 6000)
    return [
        PeerCase("mxnet_ctc_test1", MXNET_SOURCE,
                 torch.tensor(acts1, dtype=torch.float32).transpose(0, 1), [[2, 3], [2, 3]],
                 [3, 3], 0, torch.tensor([4.04789, 4.04789]), MXNET_TOLERANCE),
        PeerCase("mxnet_ctc_test2", MXNET_SOURCE,
                 torch.tensor(acts2, dtype=torch.float32).transpose(0, 1), [[2, 3, 1], [2]],
                 [3, 3], 0, torch.tensor([7.3557, 5.4091]), MXNET_TOLERANCE),
        PeerCase("mxnet_ctc_6000_classes", MXNET_SOURCE, large.transpose(0, 1),
                 [[100, 200, 300, 400, 500], [1000, 2000, 3000, 4000]], [8, 8], 0,
                 torch.tensor([688.02826, 145.34462]), MXNET_TOLERANCE),
    ]


FLASHLIGHT_SOURCE = "flashlight/wav2letter src/criterion/test/CriterionTest.cpp"
FLASHLIGHT_TOLERANCE = (0.0, 1e-5)  # kEpsilon


def _flashlight_cases():
    """CTCCost (blank last): case 1 -inf logits, one alignment of probability 1, loss 0
    (its gradient is then 0); case 2 uniform over 4 classes, loss -log(0.25^3 * 5).
    CTCEmptyTarget: empty targets, no NaN (loss -sum_t log p_t(blank))."""
    peaked = torch.tensor([[[0.0, NEG_INF], [NEG_INF, 0.0], [0.0, NEG_INF]]])
    empty = _random_logits((5, 2, 3), seed=7)
    return [
        PeerCase("flashlight_ctc_cost_minus_inf", FLASHLIGHT_SOURCE, peaked, [[0, 0]], [3], 1,
                 torch.tensor([0.0]), FLASHLIGHT_TOLERANCE, torch.zeros(1, 3, 2),
                 FLASHLIGHT_TOLERANCE),
        PeerCase("flashlight_ctc_cost_uniform", FLASHLIGHT_SOURCE, torch.zeros(1, 3, 4),
                 [[1, 2]], [3], 3, torch.tensor([-math.log(0.25 ** 3 * 5)]),
                 FLASHLIGHT_TOLERANCE),
        PeerCase("flashlight_ctc_empty_target", FLASHLIGHT_SOURCE, empty, [[]] * 5, [2] * 5, 2,
                 -empty.double().log_softmax(-1)[:, :, 2].sum(1), FLASHLIGHT_TOLERANCE),
    ]


def _pytorch_cases():
    """test_nn.py's CTC tests: an empty target's loss is minus the sum of the blank
    log-probabilities; with zero_infinity a target longer than the input gives a zero loss
    and a gradient without NaN (here: excluded, gradient exactly 0)."""
    generator = torch.Generator().manual_seed(8)
    empty = torch.randn(3, 50, 15, generator=generator)
    long_targets = torch.randn(3, 50, 15, generator=generator)
    targets = [torch.randint(1, 15, (n,), generator=generator).tolist() for n in (60, 25, 20)]
    source = "pytorch/pytorch test/test_nn.py"
    return [
        PeerCase("pytorch_empty_targets", source, empty, [[]] * 3, [50, 20, 50], 0,
                 torch.stack([-empty.double().log_softmax(-1)[n, :t, 0].sum()
                              for n, t in enumerate([50, 20, 50])]), (1e-6, 0.0)),
        PeerCase("pytorch_target_longer_than_input", source, long_targets, targets,
                 [50, 50, 50], 0, excluded=[True, False, False]),
    ]


def peer_cases() -> list[PeerCase]:
    return [
        _graves("tensorflow_graves_nan_padded",
                "tensorflow/tensorflow tensorflow/python/kernel_tests/nn_ops/ctc_loss_op_test.py",
                (1e-6, 1e-6), padding_frames=2),
        _graves("mxnet_graves_blank_first_nan_padded", MXNET_SOURCE, (1e-5, 1e-5),
                padding_frames=2, blank_first=True),
        _graves("warp_ctc_graves_options", "baidu-research/warp-ctc tests/test_cpu.cpp",
                (0.0, 1e-4)),
        _warp_small(), _warp_grad_check(20, 50, 15, 1), _warp_grad_check(5, 10, 5, 65),
        _warp_impossible_label(),
        *_k2_cases(), *_mxnet_cases(),
        _optax_no_repeats(), _optax_padded(), _optax_repeats(),
        *_flashlight_cases(), *_pytorch_cases(),
    ]
