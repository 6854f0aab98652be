"""Summed cross-entropy through a frozen LLM head, one block of head rows at a time.

LLM-CE's loss (Sec. 4.1, eq. 10) needs the full-vocabulary softmax (Qwen3: 151,936
classes) only at the |y_n| + 1 labeled positions. Writing the float32 logits of those
rows block by block into one (R, V) tensor under autograd makes every block's backward
copy the whole (R, V) gradient (``CopySlices``): with 38 blocks that was 65% of an LLM-CE
update on the mini recipe. Here no (R, V) tensor exists: the forward pass keeps a running
log-sum-exp per row and, when the states need a gradient, the gradient itself,

    d loss / d x_r = sum_v softmax(z_r)_v W_v - W_{y_r},    z_r = x_r W^T + b,

accumulated block by block with the online softmax's rescaling (two products per block;
the head is frozen: no gradient for W or b). Backward only scales it by the incoming
gradient. Memory beyond the inputs: (R, rows_per_block) logits and (R, D).
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor


def _block_logits(states: Tensor, weight: Tensor, bias: Optional[Tensor], start: int, stop: int) -> Tensor:
    block = states @ weight[start:stop].float().t()
    return block if bias is None else block + bias[start:stop].float()


class _FrozenHeadCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, states: Tensor, weight: Tensor, bias: Optional[Tensor], labels: Tensor,
                rows_per_block: int) -> Tensor:
        # float32 products even under bf16 autocast (the trainer's precision option).
        with torch.autocast(device_type=states.device.type, enabled=False):
            loss, gradient = _loss_and_gradient(states.detach().float(), weight, bias, labels, rows_per_block,
                                                ctx.needs_input_grad[0])
        ctx.save_for_backward(gradient)
        ctx.states_dtype = states.dtype
        return loss

    @staticmethod
    def backward(ctx, grad_loss: Tensor):
        (gradient,) = ctx.saved_tensors
        grad_states = None
        if ctx.needs_input_grad[0]:
            grad_states = (gradient * grad_loss).to(ctx.states_dtype)
        return grad_states, None, None, None, None


def _loss_and_gradient(inputs: Tensor, weight: Tensor, bias: Optional[Tensor], labels: Tensor,
                       rows_per_block: int, needs_gradient: bool):
    """One pass over the head's blocks: the running log-sum-exp of every row and, when
    needed, the running sum of exp(z_rv - max_r) W_v, both rescaled whenever a row's
    maximum grows (the online softmax), so each block costs two products at most."""
    vocab = weight.shape[0]
    running_max = inputs.new_full((inputs.shape[0],), float("-inf"))
    running_sum = inputs.new_zeros(inputs.shape[0])
    weighted_rows = inputs.new_zeros(inputs.shape) if needs_gradient else None
    for start in range(0, vocab, rows_per_block):
        stop = min(start + rows_per_block, vocab)
        block = _block_logits(inputs, weight, bias, start, stop)
        new_max = torch.maximum(running_max, block.max(dim=1).values)
        rescale = (running_max - new_max).exp()
        exps = (block - new_max[:, None]).exp()
        running_sum = running_sum * rescale + exps.sum(dim=1)
        if needs_gradient:
            weighted_rows = weighted_rows * rescale[:, None] + exps @ weight[start:stop].float()
        running_max = new_max
    normalizer = running_max + running_sum.log()
    label_rows = weight[labels].float()
    label_logits = (inputs * label_rows).sum(dim=1)
    if bias is not None:
        label_logits = label_logits + bias[labels].float()
    loss = (normalizer - label_logits).sum()
    # The expected head row under each row's softmax, minus the label's row.
    gradient = weighted_rows / running_sum[:, None] - label_rows if needs_gradient else None
    return loss, gradient


def frozen_head_cross_entropy(states: Tensor, weight: Tensor, bias: Optional[Tensor], labels: Tensor,
                              rows_per_block: int = 4096) -> Tensor:
    """sum_r -log softmax(states_r W^T + b)[labels_r], in float32 (the head's logits are
    float32, as :func:`llm_ctc.head.head_logits`). states (R, D) in any float dtype,
    differentiable; weight (V, D) and bias (V,) or None frozen; labels (R,) in [0, V)."""
    if states.dim() != 2 or weight.dim() != 2 or states.shape[1] != weight.shape[1]:
        raise ValueError(f"states must be (R, D) and weight (V, D) with the same D, got states "
                         f"{tuple(states.shape)} and weight {tuple(weight.shape)}")
    if weight.requires_grad or (bias is not None and bias.requires_grad):
        raise ValueError("frozen_head_cross_entropy gives no gradient to the head: its weight and bias "
                         "must not require grad (the LLM head stays frozen, Sec. 4.1)")
    if bias is not None and bias.shape != (weight.shape[0],):
        raise ValueError(f"bias must be ({weight.shape[0]},), got {tuple(bias.shape)}")
    if labels.shape != (states.shape[0],) or labels.dtype != torch.long:
        raise ValueError(f"labels must be a long tensor of shape ({states.shape[0]},), got "
                         f"{labels.dtype} {tuple(labels.shape)}")
    if labels.numel() and (int(labels.min()) < 0 or int(labels.max()) >= weight.shape[0]):
        raise ValueError(f"labels must lie in [0, {weight.shape[0]}), got {int(labels.min())}..{int(labels.max())}")
    if rows_per_block < 1:
        raise ValueError(f"rows_per_block must be >= 1, got {rows_per_block}")
    return _FrozenHeadCrossEntropy.apply(states, weight, bias, labels, rows_per_block)
