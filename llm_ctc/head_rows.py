"""The frozen head's distinct rows: the same loss and log-probabilities from fewer rows when
many rows of the head are equal.

The normalizer of eq. 1 sums exp(x . W_v + b_v) over every head row v. Equal rows (weight
and bias) give equal terms, so a group g of m_g equal rows is one term
exp(x . W_g + b_g + log m_g): the normalizer over the G distinct rows with log m_g added to
their bias is the same number, and so is its gradient (sum_v p_v W_v = sum_g m_g p_g W_g).
LLM-CTC's head is frozen (Sec. 4.2), so the groups are found once, when the model is built.

A class keeps its own probability, not its group's: a target whose row has equal twins is
split off for the batch (its own row with bias b_v, the rest of the group with
log(m_g - 1)), and decoding gives every row its group's logit minus the one normalizer;
greedy search takes the argmax over the groups, a group standing for its first row.

Which heads gain: a pretrained LLM's rows are distinct, and the groups are not used there
(:func:`worth_grouping`). egs/mini's tiny LM gives every token its training text never holds
one shared row (local/pretrain_tiny_lm.py, ``fill_unused_rows``): 151,143 of its 151,936
rows are that row, and the loss's head products run over about 800 rows instead.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence, Tuple

import torch
from torch import Tensor

from llm_ctc.head import head_logits

# Groups are used when they remove at least this fraction of the head's rows: below it the
# per-batch bookkeeping (split targets, index maps) buys little.
MIN_SAVED_FRACTION = 0.1


@dataclass
class RowGroups:
    """Groups of equal head rows, ordered by their first (smallest) row.

    first_rows: (G,) int64, each group's smallest row; counts: (G,) int64, m_g;
    group_of: (V,) int64, the group of every row."""

    first_rows: Tensor
    counts: Tensor
    group_of: Tensor

    @property
    def num_groups(self) -> int:
        return self.first_rows.numel()


def find_row_groups(weight: Tensor, bias: Optional[Tensor], apart: Sequence[int] = (),
                    rows_per_block: int = 4096) -> RowGroups:
    """Groups the rows of ``weight`` (V, D) (with ``bias`` (V,) or None) that are exactly
    equal; every row in ``apart`` (the blank row: its logit gets eta) is a group of its own.

    Rows are hashed by one float64 product with a fixed random vector, and each row is then
    compared with its candidate group's first row: a row that differs (a hash collision) is
    a group of its own, so a group only ever holds equal rows. No (V, D) copy: ``weight``
    is read ``rows_per_block`` rows at a time.
    """
    vocab, dim = weight.shape
    device = weight.device
    probe = torch.randn(dim + 1, dtype=torch.float64,
                        generator=torch.Generator().manual_seed(0)).to(device)
    keys = torch.empty(vocab, dtype=torch.float64, device=device)
    for start in range(0, vocab, rows_per_block):
        block = weight[start:start + rows_per_block].to(torch.float64)
        keys[start:start + block.shape[0]] = block @ probe[:dim]
        if bias is not None:
            keys[start:start + block.shape[0]] += bias[start:start + block.shape[0]].to(torch.float64) * probe[dim]
    rows = torch.arange(vocab, device=device)
    separate = torch.zeros(vocab, dtype=torch.bool, device=device)
    if len(apart):
        separate[torch.as_tensor(list(apart), dtype=torch.long, device=device)] = True
    _, candidate = torch.unique(keys, return_inverse=True)
    # Each candidate group's first row that is not kept apart (vocab: none).
    first = torch.full((int(candidate.max()) + 1,), vocab, dtype=torch.long, device=device)
    first.scatter_reduce_(0, candidate, torch.where(separate, vocab, rows), reduce="amin")
    leader = first[candidate]
    joins = ~separate & (leader < vocab)
    for start in range(0, vocab, rows_per_block):
        stop = min(start + rows_per_block, vocab)
        leaders = leader[start:stop].clamp(max=vocab - 1)
        equal = (weight[start:stop] == weight[leaders]).all(dim=1)
        if bias is not None:
            equal &= bias[start:stop] == bias[leaders]
        joins[start:stop] &= equal
    label = torch.where(joins, leader, rows)
    first_rows, group_of, counts = torch.unique(label, return_inverse=True, return_counts=True)
    return RowGroups(first_rows, counts, group_of)


def worth_grouping(groups: RowGroups) -> bool:
    """Whether the groups remove at least MIN_SAVED_FRACTION of the rows."""
    vocab = groups.group_of.numel()
    return vocab - groups.num_groups >= MIN_SAVED_FRACTION * vocab


def grouped_head(groups: RowGroups, weight: Tensor, bias: Optional[Tensor], split_rows: Tensor
                 ) -> Tuple[Tensor, Tensor, Tensor]:
    """The head of one loss call: (weight (G', D), float64 bias (G',), class of every row (V,)).

    ``split_rows``: the rows the call's targets name (any order, repeats allowed). Each of
    them that has equal twins becomes its own class (bias b_v); its group keeps the others
    (bias b_g + log of what is left) and disappears when none is left. Every other group is
    one class with bias b_g + log m_g. The normalizer over these classes is the full head's.
    """
    shared = split_rows.unique()
    shared = shared[groups.counts[groups.group_of[shared]] > 1]
    counts = groups.counts
    if shared.numel():
        counts = counts - torch.bincount(groups.group_of[shared], minlength=groups.num_groups)
    kept = torch.nonzero(counts > 0).squeeze(1)
    rows = torch.cat([groups.first_rows[kept], shared])
    log_counts = torch.cat([counts[kept].to(torch.float64).log(),
                            torch.zeros(shared.numel(), dtype=torch.float64, device=counts.device)])
    head_bias = log_counts if bias is None else bias[rows].to(torch.float64) + log_counts
    class_of_group = torch.full_like(counts, -1)
    class_of_group[kept] = torch.arange(kept.numel(), device=counts.device)
    class_of = class_of_group[groups.group_of]
    class_of[shared] = kept.numel() + torch.arange(shared.numel(), device=counts.device)
    return weight[rows], head_bias, class_of


def grouped_log_probs(groups: RowGroups, states: Tensor, weight: Tensor, bias: Tensor,
                      rows_per_block: int = 4096) -> Tensor:
    """Full-head log-probabilities (..., V) in float32 from the distinct rows: each row gets
    its group's logit minus the normalizer over groups (bias (V,) with eta on blank's row)."""
    logits = head_logits(states, weight[groups.first_rows], bias[groups.first_rows], rows_per_block)
    log_counts = groups.counts.to(torch.float32).log()
    normalizer = (logits + log_counts).logsumexp(dim=-1, keepdim=True)
    return (logits - normalizer).index_select(-1, groups.group_of)


def grouped_argmax(groups: RowGroups, states: Tensor, weight: Tensor, bias: Tensor,
                   rows_per_block: int = 4096) -> Tensor:
    """The best row of every state (...) int64 from the distinct rows: the argmax of the
    float32 logits, the first of equal maxima (a group's rows tie, its first row is the
    smallest, and the groups are in the order of their first rows)."""
    from llm_ctc.head_argmax import head_argmax  # looked up per call (benchmarks.llm_rtf.profile times it)

    best = head_argmax(states, weight[groups.first_rows], bias[groups.first_rows], rows_per_block)
    return groups.first_rows[best]


def describe(groups: RowGroups) -> str:
    vocab = groups.group_of.numel()
    largest = int(groups.counts.max())
    return (f"the frozen head's {vocab:,} rows are {groups.num_groups:,} distinct ones (the largest group "
            f"{largest:,} equal rows, log {math.log(largest):.2f})")
