"""local.training_stall: the warning appears exactly when the recorded losses of the last
updates average above the threshold, computed here from the definition."""

from pathlib import Path

import pytest
import torch

from asr.checkpoint import save_checkpoint
from local.training_stall import main, recent_loss


def write_run(exp_dir: Path, train_losses, batch_idx_train: int = 1200, with_losses: bool = True) -> None:
    exp_dir.mkdir(parents=True, exist_ok=True)
    extra = {"train_losses": [list(entry) for entry in train_losses]} if with_losses else None
    save_checkpoint(exp_dir / f"checkpoint-{batch_idx_train}.pt", model=torch.nn.Linear(2, 2), config={},
                    batch_idx_train=batch_idx_train, epoch=1, extra=extra)


def curve(final_losses):
    """Updates 25, 50, ..., 1200: 1.0 per frame, then ``final_losses`` for the last entries."""
    losses = [1.0] * (48 - len(final_losses)) + list(final_losses)
    return [(25 * (i + 1), loss) for i, loss in enumerate(losses)]


def test_recent_loss_is_the_mean_over_the_intervals_ending_in_the_last_updates() -> None:
    losses = curve([0.8, 0.1, 0.2, 0.3, 0.6])
    # The intervals ending after update 1200 - 100: at 1125, 1150, 1175 and 1200.
    inside = [loss for update, loss in losses if update > 1200 - 100]
    assert len(inside) == 4 and recent_loss(losses, 100) == pytest.approx(sum(inside) / 4)
    assert recent_loss(losses, 100) == pytest.approx((0.1 + 0.2 + 0.3 + 0.6) / 4)
    assert recent_loss(losses, 10) == pytest.approx(0.6)  # shorter than one interval: the last one
    assert recent_loss([], 100) is None


@pytest.mark.parametrize("final, stalled", [([0.13, 0.12, 0.13, 0.14], False), ([0.72, 0.72, 0.76, 0.72], True),
                                            ([0.2, 0.2, 0.2, 1.4], True), ([0.4, 0.4, 0.4, 0.4], False)])
def test_the_warning_names_the_folder_the_loss_and_the_remedy_exactly_when_stalled(
    tmp_path: Path, capsys, final, stalled
) -> None:
    write_run(tmp_path / "exp", curve(final))
    assert main([str(tmp_path / "exp"), "--max-loss", "0.4", "--remedy", "try another train.seed"]) == 0
    err = capsys.readouterr().err
    if not stalled:
        assert err == ""
        return
    mean = sum(final) / 4
    assert f"the run in {tmp_path / 'exp'} stalled" in err and f"{mean:.3f} per frame, above 0.4" in err
    assert "last 100 of its 1200 updates" in err and "1200: " in err and err.rstrip().endswith("try another train.seed")


def test_the_newest_checkpoint_decides(tmp_path: Path, capsys) -> None:
    write_run(tmp_path / "exp", curve([0.7] * 4)[:24], batch_idx_train=600)
    write_run(tmp_path / "exp", curve([0.15] * 4), batch_idx_train=1200)
    assert main([str(tmp_path / "exp"), "--max-loss", "0.4"]) == 0
    assert capsys.readouterr().err == ""


def test_a_checkpoint_without_losses_and_a_folder_without_checkpoints_are_named(tmp_path: Path, capsys) -> None:
    write_run(tmp_path / "old", [], with_losses=False)
    assert main([str(tmp_path / "old"), "--max-loss", "0.4"]) == 0
    assert "holds no training losses" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main([str(tmp_path / "empty"), "--max-loss", "0.4"]) == 2
    assert f"no epoch-*.pt or checkpoint-*.pt in {tmp_path / 'empty'}" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([str(tmp_path / "old"), "--max-loss", "0"])


def test_a_stalled_run_exits_with_the_status_asked_for_and_only_a_stalled_one(tmp_path: Path, capsys) -> None:
    """--stalled-status: the status of a run that stalled (egs/mini's stage 8 trains it again);
    a run that learned and one without recorded losses exit 0."""
    write_run(tmp_path / "stalled", curve([0.72] * 4))
    write_run(tmp_path / "learned", curve([0.13] * 4))
    write_run(tmp_path / "old", [], with_losses=False)
    assert main([str(tmp_path / "stalled"), "--max-loss", "0.4", "--stalled-status", "3"]) == 3
    assert "stalled" in capsys.readouterr().err
    assert main([str(tmp_path / "learned"), "--max-loss", "0.4", "--stalled-status", "3"]) == 0
    assert main([str(tmp_path / "old"), "--max-loss", "0.4", "--stalled-status", "3"]) == 0
    assert "holds no training losses" in capsys.readouterr().err
    for status in ("2", "256", "-1"):
        with pytest.raises(SystemExit):
            main([str(tmp_path / "stalled"), "--max-loss", "0.4", "--stalled-status", status])
    assert "--stalled-status must be 0-255 and not 2" in capsys.readouterr().err
