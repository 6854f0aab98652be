"""Model options: a head without free rows, eager attention, parameter groups, config."""

import dataclasses
import logging

import pytest
import torch

from llm_ctc.config import LLMASRConfig
from llm_ctc.model import LLMCTCModel
from references.tiny_llm import (QWEN3_TOKENIZER_SIZE, assert_encoder_gradient_is_central_difference,
                                  assert_loss_equals_dense_ctc, random_features, tiny_qwen3_config)


@pytest.fixture(scope="module")
def full_vocabulary_llm_dir(tmp_path_factory):
    """A head with exactly the tokenizer's rows, as SmolLM2's 49,152 of 49,152."""
    from transformers import Qwen3ForCausalLM

    torch.manual_seed(41)
    folder = tmp_path_factory.mktemp("full-vocabulary")
    Qwen3ForCausalLM(tiny_qwen3_config(vocab_size=QWEN3_TOKENIZER_SIZE)).save_pretrained(folder)
    return folder


def test_head_without_free_rows_gets_an_appended_blank(full_vocabulary_llm_dir, ctc_config, qwen3_tokenizer,
                                                       caplog):
    config = dataclasses.replace(ctc_config, llm=str(full_vocabulary_llm_dir), alignment_beam=float("inf"))
    with caplog.at_level(logging.INFO):
        model = LLMCTCModel(config, tokenizer=qwen3_tokenizer)
    assert "appended zero row" in caplog.text
    assert model.blank_id == QWEN3_TOKENIZER_SIZE
    assert model.head_weight.shape[0] == QWEN3_TOKENIZER_SIZE + 1
    assert torch.all(model.head_weight[-1] == 0)
    assert torch.equal(model.head_weight[:-1], model.lm_head.weight)
    assert model.blank_offset.item() == 0.0  # c_bl = 1: a zero row has no direction
    features, lengths = random_features([90, 70], seed=42)
    assert_loss_equals_dense_ctc(model, features, lengths, model.encode_texts(["good", "day"]))


def test_eager_attention_reads_the_same_states_under_padding(ctc_config, qwen3_tokenizer):
    torch.manual_seed(43)
    model = LLMCTCModel(dataclasses.replace(ctc_config, attn_implementation="eager"), tokenizer=qwen3_tokenizer)
    assert model.llm.get_base_model().config._attn_implementation == "eager"
    features, lengths = random_features([90, 50], seed=44)
    with torch.no_grad():
        states, lens = model.ctc_states(features, lengths)
        alone, _ = model.ctc_states(features[1:, :50], lengths[1:])
    torch.testing.assert_close(states[1, :lens[1]], alone[0], rtol=1e-4, atol=1e-4)


def test_gradients_are_finite_under_padding(ctc_model):
    features, lengths = random_features([120, 40, 81], seed=45)
    ctc_model.zero_grad(set_to_none=True)
    loss, _ = ctc_model.loss(features, lengths, ctc_model.encode_texts(["a", "b", "c d"]))
    loss.backward()
    grads = [p.grad for p in ctc_model.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)
    ctc_model.zero_grad(set_to_none=True)


def test_parameter_groups_decay_matrices_only(ctc_model):
    decay, no_decay = ctc_model.parameter_groups(weight_decay=0.1)
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    trainable = [p for p in ctc_model.parameters() if p.requires_grad]
    grouped = decay["params"] + no_decay["params"]
    assert len(grouped) == len(trainable) and {id(p) for p in grouped} == {id(p) for p in trainable}
    assert all(p.dim() >= 2 for p in decay["params"]) and all(p.dim() < 2 for p in no_decay["params"])
    assert any(p is ctc_model.blank_offset for p in no_decay["params"])
    assert any(p is ctc_model.query for p in no_decay["params"])


def test_config_round_trips_through_a_dict(ctc_config):
    values = ctc_config.to_dict()
    assert isinstance(values["lora_targets"], list)
    assert LLMASRConfig.from_dict(values) == ctc_config


@pytest.mark.parametrize("field, value, message", [
    ("readout", "middle", "readout"), ("encoder_type", "whisper", "encoder_type"),
    ("lora_rank", -1, "lora_rank"), ("alignment_beam", 0.0, "alignment_beam"), ("llm_dtype", "int8", "llm_dtype"),
    ("projector_lr_scale", 0.0, "projector_lr_scale"), ("projector_lr_scale", float("nan"), "projector_lr_scale"),
    ("query_lr_scale", 0.0, "query_lr_scale"), ("query_lr_scale", -1.0, "query_lr_scale"),
])
def test_bad_config_values_name_the_field(field, value, message):
    with pytest.raises(ValueError, match=message):
        LLMASRConfig(**{field: value})


def test_unknown_config_field_is_named():
    with pytest.raises(ValueError, match="readouts"):
        LLMASRConfig.from_dict({"readouts": "query"})


