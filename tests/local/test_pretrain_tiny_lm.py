"""local.pretrain_tiny_lm: the loss it minimizes is the full-head cross-entropy of the
model it saves (reference: dense cross-entropy over every head row), and the probability
it reports each token can reach is the dense softmax at the state it names."""

import argparse

import pytest
import torch

pytest.importorskip("transformers")

import random  # noqa: E402

from local.pretrain_tiny_lm import (fill_unused_rows, main, padded_batch, reduced_loss, tiny_qwen3,  # noqa: E402
                                    training_sequences)

VOCAB = 300


def tiny_setup():
    torch.manual_seed(0)
    model = tiny_qwen3(argparse.Namespace(hidden=16, layers=1, heads=2), vocab_size=VOCAB)
    batch = [[5, 17, 42, 17, 5], [5, 99, 42, 5], [5, 17, 99, 250, 42, 5]]
    rows = torch.tensor(sorted({t for s in batch for t in s}))
    row_of = torch.full((VOCAB,), -1, dtype=torch.long)
    row_of[rows] = torch.arange(len(rows))
    unused = torch.nn.Parameter(torch.randn(16) * 0.5)
    return model, batch, rows, row_of, unused


def dense_loss(model, batch):
    ids, mask = padded_batch(batch)
    logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1].double()
    valid = mask[:, 1:].bool()
    return torch.nn.functional.cross_entropy(logits[valid], ids[:, 1:][valid])


def test_reduced_loss_is_the_full_head_cross_entropy_of_the_saved_model():
    model, batch, rows, row_of, unused = tiny_setup()
    optimizer = torch.optim.AdamW(list(model.parameters()) + [unused], lr=1e-2)
    for _ in range(3):
        loss = reduced_loss(model, batch, rows, row_of, unused)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    fill_unused_rows(model, rows, unused)
    with torch.no_grad():
        trained = reduced_loss(model, batch, rows, row_of, unused)
        reference = dense_loss(model, batch)
    assert float(trained) == pytest.approx(float(reference), rel=1e-5)


def test_unused_rows_share_one_vector_and_used_rows_keep_theirs():
    model, _, rows, _, unused = tiny_setup()
    before = model.lm_head.weight.detach().clone()
    fill_unused_rows(model, rows, unused)
    weight = model.lm_head.weight.detach()
    used = torch.zeros(VOCAB, dtype=torch.bool)
    used[rows] = True
    assert torch.equal(weight[used], before[used])
    assert torch.equal(weight[~used], unused.detach().expand(int((~used).sum()), -1))


def test_nameable_probability_is_the_dense_softmax_at_the_row_aligned_state():
    from local.pretrain_tiny_lm import nameable_probability

    model, _, rows, _, unused = tiny_setup()
    with torch.no_grad():
        model.model.norm.weight.uniform_(0.5, 2.0)
    fill_unused_rows(model, rows, unused)
    found = nameable_probability(model, rows, unused)
    weight = model.lm_head.weight.detach().double()
    gain = model.model.norm.weight.detach().double()
    for index, row in enumerate(rows.tolist()):
        # The final norm's output for an input x is gain * x / rms(x): take x along gain * W_row.
        x = gain * weight[row]
        state = gain * x / x.pow(2).mean().sqrt()
        expected = torch.softmax(weight @ state, dim=0)[row]
        assert float(found[index]) == pytest.approx(float(expected), rel=1e-4)



