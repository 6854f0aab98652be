"""Bad input gets a ValueError or TypeError that names the argument and the value."""

import pytest
import torch

from pruned_ctc import pruned_ctc_loss, standard_ctc_loss

X = torch.randn(2, 5, 4)
W = torch.randn(10, 4)
B = torch.randn(10)
TARGETS = [[1, 2], [3]]
LENS = torch.tensor([5, 4])


@pytest.mark.parametrize("loss_function", [pruned_ctc_loss, standard_ctc_loss])
@pytest.mark.parametrize("change,error,message", [
    (dict(encoder_out=torch.randn(2, 5)), ValueError, "encoder_out must have shape"),
    (dict(weight=torch.randn(10, 3)), ValueError, "D = 3"),
    (dict(bias=torch.randn(9)), ValueError, r"bias must have shape \(V,\) = \(10,\)"),
    (dict(encoder_out=X.to(torch.int32)), TypeError, "encoder_out has unsupported dtype"),
    (dict(encoder_out_lens=torch.tensor([6, 4])), ValueError, r"\[1, 5\].*\[6, 4\]"),
    (dict(encoder_out_lens=torch.tensor([0, 4])), ValueError, "encoder_out_lens must lie"),
    (dict(encoder_out_lens=torch.tensor([5.0, 4.0])), TypeError, "encoder_out_lens must hold integers"),
    (dict(encoder_out_lens=torch.tensor([5, 4, 3])), ValueError, "3 entries"),
    (dict(targets=[[1, 0], [3]]), ValueError, "blank id 0"),
    (dict(targets=[[1, 10], [3]]), ValueError, r"id 10, outside \[0, V\) = \[0, 10\)"),
    (dict(targets=[[1, -1], [3]]), ValueError, "id -1"),
    (dict(targets=[[1, 2]]), ValueError, "targets has 1 sequences"),
    (dict(targets=torch.tensor([[1, 2], [3, 0]])), ValueError, "target_lengths is required"),
    (dict(targets=[[1.5], [3]]), TypeError, r"targets\[0\] must hold integers"),
    (dict(chunk_size=0), ValueError, "chunk_size must be a positive integer, got 0"),
    (dict(chunk_size=2.5), ValueError, "chunk_size"),
    (dict(beam=-1.0), ValueError, "beam must be a positive finite float or None, got -1.0"),
    (dict(beam=float("nan")), ValueError, "beam"),
    (dict(beam=float("inf")), ValueError, "beam"),
    (dict(blank_id=10), ValueError, r"blank_id must be in \[0, V\)"),
    (dict(reduction="avg"), ValueError, "'avg'"),
])
def test_bad_argument_is_named(loss_function, change, error, message):
    arguments = dict(encoder_out=X, weight=W, bias=B, targets=TARGETS, encoder_out_lens=LENS)
    options = {k: v for k, v in change.items() if k in ("chunk_size", "beam", "blank_id",
                                                         "reduction")}
    arguments.update({k: v for k, v in change.items() if k not in options})
    with pytest.raises(error, match=message):
        loss_function(**arguments, **options)


def test_padded_targets_with_inconsistent_lengths():
    padded = torch.tensor([[1, 2], [3, 0]])
    with pytest.raises(ValueError, match="exceeds the padded targets' width 2"):
        pruned_ctc_loss(X, W, B, padded, LENS, target_lengths=torch.tensor([3, 1]))
    with pytest.raises(ValueError, match="sum to 4"):
        pruned_ctc_loss(X, W, B, torch.tensor([1, 2, 3]), LENS,
                        target_lengths=torch.tensor([2, 2]))


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_tensors_on_different_devices():
    with pytest.raises(ValueError, match="weight is on cuda"):
        pruned_ctc_loss(X, W.cuda(), B, TARGETS, LENS)


def test_weight_on_another_device_is_named():
    with pytest.raises(ValueError, match="weight is on meta but encoder_out is on cpu"):
        pruned_ctc_loss(X, W.to("meta"), B, TARGETS, LENS)


@pytest.mark.parametrize("shape", [(0, 5, 8), (2, 0, 8)])
def test_a_batch_without_frames_is_named(shape):
    with pytest.raises(ValueError, match=r"encoder_out \(.*\) holds no frames"):
        pruned_ctc_loss(torch.zeros(shape), torch.randn(10, 8), None, [[1]] * shape[0],
                        [1] * shape[0])