def test_a_saved_model_section_with_the_old_keys_still_loads(ctc_config):
    """Checkpoints written before the renames: beam is read as alignment_beam, and
    ce_beam (never read by any code) is dropped."""
    saved = ctc_config.to_dict()
    del saved["alignment_beam"]
    saved.update(beam=37.0, ce_beam=4)
    assert LLMASRConfig.from_dict(saved) == dataclasses.replace(ctc_config, alignment_beam=37.0)


def test_the_optim_section_is_read_from_the_same_module():
    from asr.config import family_config_classes
    from llm_ctc.config import AdamWOptions

    assert family_config_classes("llm_ctc") == (LLMASRConfig, AdamWOptions)


def test_missing_encoder_checkpoint_is_a_clear_error(ctc_config, qwen3_tokenizer, tmp_path):
    config = dataclasses.replace(ctc_config, encoder_path=str(tmp_path / "missing.pt"))
    with pytest.raises(FileNotFoundError, match="encoder_path"):
        LLMCTCModel(config, tokenizer=qwen3_tokenizer)


def test_unknown_lora_target_is_named(ctc_config, qwen3_tokenizer):
    config = dataclasses.replace(ctc_config, lora_targets=("q_proj", "c_attn"))
    with pytest.raises(ValueError, match="c_attn"):
        LLMCTCModel(config, tokenizer=qwen3_tokenizer)


