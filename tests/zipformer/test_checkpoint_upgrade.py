"""Checkpoint format versions: version-1 files are refused, then converted by
zipformer.checkpoint_upgrade into files that compute what the version-1 model computed."""

import pytest
import torch

from zipformer.attention import CompactRelPositionalEncoding
from asr.averaging import weights_for_decoding
from asr.checkpoint import (
    CHECKPOINT_FORMAT_VERSION, CheckpointFormatError, load_checkpoint, save_checkpoint,
)
from zipformer.checkpoint_upgrade import main, mirror_positional_weights
from zipformer.model import CTCModel
from zipformer.presets import get_preset


def tiny_model(seed=0):
    torch.manual_seed(seed)
    model = CTCModel(get_preset("tiny", vocab_size=7)).eval()
    with torch.no_grad():  # make the positional part matter: scale linear_pos up
        for name, param in model.named_parameters():
            if name.endswith("linear_pos.weight"):
                param.normal_(0.0, 1.0)
    return model


def write_version_1(path, model):
    """A file as written before format versions: no "format_version" entry."""
    save_checkpoint(path, model=model, config={"model": {}}, batch_idx_train=0, epoch=1)
    contents = torch.load(path, weights_only=False)
    del contents["format_version"]
    torch.save(contents, path)


def test_version_1_checkpoints_are_refused_naming_the_version(tmp_path):
    path = tmp_path / "epoch-1.pt"
    write_version_1(path, tiny_model())
    with pytest.raises(CheckpointFormatError, match="format version 1; this code reads version 2"):
        load_checkpoint(path, model=tiny_model())
    with pytest.raises(CheckpointFormatError, match="zipformer.checkpoint_upgrade"):
        weights_for_decoding(tmp_path, epoch=1, avg=1, use_averaged_model=False)


def test_upgraded_checkpoint_computes_what_the_version_1_model_computed(tmp_path, monkeypatch):
    old_model = tiny_model()
    features, lengths = torch.randn(2, 60, 80), torch.tensor([60, 41])
    # Version 1's table, from its definition: row m embedded the offset T-1-m, i.e. the
    # current table upside down.
    current = CompactRelPositionalEncoding.embedding
    with monkeypatch.context() as patch:
        patch.setattr(CompactRelPositionalEncoding, "embedding",
                      lambda self, frames, device: current(self, frames, device).flip(0))
        with torch.no_grad():
            expected, _ = old_model.log_probs(features, lengths)
    write_version_1(tmp_path / "old.pt", old_model)
    main([str(tmp_path / "old.pt"), str(tmp_path / "new.pt")])
    upgraded = tiny_model(seed=1)
    contents = load_checkpoint(tmp_path / "new.pt", model=upgraded)
    assert contents["format_version"] == CHECKPOINT_FORMAT_VERSION
    assert contents["optimizer"] is None
    with torch.no_grad():
        actual, _ = upgraded.log_probs(features, lengths)
        unconverted, _ = old_model.log_probs(features, lengths)
    assert (actual - expected).abs().max() <= 1e-5
    assert (unconverted - expected).abs().max() > 1e-3  # the conversion is needed


def test_mirroring_negates_only_the_sine_columns():
    weight = torch.arange(1.0, 9.0).repeat(2, 1)  # pos_dim 8: cos sin cos sin cos sin cos 1
    name = "encoder.stacks.0.layers.0.attention_weights.linear_pos.weight"
    mirrored = mirror_positional_weights({name: weight, "other": weight})
    assert mirrored[name][0].tolist() == [1, -2, 3, -4, 5, -6, 7, 8]
    assert torch.equal(mirrored["other"], weight)


def test_upgrading_a_current_checkpoint_is_refused(tmp_path):
    save_checkpoint(tmp_path / "new.pt", model=tiny_model(), config={}, batch_idx_train=0, epoch=1)
    with pytest.raises(SystemExit, match="already of format version 2"):
        main([str(tmp_path / "new.pt"), str(tmp_path / "out.pt")])


def test_version_1_configuration_becomes_a_version_2_run_configuration():
    from asr.config import RunConfig
    from zipformer.checkpoint_upgrade import upgrade_config

    old = {"model": {"preset": None, "encoder_dim": [48, 64, 48], "num_encoder_layers": [1, 1, 1],
                     "downsampling_factor": [1, 2, 1], "feedforward_dim": [96, 96, 96], "num_heads": [2, 2, 2],
                     "encoder_unmasked_dim": [32, 48, 32], "cnn_module_kernel": [7, 7, 7],
                     "chunk_size": 4096, "beam": 100.0, "vocab_size": 29},
           "data": {"max_duration": 40.0}, "train": {"num_epochs": 3, "base_lr": 0.07, "lr_batches": 300.0}}
    del old["model"]["preset"]
    config = RunConfig.from_dict(upgrade_config(old))
    assert (config.optim.base_lr, config.optim.lr_batches, config.train.num_epochs) == (0.07, 300.0, 3)
    assert (config.model.chunk_size, config.model.alignment_beam, config.model.vocab_size) == (None, None, 29)
