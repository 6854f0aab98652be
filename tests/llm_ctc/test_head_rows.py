"""The frozen head's distinct rows (llm_ctc/head_rows.py): groups equal to those found by
comparing rows one by one; the loss, its gradient and decoding's log-probabilities over the
groups equal torch's CTC and log-softmax in float64 over all 151,936 rows."""

import dataclasses

import pytest
import torch

from llm_ctc.head_rows import find_row_groups, grouped_head, worth_grouping
from references.ctc_reference import dense_reference
from references.tiny_llm import random_features

TEXTS = ["hello world", "the cat", "Speech"]


def brute_force_groups(weight, bias, apart):
    """{first row: members} by comparing every row with every earlier group's first row."""
    groups = {}
    for row in range(weight.shape[0]):
        leader = None
        if row not in apart:
            leader = next((first for first in groups if first not in apart and torch.equal(weight[row], weight[first])
                           and (bias is None or bias[row] == bias[first])), None)
        groups.setdefault(row if leader is None else leader, []).append(row)
    return groups


@pytest.mark.parametrize("with_bias", [False, True])
def test_groups_are_the_rows_equal_in_weight_and_bias_with_apart_rows_alone(with_bias):
    torch.manual_seed(0)
    distinct = torch.randn(5, 3)
    choice = torch.tensor([2, 0, 2, 1, 2, 3, 0, 2, 4, 2, 1, 2])
    weight = distinct[choice]
    bias = torch.tensor([0.0, 1.0, 0.0, 0.0, 0.5, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0]) if with_bias else None
    apart = [7]
    groups = find_row_groups(weight, bias, apart=apart, rows_per_block=5)
    expected = brute_force_groups(weight, bias, apart)
    assert groups.first_rows.tolist() == sorted(expected)
    assert groups.counts.tolist() == [len(expected[first]) for first in sorted(expected)]
    for first, members in expected.items():
        group = groups.first_rows.tolist().index(first)
        assert (groups.group_of[members] == group).all()
    assert groups.counts[groups.group_of[7]] == 1
    assert with_bias or groups.counts[groups.group_of[0]] == 5  # rows 0, 2, 9, 11 and 4 share distinct[2]


def test_a_head_of_distinct_rows_is_not_grouped(ctc_model):
    assert ctc_model.head_groups is None
    groups = find_row_groups(ctc_model.head_weight, None, apart=[ctc_model.blank_id])
    assert groups.num_groups == ctc_model.head_weight.shape[0] and not worth_grouping(groups)


def test_split_targets_get_their_own_class_and_the_group_keeps_the_rest():
    weight = torch.tensor([[1.0, 0.0], [2.0, 0.0], [1.0, 0.0], [2.0, 0.0], [1.0, 0.0], [3.0, 0.0]])
    groups = find_row_groups(weight, None, apart=[5])
    head, bias, class_of = grouped_head(groups, weight, None, torch.tensor([2, 3, 1, 3]))
    # Group {0, 2, 4} keeps 0 and 4; group {1, 3} is split whole; 5 (apart) stays.
    assert head.tolist() == [[1.0, 0.0], [3.0, 0.0], [2.0, 0.0], [1.0, 0.0], [2.0, 0.0]]
    torch.testing.assert_close(bias, torch.tensor([2.0, 1.0, 1.0, 1.0, 1.0], dtype=torch.float64).log())
    assert class_of.tolist() == [0, 2, 3, 4, 0, 1]


@pytest.fixture(scope="module")
def shared_row_model(tiny_qwen3_dir, tmp_path_factory, ctc_config, qwen3_tokenizer):
    """The tiny LLM with egs/mini's head: every row outside the targets' tokens and the
    first 200 ids one shared vector (as local/pretrain_tiny_lm.py leaves unseen tokens), and
    two target rows made equal (a group that one batch splits whole)."""
    from transformers import AutoModelForCausalLM

    from llm_ctc.model import LLMCTCModel

    llm = AutoModelForCausalLM.from_pretrained(tiny_qwen3_dir)
    texts = [qwen3_tokenizer(t.lower(), add_special_tokens=False)["input_ids"] for t in TEXTS]
    used = torch.zeros(llm.lm_head.weight.shape[0], dtype=torch.bool)
    used[:200] = True
    used[[i for t in texts for i in t]] = True
    with torch.no_grad():
        head = llm.lm_head.weight
        head[~used] = head[150_000].clone()
        head[texts[1][1]] = head[texts[1][0]]  # "the" and " cat"
    folder = tmp_path_factory.mktemp("tiny-qwen3-shared-rows")
    llm.save_pretrained(folder)
    torch.manual_seed(3)
    config = dataclasses.replace(ctc_config, llm=str(folder), alignment_beam=float("inf"))
    model = LLMCTCModel(config, tokenizer=qwen3_tokenizer)
    return model, texts, (~used).nonzero().squeeze(1)


