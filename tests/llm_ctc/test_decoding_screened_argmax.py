"""The screened head argmax (a BF16 product first, float32 only where the maximum can be)
chooses what the float32 head chooses: against float64 argmaxes, against the exact block
path, on near-ties that BF16 cannot separate, and in both systems' greedy decoding."""

import dataclasses

import pytest
import torch

from llm_ctc.head_argmax import bfloat16_screen, head_argmax
from references.tiny_llm import random_features


def head(rows, vocab, dim, seed, bfloat16_values):
    generator = torch.Generator().manual_seed(seed)
    states = torch.randn(rows, dim, generator=generator) * 3
    weight = torch.randn(vocab, dim, generator=generator) * dim ** -0.5 * 8
    bias = torch.randn(vocab, generator=generator)
    if bfloat16_values:  # a BF16 LLM's states and its head upcast to float32 (App. D.3)
        states, weight = states.bfloat16().float(), weight.bfloat16().float()
    return states, weight, bias


@pytest.mark.parametrize("bfloat16_values", [True, False])
@pytest.mark.parametrize("rows_per_block", [64, 1000, 4096])
def test_screened_argmax_is_the_float64_argmax(bfloat16_values, rows_per_block):
    states, weight, bias = head(40, 5000, 96, seed=1, bfloat16_values=bfloat16_values)
    reference = states.double() @ weight.double().t() + bias.double()
    top2 = reference.topk(2, dim=-1).values
    clear = (top2[:, 0] - top2[:, 1]) > 1e-4  # rows with one right answer
    assert clear.sum() >= 35
    screened = head_argmax(states, weight, bias, rows_per_block, screen=True)
    assert torch.equal(screened[clear], reference.argmax(-1)[clear])
    assert torch.equal(screened, head_argmax(states, weight, bias, rows_per_block))
    assert torch.equal(head_argmax(states, weight, None, rows_per_block, screen=True),
                       head_argmax(states, weight, None, rows_per_block))


def test_float32_differences_that_bfloat16_cannot_see_decide():
    """Rows equal in BF16 (the same screen logits) but not in float32: the screen keeps
    both rows' blocks and float32 picks the larger, wherever it is."""
    states, weight, bias = head(6, 300, 32, seed=2, bfloat16_values=True)
    bias = None
    best = (states @ weight.t()).argmax(-1)
    for row in range(states.shape[0]):
        # The same BF16 value; in float32 larger (odd rows: the twin wins) or smaller.
        twin = weight[best[row]] * (1 + (2.0 ** -12 if row % 2 else -2.0 ** -12))
        assert torch.equal(twin.bfloat16(), weight[best[row]].bfloat16())
        weight = torch.cat([weight, twin[None]])
    exact = head_argmax(states, weight, bias, rows_per_block=64)
    screened = head_argmax(states, weight, bias, rows_per_block=64, screen=True)
    assert torch.equal(screened, exact)
    reference = (states.double() @ weight.double().t()).argmax(-1)
    assert torch.equal(screened, reference)
    assert torch.equal(screened >= 300, torch.arange(6) % 2 == 1)


def test_equal_maxima_give_the_first_as_torch_argmax():
    states, weight, bias = head(5, 200, 16, seed=3, bfloat16_values=True)
    best = int((states[0] @ weight.t() + bias).argmax())
    weight, bias = torch.cat([weight, weight[best:best + 1]]), torch.cat([bias, bias[best:best + 1]])
    assert int(head_argmax(states, weight, bias, rows_per_block=32, screen=True)[0]) == best


def test_the_screen_is_made_once_per_weight_and_remade_after_a_change():
    _, weight, _ = head(1, 100, 8, seed=4, bfloat16_values=False)
    first, norm, exact = bfloat16_screen(weight)
    assert bfloat16_screen(weight)[0] is first and not exact
    assert norm == pytest.approx(float(weight.norm(dim=1).max()))
    with torch.no_grad():
        weight.copy_((weight * 2).bfloat16().float())
    second, norm2, exact2 = bfloat16_screen(weight)
    assert second is not first and exact2 and torch.equal(second.float(), weight)


def test_ctc_greedy_with_the_screen_gives_the_same_frames(ctc_model):
    from llm_ctc.decoding import best_frame_ids, recognize

    features, lengths = random_features([120, 90, 60], seed=35)
    exact_ids, _ = best_frame_ids(ctc_model, features, lengths)
    hypotheses = recognize(ctc_model, features, lengths)
    ctc_model.config.screened_argmax = True
    try:
        screened_ids, _ = best_frame_ids(ctc_model, features, lengths)
        assert torch.equal(screened_ids, exact_ids)
        assert recognize(ctc_model, features, lengths) == hypotheses
    finally:
        ctc_model.config.screened_argmax = False


def test_ce_greedy_with_the_screen_gives_the_same_tokens(ctc_config, tiny_untied_qwen3_dir, qwen3_tokenizer):
    from llm_ctc.ce_model import LLMCEModel

    torch.manual_seed(11)
    config = dataclasses.replace(ctc_config, llm=str(tiny_untied_qwen3_dir), objective="ce", max_new_tokens=8,
                                 lora_rank=0)
    model = LLMCEModel(config, tokenizer=qwen3_tokenizer).eval()
    features, lengths = random_features([90, 60], seed=17)
    exact = model.generate_ids(features, lengths)
    model.config.screened_argmax = True
    assert model.generate_ids(features, lengths) == exact
    assert model.generate_ids(features, lengths, use_cache=False) == exact


def test_a_row_that_bfloat16_ranks_lower_still_wins_in_float32():
    """a = (1 + 2^-8 + 2^-10, 0) rounds up to 1 + 2^-7 in BF16; b = (1 + 2^-8 - 2^-10, 2^-8)
    rounds to (1, 2^-8): BF16 ranks a above b, float32 ranks b above a. b's block is kept
    only through the margin."""
    states = torch.tensor([[1.0, 1.0]])
    filler = torch.full((62, 2), -1.0)
    a = torch.tensor([[1 + 2.0 ** -8 + 2.0 ** -10, 0.0]])
    b = torch.tensor([[1 + 2.0 ** -8 - 2.0 ** -10, 2.0 ** -8]])
    weight = torch.cat([a, filler, b, filler])  # a in block 0, b (row 63) in block 1
    low = (states.bfloat16() @ weight.bfloat16().t()).float()
    assert low[0, 0] > low[0, 63] and float(states @ b.t()) > float(states @ a.t())
    assert int(head_argmax(states, weight, None, rows_per_block=32, screen=True)[0]) == 63
