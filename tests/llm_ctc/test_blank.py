"""Blank row and blank-offset initialization (Sec. 4.2, App. D.2)."""

import logging
import math

import numpy as np
import pytest
import torch

from llm_ctc.blank import choose_blank_row, count_similar_rows, head_with_blank, initial_blank_offset
from references.tiny_llm import QWEN3_HEAD_ROWS, QWEN3_TOKENIZER_SIZE


def brute_force_count(weight: torch.Tensor, row: int, threshold: float) -> int:
    reference = weight[row].tolist()
    reference_norm = math.sqrt(sum(v * v for v in reference))
    count = 0
    for index in range(weight.shape[0]):
        values = weight[index].tolist()
        norm = math.sqrt(sum(v * v for v in values))
        if index == row or (norm > 0 and sum(a * b for a, b in zip(values, reference)) / (norm * reference_norm)
                            > threshold):
            count += 1
    return count


def planted_head(rows: int, dim: int, blank: int, near: list, far: list, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    weight = torch.randn(rows, dim, generator=generator)
    for index in near:  # cosine about 1 - 5e-5: counted
        weight[index] = 3.0 * weight[blank] + 0.01 * torch.randn(dim, generator=generator)
    for index in far:  # cosine about 0.99: not counted
        weight[index] = weight[blank] + 0.15 * torch.randn(dim, generator=generator) * weight[blank].norm() / 8
    return weight


def test_count_matches_brute_force_on_a_small_head():
    weight = planted_head(300, 16, blank=250, near=[3, 251, 299], far=[7, 252])
    expected = brute_force_count(weight, 250, 0.999)
    assert expected == 4
    assert count_similar_rows(weight, 250, rows_per_chunk=64) == expected
    assert initial_blank_offset(weight, 250) == pytest.approx(math.log(expected))


def test_count_on_a_real_size_qwen3_head():
    near = list(range(QWEN3_TOKENIZER_SIZE + 1, QWEN3_HEAD_ROWS, 7)) + [12, 151_000]
    weight = planted_head(QWEN3_HEAD_ROWS, 64, blank=QWEN3_TOKENIZER_SIZE, near=near, far=[5, 151_700], seed=1)
    blank, appended = choose_blank_row(weight.shape[0], QWEN3_TOKENIZER_SIZE)
    assert (blank, appended) == (151_669, False)
    rows, reference = weight.double(), weight[blank].double()
    cosine = (rows @ reference) / (rows.norm(dim=1) * reference.norm())
    expected = int(np.count_nonzero(cosine.numpy() > 0.999))
    assert expected == len(near) + 1
    assert count_similar_rows(weight, blank) == expected


def test_zero_blank_row_counts_only_itself():
    weight = torch.randn(10, 4)
    weight[9] = 0
    assert count_similar_rows(weight, 9) == 1


def test_tokenizer_using_every_row_gets_an_appended_zero_row(caplog):
    weight = torch.randn(8, 4)
    with caplog.at_level(logging.INFO):
        extended, bias, blank = head_with_blank(weight, None, tokenizer_size=8)
    assert blank == 8 and extended.shape == (9, 4)
    assert torch.equal(extended[:8], weight) and torch.all(extended[8] == 0) and torch.all(bias == 0)
    assert "appended zero row" in caplog.text


def test_head_with_free_rows_is_shared_not_copied():
    weight = torch.nn.Parameter(torch.randn(8, 4))
    shared, bias, blank = head_with_blank(weight, None, tokenizer_size=5)
    assert blank == 5 and shared.data_ptr() == weight.data_ptr() and not shared.requires_grad


@pytest.mark.parametrize("blank_id", [3, 10])
def test_blank_id_must_be_an_unused_row(blank_id):
    with pytest.raises(ValueError, match="blank_id"):
        choose_blank_row(8, 5, blank_id)


def test_tokenizer_larger_than_head_is_an_error():
    with pytest.raises(ValueError, match="do not belong together"):
        choose_blank_row(8, 9)


def test_model_blank_is_the_first_row_beyond_the_real_qwen3_tokenizer(ctc_model):
    assert len(ctc_model.tokenizer) == QWEN3_TOKENIZER_SIZE
    assert ctc_model.blank_id == QWEN3_TOKENIZER_SIZE
    assert ctc_model.extended_head_weight is None
    weight = ctc_model.head_weight.detach().double().numpy()
    blank_row = weight[QWEN3_TOKENIZER_SIZE]
    cosine = weight @ blank_row / (np.linalg.norm(weight, axis=1) * np.linalg.norm(blank_row))
    assert ctc_model.blank_offset.item() == pytest.approx(math.log(np.count_nonzero(cosine > 0.999)))
