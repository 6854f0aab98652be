"""The toolkit's training step on a CUDA device (Zipformer CTC with Pruned CTC, ScaledAdam
and Eden as ``asr.train`` builds them, FP32 and BF16 autocast) and its exact resume;
skipped cleanly without one."""

import copy

import pytest
import torch

from asr.checkpoint import capture_rng_state, restore_rng_state
from asr.config import load_run_config
from asr.train_step import training_step
from asr.trainee import build_trainee, seed_everything
from references.cuda import exact_float32_convolutions  # noqa: F401 (autouse fixture)

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

DEVICE = "cuda"
VOCAB = 50



def trainee_on(device: str, precision: str = "fp32"):
    config = load_run_config(None, ["model.preset=tiny", "model.loss=pruned", f"train.precision={precision}"])
    seed_everything(config.train.seed)
    trainee = build_trainee(config, torch.device(device), VOCAB, 0)
    trainee.scheduler.step_epoch(0)
    return trainee


def batch_of(seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    lens = torch.tensor([240, 203, 160, 235])
    features = torch.randn(len(lens), int(lens.max()), 80, generator=generator)
    texts = [torch.randint(1, VOCAB, (7,), generator=generator).tolist() for _ in lens]
    return {"features": features, "feature_lens": lens}, texts


def test_cuda_model_loss_equals_the_cpu_models():
    """The same initial weights on both devices, dropout off: the summed loss agrees."""
    batch, texts = batch_of()
    losses = []
    for device in ("cpu", DEVICE):
        model = trainee_on(device).model.eval()
        with torch.no_grad():
            loss = model(batch["features"].to(device), batch["feature_lens"].to(device), texts)
        losses.append(float(loss))
    assert losses[1] == pytest.approx(losses[0], rel=1e-4)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_cuda_training_steps_learn_a_repeated_batch(precision):
    trainee = trainee_on(DEVICE, precision)
    batch, texts = batch_of(1)
    losses = [float(training_step(trainee, batch, texts, step)[0]) for step in range(1, 16)]
    assert all(torch.isfinite(torch.tensor(losses)))
    assert sum(losses[-5:]) / 5 < 0.85 * losses[0]  # about 0.74 on the CPU
    for parameter in trainee.model.parameters():
        assert parameter.device.type == "cuda" and parameter.dtype == torch.float32


def test_cuda_training_resumes_exactly_from_saved_states():
    """Steps 1-2, then the model, optimizer, schedule and generator states are saved; step 3
    from the saved states in a new trainee gives the first trainee's step 3."""
    batches = [batch_of(seed) for seed in (2, 3, 4)]
    first = trainee_on(DEVICE, "bf16")
    for step in (1, 2):
        training_step(first, batches[step - 1][0], batches[step - 1][1], step)
    saved = {name: copy.deepcopy(part.state_dict())
             for name, part in (("model", first.model), ("optimizer", first.optimizer),
                                ("scheduler", first.scheduler))}
    rng = capture_rng_state()
    expected = float(training_step(first, *batches[2], 3)[0])

    second = trainee_on(DEVICE, "bf16")
    second.model.load_state_dict(saved["model"])
    second.optimizer.load_state_dict(saved["optimizer"])
    second.scheduler.load_state_dict(saved["scheduler"])
    restore_rng_state(rng)
    resumed = float(training_step(second, *batches[2], 3)[0])
    assert resumed == pytest.approx(expected, rel=1e-6)
    for (name, a), b in zip(first.model.named_parameters(), second.model.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=name)