def test_the_shared_rows_are_one_group_and_blank_stays_alone(shared_row_model):
    model, texts, unused = shared_row_model
    groups = model.head_groups
    assert groups is not None
    assert model.blank_id in unused.tolist()
    shared = groups.group_of[unused[0]]
    assert int(groups.counts[shared]) == unused.numel() - 1  # blank is its own class
    assert int(groups.counts[groups.group_of[model.blank_id]]) == 1
    assert int(groups.counts[groups.group_of[texts[1][0]]]) == 2
    assert groups.num_groups == model.head_weight.shape[0] - (unused.numel() - 2) - 1


@pytest.mark.parametrize("targets_of", [
    lambda texts, unused: texts,  # the pair "the" / " cat" split whole, the shared row untouched
    lambda texts, unused: [texts[0] + [int(unused[5])], [int(unused[7]), int(unused[5])], texts[2]],  # shared rows
])
def test_loss_and_gradient_equal_dense_ctc_over_every_head_row(shared_row_model, targets_of):
    model, texts, unused = shared_row_model
    targets = targets_of(texts, unused)
    features, lengths = random_features([120, 96, 80], seed=4)
    with torch.no_grad():
        states, lens = model.ctc_states(features, lengths)
    states = states.double().requires_grad_(True)
    model.zero_grad(set_to_none=True)
    loss, stats = model.loss_of_states(states, lens, targets)
    loss.backward()
    losses, grad_states, _, grad_bias = dense_reference(states, model.head_weight, model.head_bias(), targets, lens,
                                                        blank_id=model.blank_id)
    assert stats["excluded"] == 0 and float(losses.sum()) > 1.0
    torch.testing.assert_close(loss.detach(), losses.sum(), rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(states.grad, grad_states, rtol=1e-7, atol=1e-9)
    # eta is the blank row's bias: its gradient is that entry of the dense bias gradient.
    assert abs(float(grad_bias[model.blank_id])) > 1.0
    torch.testing.assert_close(model.blank_offset.grad.double(), grad_bias[model.blank_id], rtol=1e-5, atol=1e-6)


def test_decoding_log_probs_equal_the_full_head_log_softmax(shared_row_model):
    model, texts, unused = shared_row_model
    features, lengths = random_features([120, 96], seed=6)
    with torch.no_grad():
        states, lens = model.ctc_states(features, lengths)
        log_probs = model.log_probs_of_states(states)
        logits = states.double() @ model.head_weight.double().t() + model.head_bias().double()
    assert log_probs.shape == (2, int(lens.max()), model.head_weight.shape[0]) and log_probs.dtype == torch.float32
    torch.testing.assert_close(log_probs.double(), logits.log_softmax(-1), rtol=0, atol=2e-5)


def test_targets_outside_the_head_or_with_blank_are_refused_by_name(shared_row_model):
    model, texts, unused = shared_row_model
    states = torch.zeros(1, 8, model.head_weight.shape[1], dtype=torch.float64)
    lens = torch.tensor([8])
    vocab = model.head_weight.shape[0]
    with pytest.raises(ValueError, match=rf"targets contain id {vocab}, outside \[0, V\) = \[0, {vocab}\)"):
        model.loss_of_states(states, lens, [[1, vocab]])
    with pytest.raises(ValueError, match=rf"targets contain the blank id {model.blank_id}"):
        model.loss_of_states(states, lens, [[1, model.blank_id]])


def test_greedy_frame_ids_equal_the_full_head_argmax(shared_row_model):
    model, texts, unused = shared_row_model
    features, lengths = random_features([120, 96], seed=7)
    with torch.no_grad():
        states, lens = model.ctc_states(features, lengths)
        # Two frames pointed at rows of their own: a shared row (its group's) and a token's.
        states[0, 0] = model.head_weight[unused[3]] * 3
        states[0, 1] = model.head_weight[texts[0][0]] * 3
        ids = model.frame_argmax(states)
        logits = states.double() @ model.head_weight.double().t() + model.head_bias().double()
    assert torch.equal(ids, logits.argmax(dim=-1))
    assert int(ids[0, 1]) == texts[0][0]
    shared = model.head_groups.group_of[unused[3]]
    # The shared direction: blank (the shared vector plus eta) or the group's first row.
    assert int(ids[0, 0]) in (model.blank_id, int(model.head_groups.first_rows[shared]))