def test_training_sequences_add_the_chosen_fraction_doubled():
    transcripts = [[3, 4], [5], [6, 7, 8], [9, 10]]
    sequences = training_sequences(transcripts, 1, 0.5, random.Random(0))
    assert sequences[:4] == [[1, 3, 4, 1], [1, 5, 1], [1, 6, 7, 8, 1], [1, 9, 10, 1]]
    doubled = sequences[4:]
    assert len(doubled) == 2
    originals = [s[1:(len(s) - 3) // 2 + 1] for s in doubled]
    assert len({tuple(o) for o in originals}) == 2 and all(o in transcripts for o in originals)
    assert doubled == [[1] + o + [1] + o + [1] for o in originals]
    assert training_sequences(transcripts, 1, 0.0, random.Random(0)) == sequences[:4]


def test_copy_fraction_outside_zero_to_one_is_refused(tmp_path):
    with pytest.raises(SystemExit, match=r"--copy-fraction must be in \[0, 1\], got 1.5"):
        main([str(tmp_path / "lm"), "--manifests", str(tmp_path / "none.jsonl.gz"), "--copy-fraction", "1.5"])


def test_query_example_reads_each_position_of_its_block():
    from local.pretrain_tiny_lm import query_example

    rng = random.Random(0)
    assert query_example([3, 4, 5], 1, 9, 1, 0, rng) == ([1, 3, 4, 5, 9, 9, 9], [-1, -1, -1, -1, 3, 4, 5])
    assert query_example([3, 4, 5], 1, 9, 1, 2, rng) == ([1, 3, 4, 9, 9, 5, 9], [-1, -1, -1, 3, 4, -1, 5])


def test_query_example_stretches_each_token_one_to_stretch_times():
    from local.pretrain_tiny_lm import query_example

    tokens = [3, 4, 5, 6, 7, 8, 10, 11]
    counts = set()
    for seed in range(20):
        ids, targets = query_example(tokens, 1, 9, 4, 0, random.Random(seed))
        content = ids[1:ids.index(9)]
        runs = [(token, content.count(token)) for token in tokens]
        assert [t for t, c in runs for _ in range(c)] == content  # each token's copies together, in order
        counts |= {c for _, c in runs}
        assert ids[len(content) + 1:] == [9] * len(content) and targets[len(content) + 1:] == content
    assert counts == {1, 2, 3, 4}


def test_reduced_loss_scores_only_the_targets_of_an_example():
    from local.pretrain_tiny_lm import query_accuracy, query_example

    model, batch, rows, row_of, unused = tiny_setup()
    example = query_example([17, 42, 99], 5, 250, 2, 0, random.Random(1))
    fill_unused_rows(model, rows, unused)
    with torch.no_grad():
        loss = reduced_loss(model, [example], rows, row_of, unused)
        ids = torch.tensor([example[0]])
        logits = model(input_ids=ids).logits[0].double()
        scored = torch.tensor([t >= 0 for t in example[1]])
        reference = torch.nn.functional.cross_entropy(logits[scored], torch.tensor(example[1])[scored])
        assert float(loss) == pytest.approx(float(reference), rel=1e-5)
        accuracy = query_accuracy(model, [example], rows, row_of, unused)
        dense = float((logits[scored].argmax(-1) == torch.tensor(example[1])[scored]).double().mean())
        assert accuracy == pytest.approx(dense)


def test_query_fraction_outside_zero_to_one_is_refused(tmp_path):
    with pytest.raises(SystemExit, match=r"--query-fraction must be in \[0, 1\], got -0.5"):
        main([str(tmp_path / "lm"), "--manifests", str(tmp_path / "none.jsonl.gz"), "--query-fraction", "-0.5"])


def test_negative_threads_are_refused(tmp_path):
    with pytest.raises(SystemExit, match=r"--threads must be >= 0 \(0: the idle cores\), got -1"):
        main([str(tmp_path / "lm"), "--manifests", str(tmp_path / "none.jsonl.gz"), "--threads", "-1"])


def test_joined_texts_join_each_chosen_transcript_with_one_to_max_minus_one_others():
    from local.pretrain_tiny_lm import joined_texts

    texts = [f"sentence{i} says {i}" for i in range(40)]
    joined = joined_texts(texts, 0.5, 4, random.Random(0))
    assert len(joined) == 20
    firsts, lengths = [], set()
    for text in joined:
        words = text.split(" ")
        sentences = [" ".join(words[k:k + 3]) for k in range(0, len(words), 3)]
        assert all(s in texts for s in sentences) and text == " ".join(sentences)
        firsts.append(sentences[0])
        lengths.add(len(sentences))
    assert len(set(firsts)) == 20  # drawn without replacement
    assert lengths == {2, 3, 4}
    assert joined_texts(texts, 0.0, 4, random.Random(0)) == []


def write_supervisions(path, texts):
    import gzip
    import json

    with gzip.open(path, "wt", encoding="utf-8") as out:
        for i, text in enumerate(texts):
            out.write(json.dumps({"id": f"s{i}", "recording_id": f"r{i}", "start": 0.0, "duration": 1.0,
                                  "channel": 0, "text": text}) + "\n")


@pytest.mark.parametrize("join_fraction", [0.0, 1.0])
def test_joined_texts_train_the_head_row_of_a_sentence_start_after_a_join(tmp_path, join_fraction):
    """With the real Qwen3 tokenizer: "why" opening a text and " why" after another
    sentence are different tokens. Without joins " why" keeps the shared unused row,
    one the frozen head of LLM-CTC cannot name; joined texts train it."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from local.pretrain_tiny_lm import qwen3_tokenizer_dir

    tokenizer = AutoTokenizer.from_pretrained(qwen3_tokenizer_dir())
    alone, = tokenizer.encode("why", add_special_tokens=False)
    after = tokenizer.encode("go why", add_special_tokens=False)[-1]
    assert alone != after
    manifest = tmp_path / "supervisions.jsonl.gz"
    write_supervisions(manifest, ["why go", "why stop", "go now", "stop now"])
    out = tmp_path / "lm"
    main([str(out), "--manifests", str(manifest), "--hidden", "16", "--layers", "1", "--heads", "2",
          "--epochs", "1", "--threads", "1", "--join-fraction", str(join_fraction), "--join-max", "2"])
    head = AutoModelForCausalLM.from_pretrained(out).lm_head.weight.detach()
    unused = head[-1]  # the tokenizer has fewer tokens than the head has rows: a never-seen row
    assert not torch.equal(head[alone], unused)
    assert torch.equal(head[after], unused) == (join_fraction == 0.0)


def test_join_max_below_two_is_refused(tmp_path):
    with pytest.raises(SystemExit, match=r"--join-max must be >= 2 \(sentences in a joined text\), got 1"):
        main([str(tmp_path / "lm"), "--manifests", str(tmp_path / "none.jsonl.gz"), "--join-max", "1"])


@pytest.mark.parametrize("heads, kv_heads, expected", [(4, 0, 2), (4, 4, 4), (4, 1, 1), (1, 0, 1)])
def test_kv_heads_default_to_half_the_heads_and_size_the_value_projection(heads, kv_heads, expected):
    model = tiny_qwen3(argparse.Namespace(hidden=16, layers=1, heads=heads, kv_heads=kv_heads), vocab_size=VOCAB)
    assert model.config.num_key_value_heads == expected
    value = model.model.layers[0].self_attn.v_proj
    assert value.out_features == expected * (16 // heads)


def test_kv_heads_that_do_not_divide_heads_are_refused(tmp_path):
    with pytest.raises(SystemExit, match=r"--kv-heads must be 0 or a divisor of --heads 4, got 3"):
        main([str(tmp_path / "lm"), "--manifests", str(tmp_path / "none.jsonl.gz"), "--heads", "4",
              "--kv-heads", "3"])
