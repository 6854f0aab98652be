"""Specification of asr.checkpoint and asr.averaging."""

from pathlib import Path
from typing import Dict, List

import pytest
import torch

from asr import checkpoint as checkpoint_module
from asr.averaging import (
    average_checkpoints,
    make_averaged_model,
    update_averaged_model,
    weights_for_decoding,
)
from asr.checkpoint import (
    CheckpointConfigMismatch,
    epoch_checkpoint_path,
    iteration_checkpoint_path,
    load_checkpoint,
    remove_old_checkpoints,
    save_checkpoint,
)

CONFIG = {"model": {"num_layers": 2, "dims": [8, 4]}, "base_lr": 0.05}


class TinyModel(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(3, 2)
        self.dropout = torch.nn.Dropout(0.3)
        self.register_buffer("steps", torch.zeros((), dtype=torch.long))

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.linear(inputs))


def snapshot(model: torch.nn.Module) -> Dict[str, torch.Tensor]:
    return {k: v.detach().to(torch.float64).clone() for k, v in model.state_dict().items()}


def mean_of(snapshots: List[Dict[str, torch.Tensor]], name: str) -> torch.Tensor:
    return torch.stack([s[name] for s in snapshots]).mean(dim=0)


def run_toy_training(
    exp_dir: Path,
    *,
    num_epochs: int,
    batches_per_epoch: int,
    average_period: int,
    save_every_n: int = 0,
) -> Dict[int, Dict[str, torch.Tensor]]:
    """Train TinyModel, saving epoch-N.pt (and checkpoint-B.pt); return weights after each batch."""
    torch.manual_seed(0)
    model = TinyModel()
    model_avg = make_averaged_model(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    weights_after_batch = {}
    batch_idx_train = 0
    for epoch in range(1, num_epochs + 1):
        for _ in range(batches_per_epoch):
            loss = model(torch.randn(4, 3)).pow(2).sum()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            model.steps += 1
            batch_idx_train += 1
            weights_after_batch[batch_idx_train] = snapshot(model)
            update_averaged_model(model_avg, model, batch_idx_train, average_period)
            if save_every_n and batch_idx_train % save_every_n == 0:
                save_checkpoint(
                    iteration_checkpoint_path(exp_dir, batch_idx_train), model=model, config=CONFIG,
                    batch_idx_train=batch_idx_train, epoch=epoch, model_avg=model_avg,
                    average_period=average_period,
                )
        save_checkpoint(
            epoch_checkpoint_path(exp_dir, epoch), model=model, config=CONFIG,
            batch_idx_train=batch_idx_train, epoch=epoch, model_avg=model_avg,
            average_period=average_period, optimizer=optimizer,
        )
    return weights_after_batch


def test_running_average_is_mean_of_period_snapshots(tmp_path: Path) -> None:
    weights = run_toy_training(tmp_path, num_epochs=1, batches_per_epoch=12, average_period=4)
    saved = torch.load(epoch_checkpoint_path(tmp_path, 1), weights_only=False)
    expected = mean_of([weights[4], weights[8], weights[12]], "linear.weight")
    torch.testing.assert_close(saved["model_avg"]["linear.weight"], expected, rtol=0, atol=1e-12)
    assert saved["model_avg"]["linear.weight"].dtype == torch.float64


@pytest.mark.parametrize("average_period", [1, 2])
def test_use_averaged_model_is_exact_average_between_epochs(tmp_path: Path, average_period: int) -> None:
    # 5 batches per epoch: epoch ends are not multiples of average_period 2.
    weights = run_toy_training(tmp_path, num_epochs=3, batches_per_epoch=5, average_period=average_period)
    averaged = weights_for_decoding(tmp_path, epoch=3, avg=2, use_averaged_model=True)
    n_start = (5 // average_period) * average_period
    snapshots = [weights[b] for b in range(n_start + 1, 16) if b % average_period == 0]
    for name in ("linear.weight", "linear.bias"):
        expected = mean_of(snapshots, name).to(torch.float32)
        torch.testing.assert_close(averaged[name], expected, rtol=0, atol=1e-6)
        assert averaged[name].dtype == torch.float32
    assert averaged["steps"].item() == 15


def test_use_averaged_model_with_iteration_checkpoints(tmp_path: Path) -> None:
    weights = run_toy_training(tmp_path, num_epochs=1, batches_per_epoch=16, average_period=1, save_every_n=4)
    averaged = weights_for_decoding(tmp_path, iteration=12, avg=2, use_averaged_model=True)
    expected = mean_of([weights[b] for b in range(5, 13)], "linear.weight").float()
    torch.testing.assert_close(averaged["linear.weight"], expected, rtol=0, atol=1e-6)


def test_avg_without_averaged_model_is_plain_mean_of_epochs(tmp_path: Path) -> None:
    weights = run_toy_training(tmp_path, num_epochs=3, batches_per_epoch=5, average_period=2)
    averaged = weights_for_decoding(tmp_path, epoch=3, avg=2, use_averaged_model=False)
    expected = mean_of([weights[10], weights[15]], "linear.weight").float()
    torch.testing.assert_close(averaged["linear.weight"], expected, rtol=0, atol=1e-6)
    single = weights_for_decoding(tmp_path, epoch=2, avg=1, use_averaged_model=False)
    torch.testing.assert_close(single["linear.bias"], weights[10]["linear.bias"].float())
    by_iteration = average_checkpoints([epoch_checkpoint_path(tmp_path, e) for e in (2, 3)])
    torch.testing.assert_close(by_iteration["linear.weight"], averaged["linear.weight"])


def test_missing_checkpoint_for_averaging_is_named(tmp_path: Path) -> None:
    run_toy_training(tmp_path, num_epochs=2, batches_per_epoch=2, average_period=1)
    epoch_checkpoint_path(tmp_path, 1).unlink()
    with pytest.raises(FileNotFoundError, match="epoch-1.pt"):
        weights_for_decoding(tmp_path, epoch=2, avg=2, use_averaged_model=False)
    with pytest.raises(FileNotFoundError, match="epoch-1.pt"):
        weights_for_decoding(tmp_path, epoch=2, avg=1, use_averaged_model=True)
    with pytest.raises(FileNotFoundError, match="checkpoint-7.pt"):
        weights_for_decoding(tmp_path, iteration=7, avg=1, use_averaged_model=False)
    with pytest.raises(ValueError, match="must be >= 1"):
        weights_for_decoding(tmp_path, epoch=2, avg=2, use_averaged_model=True)


def test_resume_continues_training_exactly(tmp_path: Path) -> None:
    def make() -> tuple:
        model = TinyModel()
        optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
        return model, optimizer, scheduler

    def train(model: TinyModel, optimizer, scheduler, steps: int) -> None:
        for _ in range(steps):
            loss = model(torch.randn(4, 3)).pow(2).sum()  # dropout and data use the RNG
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            scheduler.step()

    torch.manual_seed(1)
    model, optimizer, scheduler = make()
    train(model, optimizer, scheduler, 3)
    path = save_checkpoint(
        tmp_path / "checkpoint-3.pt", model=model, optimizer=optimizer, scheduler=scheduler,
        config=CONFIG, batch_idx_train=3, epoch=1, sampler_state={"position": 3},
    )
    train(model, optimizer, scheduler, 3)
    uninterrupted = snapshot(model)

    torch.manual_seed(999)
    resumed, resumed_optimizer, resumed_scheduler = make()
    state = load_checkpoint(
        path, expected_config=CONFIG, model=resumed, optimizer=resumed_optimizer,
        scheduler=resumed_scheduler, restore_rng=True,
    )
    assert (state["batch_idx_train"], state["epoch"], state["sampler"]) == (3, 1, {"position": 3})
    train(resumed, resumed_optimizer, resumed_scheduler, 3)
    for name, value in snapshot(resumed).items():
        torch.testing.assert_close(value, uninterrupted[name], rtol=0, atol=0)


def test_config_mismatch_names_the_field(tmp_path: Path) -> None:
    path = save_checkpoint(tmp_path / "epoch-1.pt", model=TinyModel(), config=CONFIG, batch_idx_train=1, epoch=1)
    changed = {"model": {"num_layers": 3, "dims": [8, 4]}, "base_lr": 0.05}
    with pytest.raises(CheckpointConfigMismatch, match=r"'model\.num_layers' is 2 in the checkpoint but 3"):
        load_checkpoint(path, expected_config=changed)
    with pytest.raises(CheckpointConfigMismatch, match="'extra_field' is absent"):
        load_checkpoint(path, expected_config={**CONFIG, "extra_field": 1})
    load_checkpoint(path, expected_config={**CONFIG, "base_lr": 0.01}, ignore_config_fields=("base_lr",))


def test_failed_save_leaves_previous_file_and_no_partial_file(tmp_path: Path, monkeypatch) -> None:
    path = save_checkpoint(tmp_path / "epoch-1.pt", model=TinyModel(), config=CONFIG, batch_idx_train=1, epoch=1)
    before = path.read_bytes()

    def crash_midway(obj, stream, *args, **kwargs) -> None:
        stream.write(b"partial bytes")
        raise RuntimeError("disk full")

    monkeypatch.setattr(checkpoint_module.torch, "save", crash_midway)
    with pytest.raises(RuntimeError, match="disk full"):
        save_checkpoint(path, model=TinyModel(), config=CONFIG, batch_idx_train=2, epoch=2)
    with pytest.raises(RuntimeError, match="disk full"):
        save_checkpoint(tmp_path / "epoch-2.pt", model=TinyModel(), config=CONFIG, batch_idx_train=2, epoch=2)
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["epoch-1.pt"]


def test_keep_last_k_removes_only_old_iteration_checkpoints(tmp_path: Path) -> None:
    for batch in (4, 8, 12, 16, 20):
        iteration_checkpoint_path(tmp_path, batch).write_bytes(b"x")
    epoch_checkpoint_path(tmp_path, 1).write_bytes(b"x")
    removed = remove_old_checkpoints(tmp_path, keep_last_k=2)
    assert sorted(p.name for p in removed) == ["checkpoint-12.pt", "checkpoint-4.pt", "checkpoint-8.pt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-16.pt", "checkpoint-20.pt", "epoch-1.pt"]


def test_missing_checkpoint_to_load_is_named(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="epoch-9.pt"):
        load_checkpoint(tmp_path / "epoch-9.pt")