def test_activation_checkpointing_gives_the_same_loss_and_gradients(ctc_config, qwen3_tokenizer):
    features, lengths = random_features([80, 60], seed=46)
    results = []
    for checkpointing in (False, True):
        torch.manual_seed(47)
        model = LLMCTCModel(dataclasses.replace(ctc_config, activation_checkpointing=checkpointing),
                            tokenizer=qwen3_tokenizer).train()
        assert model.llm.get_base_model().is_activation_checkpointing == checkpointing
        loss, _ = model.loss(features, lengths, model.encode_texts(["one", "two"]))
        loss.backward()
        results.append((loss.detach(), {n: p.grad for n, p in model.named_parameters() if p.grad is not None}))
    (loss_off, grads_off), (loss_on, grads_on) = results
    torch.testing.assert_close(loss_on, loss_off)
    assert grads_on.keys() == grads_off.keys() and any("lora_" in n for n in grads_on)
    for name in grads_on:
        torch.testing.assert_close(grads_on[name], grads_off[name], rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("field, part", [("projector_lr_scale", "projector."), ("query_lr_scale", "query")])
def test_an_lr_scale_moves_its_part_that_many_times_as_far(ctc_config, qwen3_tokenizer, field, part):
    """model.projector_lr_scale 10 (model.query_lr_scale 10): the projector's groups (the
    query vector q's) at 10 x optim.lr, the rest at optim.lr; from the same weights and
    batch, AdamW's first step (its size lr per weight, whatever the gradient's) moves every
    weight of that part 10 times as far as with scale 1 and every other trainable weight
    exactly as far."""
    from llm_ctc.config import AdamWOptions
    from llm_ctc.family import build_optimizer

    assert ctc_config.readout == "query"
    features, lengths = random_features([90, 60], seed=48)
    moved = {}
    for scale in (1.0, 10.0):
        torch.manual_seed(49)
        model = LLMCTCModel(dataclasses.replace(ctc_config, **{field: scale}, lora_dropout=0.0),
                            tokenizer=qwen3_tokenizer).double()
        model.train()
        optimizer, scheduler = build_optimizer(model, AdamWOptions(lr=2e-3, warmup_batches=0, decay_batches=10))
        part_ids = {id(p) for name, p in model.named_parameters() if name.startswith(part)}
        rates = {(id(p) in part_ids, group["lr"]) for group in optimizer.param_groups for p in group["params"]}
        assert rates == ({(False, 2e-3), (True, 2e-3)} if scale == 1.0 else {(False, 2e-3), (True, 2e-2)})
        before = {name: p.detach().clone() for name, p in model.named_parameters() if p.requires_grad}
        loss, _ = model.loss(features.double(), lengths, model.encode_texts(["good day", "yes"]))
        loss.backward()
        optimizer.step()
        moved[scale] = {name: p.detach() - before[name] for name, p in model.named_parameters() if p.requires_grad}
    names = set(moved[1.0])
    assert any(n.startswith(part) for n in names) and any("lora_" in n for n in names)
    for name in names:
        factor = 10.0 if name.startswith(part) else 1.0
        assert moved[1.0][name].abs().max() > 0, name
        torch.testing.assert_close(moved[10.0][name], factor * moved[1.0][name], rtol=1e-9, atol=1e-15)


def test_query_init_starts_q_at_the_tokens_input_embedding(ctc_config, qwen3_tokenizer):
    config = dataclasses.replace(ctc_config, query_init="<|fim_pad|>")
    model = LLMCTCModel(config, tokenizer=qwen3_tokenizer)
    row = qwen3_tokenizer.convert_tokens_to_ids("<|fim_pad|>")
    assert torch.equal(model.query.detach(), model.llm.get_input_embeddings().weight[row].float())
    assert model.query.requires_grad
    checkpoint = model.checkpoint_state_dict()
    assert torch.equal(checkpoint["query"], model.query.detach())


def test_query_init_of_several_tokens_is_refused(ctc_config, qwen3_tokenizer):
    config = dataclasses.replace(ctc_config, query_init="two words")
    with pytest.raises(ValueError, match=r"model.query_init 'two words' is 2 tokens .* expected one"):
        LLMCTCModel(config, tokenizer=qwen3_tokenizer)


def test_a_trained_encoder_gets_the_true_gradient_at_its_own_learning_rate(ctc_config, qwen3_tokenizer):
    """model.encoder_lr_scale > 0: the encoder's weights train (their gradient checked
    against a central difference of the loss in float64, to the precision of the
    Zipformer's stored activation derivatives), at that fraction of optim.lr,
    still in evaluation mode, and are saved with the other trainable parameters."""
    from llm_ctc.config import AdamWOptions
    from llm_ctc.family import build_optimizer

    torch.manual_seed(46)
    frozen = LLMCTCModel(ctc_config, tokenizer=qwen3_tokenizer)
    assert not any(p.requires_grad for p in frozen.encoder.parameters())
    model = LLMCTCModel(dataclasses.replace(ctc_config, encoder_lr_scale=0.25), tokenizer=qwen3_tokenizer).double()
    model.train()
    assert not model.encoder.training and all(p.requires_grad for p in model.encoder.parameters())
    optimizer, _ = build_optimizer(model, AdamWOptions(lr=2e-3, warmup_batches=0, decay_batches=10))
    encoder_ids = {id(p) for p in model.encoder.parameters()}
    rates = {(id(p) in encoder_ids, group["lr"]) for group in optimizer.param_groups for p in group["params"]}
    assert rates == {(False, 2e-3), (True, 5e-4)}
    saved = model.checkpoint_state_dict()
    assert {f"encoder.{name}" for name, _ in model.encoder.named_parameters()} <= set(saved)

    features, lengths = random_features([90, 60], seed=47)
    features = features.double()
    targets = model.encode_texts(["good day", "yes"])
    assert_encoder_gradient_is_central_difference(model, lambda m: m.loss(features, lengths, targets)[0], seed=48)


def test_only_the_encoders_top_blocks_train(ctc_config, qwen3_tokenizer):
    """model.encoder_trained_blocks=N: only the Zipformer's last N stacks and its output
    downsampling get gradients, equal to those of the same weights in a wholly trained
    encoder; nothing below the lowest trained stack has a gradient or is saved."""
    whole = LLMCTCModel(dataclasses.replace(ctc_config, encoder_lr_scale=0.25), tokenizer=qwen3_tokenizer)
    top = LLMCTCModel(dataclasses.replace(ctc_config, encoder_lr_scale=0.25, encoder_trained_blocks=1),
                      tokenizer=qwen3_tokenizer)
    top.load_state_dict(whole.state_dict())
    stacks = top.encoder.zipformer.stacks
    assert len(stacks) == 3
    expected = {f"zipformer.stacks.2.{name}" for name, _ in stacks[2].named_parameters()} | {
        f"zipformer.downsample_output.{name}" for name, _ in top.encoder.zipformer.downsample_output.named_parameters()}
    assert {name for name, p in top.encoder.named_parameters() if p.requires_grad} == expected
    assert {name for name in top.checkpoint_state_dict() if name.startswith("encoder.")} == {
        f"encoder.{name}" for name in expected}

    features, lengths = random_features([90, 60], seed=49)
    targets = top.encode_texts(["good day", "yes"])
    for model in (whole, top):
        model.train()
        model.zero_grad(set_to_none=True)
        model.loss(features, lengths, targets)[0].backward()
    whole_grads = dict(whole.encoder.named_parameters())
    for name, parameter in top.encoder.named_parameters():
        if name in expected:
            assert parameter.grad is not None and parameter.grad.abs().sum() > 0, name
            torch.testing.assert_close(parameter.grad, whole_grads[name].grad, rtol=1e-5, atol=1e-7)
        else:
            assert parameter.grad is None and whole_grads[name].grad is not None, name


def test_encoder_trained_blocks_is_checked(ctc_config, qwen3_tokenizer):
    with pytest.raises(ValueError, match=r"model.encoder_trained_blocks must be between 0 \(all\) and this "
                                         r"encoder's 3 blocks, got 4"):
        LLMCTCModel(dataclasses.replace(ctc_config, encoder_lr_scale=0.1, encoder_trained_blocks=4),
                    tokenizer=qwen3_tokenizer)
    with pytest.raises(ValueError, match="model.encoder_trained_blocks=2 trains part of a frozen encoder"):
        dataclasses.replace(ctc_config, encoder_trained_blocks=2)
    with pytest.raises(ValueError, match="model.encoder_trained_blocks must be >= 0"):
        dataclasses.replace(ctc_config, encoder_lr_scale=0.1, encoder_trained_blocks=-1)
