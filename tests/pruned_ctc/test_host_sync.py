"""On a GPU the loss must not wait for the device once per vocabulary chunk or row block
(issue: "no per-chunk host synchronization"). Checked on any device by counting the
operators that read values back to the host: their number must not grow with the number
of chunks."""

import pytest
import torch

from pruned_ctc import pruned_ctc_loss
from references.head_batches import make_batch
from references.host_reads import HostReadCounter


def host_reads(chunk_size, reduction, frozen, beam):
    encoder_out, weight, bias, targets, lengths = make_batch(vocab_size=600, dtype=torch.float32)
    x = encoder_out.clone().requires_grad_(True)
    if not frozen:
        weight, bias = weight.clone().requires_grad_(True), bias.clone().requires_grad_(True)
    with HostReadCounter() as counter:
        loss = pruned_ctc_loss(x, weight, bias, targets, lengths, chunk_size=chunk_size, beam=beam,
                               reduction=reduction)
        (loss.sum() if loss.dim() else loss).backward()
    return counter.calls


@pytest.mark.parametrize("reduction, frozen", [("sum", False), ("mean", True), ("none", False)])
@pytest.mark.parametrize("beam", [None, 10.0])
def test_host_reads_do_not_grow_with_the_number_of_chunks(reduction, frozen, beam):
    few = host_reads(300, reduction, frozen, beam)   # 2 column chunks / row blocks of 60 frames
    many = host_reads(8, reduction, frozen, beam)    # 75 column chunks / 120 row blocks of one frame
    assert many == few, f"host reads with 2 chunks {few}, with 75 chunks {many}"
