"""Specifications of the CTC model (zipformer/model.py)."""

import time
import warnings

import pytest
import torch

from zipformer.model import CTCModel, parameter_groups
from zipformer.optim import Eden, ScaledAdam
from zipformer.presets import get_preset


def count_parameters(preset, vocab_size):
    with torch.device("meta"):
        model = CTCModel(get_preset(preset, vocab_size=vocab_size))
    return model.num_parameters()


@pytest.mark.parametrize("preset, vocab_size, expected", [
    ("S", 500, 22_115_335), ("M", 500, 64_244_843), ("L", 500, 147_000_750),
    ("M", 4336, 66_212_711)])
def test_parameter_counts_equal_icefall_without_its_unused_bypass_scale(
        preset, vocab_size, expected):
    # icefall reports S 22,118,279 / M 64,250,603 / L 147,010,094 / AISHELL M 66,218,471
    # (icefall egs/librispeech/ASR/RESULTS.md, "Number of model parameters"); each of its layers also holds an unused per-channel `bypass_scale`
    # (M: 5,760 values), which this encoder does not have.
    assert count_parameters(preset, vocab_size) == expected


def test_mini_preset_is_a_few_million_parameters():
    assert 2_000_000 <= count_parameters("mini", 500) <= 5_000_000


@pytest.fixture(autouse=True)
def single_thread():
    """Tiny models run fastest on one thread, and far faster on a loaded CI machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture()
def tiny_model():
    torch.manual_seed(0)
    return CTCModel(get_preset("tiny", vocab_size=30))


def batch(num_frames=(100, 90, 80, 70), seed=1):
    generator = torch.Generator().manual_seed(seed)
    features = torch.randn(len(num_frames), max(num_frames), 80, generator=generator)
    targets = [torch.randint(1, 30, (length,), generator=generator).tolist()
               for length in (8, 7, 6, 5)[: len(num_frames)]]
    return features, torch.tensor(num_frames), targets


def test_log_probs_cover_the_full_vocabulary(tiny_model):
    tiny_model.eval()
    features, lengths, _ = batch()
    with torch.no_grad():
        log_probs, out_lens = tiny_model.log_probs(features, lengths)
    assert log_probs.shape == (4, 23, 30) and log_probs.dtype == torch.float32
    assert out_lens.tolist() == [((t - 7) // 2 + 1) // 2 for t in (100, 90, 80, 70)]
    assert torch.allclose(log_probs.exp().sum(-1), torch.ones(4, 23), atol=1e-5)


def test_pruned_and_standard_losses_agree(tiny_model):
    tiny_model.eval()
    features, lengths, targets = batch()
    with torch.no_grad():
        tiny_model.config.loss = "pruned"
        pruned = tiny_model(features, lengths, targets)
        tiny_model.config.loss = "standard"
        standard = tiny_model(features, lengths, targets)
        log_probs, out_lens = tiny_model.log_probs(features, lengths)
    flat = torch.tensor(sum(targets, []))
    dense = torch.nn.functional.ctc_loss(
        log_probs.transpose(0, 1), flat, out_lens, torch.tensor([len(t) for t in targets]),
        reduction="sum")
    assert pruned.item() == pytest.approx(dense.item(), rel=1e-4)
    assert standard.item() == pytest.approx(dense.item(), rel=1e-4)


def test_padded_tensor_targets_are_accepted(tiny_model):
    tiny_model.eval()
    features, lengths, targets = batch()
    padded = torch.zeros(4, 8, dtype=torch.long)
    for i, target in enumerate(targets):
        padded[i, : len(target)] = torch.tensor(target)
    with torch.no_grad():
        from_lists = tiny_model(features, lengths, targets)
        from_tensor = tiny_model(features, lengths, padded,
                                 target_lengths=torch.tensor([len(t) for t in targets]))
    assert from_tensor.item() == pytest.approx(from_lists.item(), rel=1e-6)


def test_bf16_autocast_training_step_runs_head_and_loss_in_fp32(tiny_model):
    tiny_model.train()
    features, lengths, targets = batch()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        encoder_out, _ = tiny_model.encoder(features, lengths)
        loss = tiny_model(features, lengths, targets)
    assert encoder_out.dtype == torch.bfloat16
    assert loss.dtype == torch.float32 and torch.isfinite(loss)
    loss.backward()
    assert tiny_model.head.weight.grad.dtype == torch.float32
    assert all(torch.isfinite(p.grad).all() for p in tiny_model.parameters()
               if p.grad is not None)


def test_a_tiny_model_overfits_one_batch_with_scaled_adam_eden_and_pruned_ctc(tiny_model):
    torch.manual_seed(0)
    features, lengths, targets = batch()
    optimizer = ScaledAdam(tiny_model.parameters(), lr=0.1, clipping_scale=2.0)
    scheduler = Eden(optimizer, lr_batches=7500, lr_epochs=3.5, warmup_batches=50)
    tiny_model.train()
    start = time.time()
    first = None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for step in range(300):
            tiny_model.start_update(1, step)
            loss = tiny_model(features, lengths, targets)
            first = loss.item() if first is None else first
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            scheduler.step_batch()
            if loss.item() <= 0.1 * first:
                break
    assert loss.item() <= 0.1 * first, (first, loss.item(), step)
    print(f"overfit: {first:.1f} -> {loss.item():.2f} in {step + 1} steps, {time.time() - start:.1f} s")


def test_unknown_loss_is_named():
    with pytest.raises(ValueError, match="unknown loss 'ctc'; valid: pruned, standard"):
        CTCModel(get_preset("tiny", loss="ctc"))


def test_parameter_groups_follow_lr_scale_attributes(tiny_model):
    groups = parameter_groups(tiny_model, lr=0.045)
    assert len(groups) == 1 and groups[0]["lr"] == 0.045
    assert sum(p.numel() for p in groups[0]["params"]) == tiny_model.num_parameters()
    tiny_model.encoder.encoder_embed.lr_scale = 0.5
    groups = {g["lr"]: g["params"] for g in parameter_groups(tiny_model, lr=0.04)}
    embed = set(map(id, tiny_model.encoder.encoder_embed.parameters()))
    assert set(map(id, groups[0.02])) == embed
    assert len(groups[0.02]) + len(groups[0.04]) == len(list(tiny_model.parameters()))


def test_trained_stacks_train_only_the_top_stacks_with_the_whole_models_gradients():
    # In evaluation mode (no dropout, no random gradient modifiers) the partly trained model
    # computes what the whole one does, so the top stack's and the head's gradients must be
    # the whole model's; below, none.
    torch.manual_seed(0)
    whole = CTCModel(get_preset("tiny", vocab_size=30))
    top = CTCModel(get_preset("tiny", vocab_size=30, trained_stacks=1))
    top.load_state_dict(whole.state_dict())
    top.train()  # in training, what is frozen runs as decoding runs it
    assert not top.encoder.encoder_embed.training and not top.encoder.stacks[1].training
    assert top.encoder.stacks[2].training and top.head.training
    features, lengths, targets = batch()
    for model in (whole, top):
        model.eval()
        model(features, lengths, targets).backward()
    whole_grads = dict(whole.named_parameters())
    trained = {name for name, p in top.named_parameters() if p.grad is not None}
    frozen = {name for name, p in top.named_parameters() if p.grad is None}
    assert trained == {name for name, p in top.named_parameters() if p.requires_grad}
    assert {name.split(".")[0] + "." + name.split(".")[1] for name in frozen} == {
        "encoder.encoder_embed", "encoder.stacks"}
    assert all(name.startswith(("encoder.encoder_embed", "encoder.stacks.0", "encoder.stacks.1"))
               for name in frozen)
    assert any(name.startswith("encoder.stacks.2") for name in trained) and "head.weight" in trained
    for name, parameter in top.named_parameters():
        if parameter.grad is not None:
            torch.testing.assert_close(parameter.grad, whole_grads[name].grad, rtol=1e-4, atol=1e-6)
    groups = parameter_groups(top, lr=0.01)
    assert {id(p) for g in groups for p in g["params"]} == {id(p) for p in top.parameters() if p.requires_grad}


def test_trained_stacks_keep_the_frozen_weights_through_an_optimizer_step():
    torch.manual_seed(0)
    model = CTCModel(get_preset("tiny", vocab_size=30, trained_stacks=2))
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    optimizer = ScaledAdam(parameter_groups(model, 0.05), lr=0.05, clipping_scale=2.0)
    features, lengths, targets = batch()
    model.train()
    model(features, lengths, targets).backward()
    optimizer.step()
    changed = {name for name, p in model.named_parameters() if not torch.equal(p, before[name])}
    assert changed and all(not name.startswith(("encoder.encoder_embed", "encoder.stacks.0")) for name in changed)
    assert any(name.startswith("encoder.stacks.1") for name in changed)


@pytest.mark.parametrize("trained_stacks", [-1, 4])
def test_trained_stacks_outside_the_stacks_are_named(trained_stacks):
    with pytest.raises(ValueError, match=f"trained_stacks must be between 0 \\(all\\) and the 3 stacks, "
                                         f"got {trained_stacks}"):
        get_preset("tiny", trained_stacks=trained_stacks)


@pytest.mark.slow
def test_zipformer_m_trains_a_step_with_finite_gradients_everywhere():
    torch.manual_seed(0)
    model = CTCModel(get_preset("M", vocab_size=500))
    model.train()
    model.start_update(1, 30000.0)
    features = torch.randn(2, 400, 80)
    targets = [list(range(1, 40)), list(range(3, 30))]
    loss = model(features, torch.tensor([400, 321]), targets)
    loss.backward()
    assert torch.isfinite(loss)
    for name, param in model.named_parameters():
        assert param.grad is not None and torch.isfinite(param.grad).all(), name
