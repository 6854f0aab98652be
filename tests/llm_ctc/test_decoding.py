"""CTC decoding: full-head log-probabilities, search, detokenization (Mandarin, English);
greedy search by the argmax of the head's logits, without the log-softmax."""

import pytest
import torch

from asr.decode_methods import ctc_search
from llm_ctc.decoding import best_frame_ids, recognize
from llm_ctc.head_argmax import head_argmax
from llm_ctc.tokenizer import LLMTokenizer
from references.ctc_reference import collapse
from references.tiny_llm import QWEN3_HEAD_ROWS, random_features

TEXTS = ["Hello World, it's 3 o'clock", "鳕鱼与饕餮在龘龘之间", "混合 mixed 文本 text"]


@pytest.fixture(scope="module")
def llm_tokenizer(qwen3_tokenizer):
    return LLMTokenizer(qwen3_tokenizer, QWEN3_HEAD_ROWS, blank_id=151_669)


def test_round_trip_of_english_and_mandarin(llm_tokenizer, qwen3_tokenizer):
    ids = llm_tokenizer.encode(TEXTS)
    assert [llm_tokenizer.decode(i) for i in ids] == [text.lower() for text in TEXTS]
    # The Mandarin case really has byte-level pieces that are no text on their own.
    assert any("\ufffd" in qwen3_tokenizer.decode([i]) for i in ids[1])


def ctc_frames(ids, blank, frames_per_token=2):
    """Log-probs (T, V) whose best path is each id repeated, blanks between equal ids."""
    path = []
    for index, token in enumerate(ids):
        if index and ids[index - 1] == token:
            path.append(blank)
        path += [token] * frames_per_token
    path.append(blank)
    log_probs = torch.full((len(path), QWEN3_HEAD_ROWS), -30.0)
    log_probs[torch.arange(len(path)), torch.tensor(path)] = -1e-3
    return log_probs, path


@pytest.mark.parametrize("method", ["ctc-greedy-search", "ctc-prefix-beam-search"])
def test_search_then_detokenize_recovers_the_text(method, llm_tokenizer):
    ids = llm_tokenizer.encode(TEXTS)
    rows = [ctc_frames(i, llm_tokenizer.blank_id) for i in ids]
    width = max(r[0].shape[0] for r in rows)
    log_probs = torch.full((len(rows), width, QWEN3_HEAD_ROWS), -30.0)
    for n, (frames, path) in enumerate(rows):
        log_probs[n, :len(path)] = frames
        assert collapse(path, llm_tokenizer.blank_id) == ids[n]
    lengths = torch.tensor([len(path) for _, path in rows])
    found = ctc_search(method, log_probs, lengths, llm_tokenizer.blank_id, beam_size=4)
    assert found == ids
    assert llm_tokenizer.decode_batch(found) == [text.lower() for text in TEXTS]


def test_decode_drops_blank_unused_rows_and_special_tokens(llm_tokenizer, qwen3_tokenizer):
    ids = qwen3_tokenizer.encode("ok", add_special_tokens=False)
    noisy = [151_669] + ids + [151_800, 151_645]  # blank, text, unused row, <|im_end|>
    assert llm_tokenizer.decode(noisy) == "ok"


def test_model_log_probs_are_the_full_head_softmax(ctc_model):
    features, lengths = random_features([100, 70], seed=21)
    with torch.no_grad():
        log_probs, lens = ctc_model.log_probs(features, lengths)
        states, state_lens = ctc_model.ctc_states(features, lengths)
    assert log_probs.shape[2] == QWEN3_HEAD_ROWS and torch.equal(lens, state_lens)
    reference = (states.double() @ ctc_model.head_weight.double().t() + ctc_model.head_bias().double())
    reference = reference.log_softmax(-1)
    for n in range(2):
        torch.testing.assert_close(log_probs[n, :lens[n]].double(), reference[n, :lens[n]], rtol=0, atol=2e-4)
    ids, texts = recognize(ctc_model, features, lengths)
    expected = [collapse(reference[n, :lens[n]].argmax(-1).tolist(), ctc_model.blank_id) for n in range(2)]
    assert ids == expected
    assert texts == [ctc_model.tokenizer.decode([i for i in e if i < 151_669], skip_special_tokens=True)
                     for e in expected]


def test_unknown_method_is_an_error(llm_tokenizer):
    with pytest.raises(ValueError, match="unknown CTC search"):
        ctc_search("beam-search", torch.zeros(1, 2, 3), torch.tensor([2]), 0)


def toy_head(vocab=50, dim=8, seed=5):
    generator = torch.Generator().manual_seed(seed)
    return (torch.randn(3, 11, dim, generator=generator), torch.randn(vocab, dim, generator=generator),
            torch.randn(vocab, generator=generator))


@pytest.mark.parametrize("rows_per_block", [7, 16, 50, 64])
def test_head_argmax_is_the_argmax_of_the_float64_logits_in_any_blocks(rows_per_block):
    states, weight, bias = toy_head()
    reference = states.double() @ weight.double().t() + bias.double()
    top2 = reference.topk(2, dim=-1).values
    assert (top2[..., 0] - top2[..., 1]).min() > 1e-4  # no near-ties: one right answer per frame
    assert torch.equal(head_argmax(states, weight, bias, rows_per_block), reference.argmax(-1))
    assert torch.equal(head_argmax(states, weight, None, rows_per_block),
                       (states.double() @ weight.double().t()).argmax(-1))


def test_head_argmax_takes_the_first_of_equal_maxima_across_blocks():
    states, weight, bias = toy_head()
    best = int((states[0, 0] @ weight.t() + bias).argmax())
    weight, bias = torch.cat([weight, weight[best:best + 1]]), torch.cat([bias, bias[best:best + 1]])
    assert int(head_argmax(states, weight, bias, rows_per_block=7)[0, 0]) == best  # not the copy at row 50


def test_the_blank_offset_moves_frames_to_blank_before_the_argmax():
    from pruned_ctc import bias_with_blank_offset

    states, weight, bias = toy_head()
    blank = 3
    for eta in (0.0, 4.0, 50.0):
        biased = bias_with_blank_offset(bias, torch.tensor(eta), blank, weight)
        reference = (states.double() @ weight.double().t() + biased.double()).log_softmax(-1).argmax(-1)
        assert torch.equal(head_argmax(states, weight, biased, rows_per_block=16), reference)
    assert (reference == blank).all()  # eta = 50: every frame is blank


def test_greedy_by_argmax_gives_the_log_softmax_hypotheses(ctc_model):
    features, lengths = random_features([120, 90, 60], seed=33)
    with torch.no_grad():
        log_probs, lens = ctc_model.log_probs(features, lengths)
        frame_ids, frame_lens = best_frame_ids(ctc_model, features, lengths)
    assert torch.equal(frame_lens, lens)
    valid = torch.arange(log_probs.shape[1])[None, :] < lens[:, None]
    top2 = log_probs.topk(2, dim=-1).values
    assert (top2[..., 0] - top2[..., 1])[valid].min() > 1e-5  # ties excluded: one answer per frame
    assert torch.equal(frame_ids[valid], log_probs.argmax(-1)[valid])
    expected = ctc_search("ctc-greedy-search", log_probs, lens, ctc_model.blank_id)
    assert recognize(ctc_model, features, lengths)[0] == expected
    assert any(expected) and frame_ids[valid].unique().numel() > 2


def test_the_toolkit_decodes_greedy_by_argmax(ctc_model):
    adapter = ctc_model
    features, lengths = random_features([80, 64], seed=34)
    with torch.no_grad():
        frame_ids, lens = adapter.best_frame_ids(features, lengths)
        log_probs, log_prob_lens = adapter.log_probs(features, lengths)
    assert torch.equal(lens, log_prob_lens)
    for n in range(2):
        assert torch.equal(frame_ids[n, :lens[n]], log_probs[n, :lens[n]].argmax(-1))
