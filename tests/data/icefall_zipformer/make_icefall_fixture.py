"""Write the icefall Zipformer test fixture (tests/data/icefall_zipformer/).

Builds a small CTC + transducer Zipformer with icefall's own classes (Conv2dSubsampling,
Zipformer2, Decoder, Joiner, AsrModel from egs/librispeech/ASR/zipformer of an icefall
checkout), gives it random weights, and saves:

* ``pretrained.pt``: ``{"model": state_dict}`` in float32, as icefall's export.py writes it;
* ``tokens.txt``: a small character table (``<blk>`` = 0);
* ``reference.pt``: the input features and icefall's outputs on them: the encoder output
  and CTC log-probabilities of each utterance alone and of the padded batch, in eval
  mode in float64 and float32, and in training mode (float64, every stochastic
  regularizer off) with one ``bypass_scale`` and one BiasNorm ``log_scale`` set outside
  the ranges that icefall's ``limit_param_value`` keeps them in, with the gradients of
  the encoder stacks' parameters (see gradient_reference) in that state.

Nothing of icefall enters this repository: the script loads the recipe's files from the
checkout given on the command line. k2 and the parts of icefall.utils that the recipe
imports are replaced at run time by pure-torch stand-ins (k2's Swoosh functions computed
in the input's dtype by their formulas; ``make_pad_mask``; ``torch_autocast``).

Usage, from the repository root:
    python tests/data/icefall_zipformer/make_icefall_fixture.py /path/to/icefall \\
        [--out tests/data/icefall_zipformer]
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import math
import os
import subprocess
import sys
import types
from unittest import mock
from pathlib import Path

import torch

RECIPE = Path("egs/librispeech/ASR/zipformer")
# The recipe files the fixture needs, each after the ones it imports.
RECIPE_MODULES = ("encoder_interface", "scaling", "subsampling", "decoder", "joiner", "model")
TOKENS = ["<blk>", "<sos/eos>", "<unk>"] + list("abcdefghijklmnopqrstu'")
# A custom size: four stacks, two of them downsampled by 4, small subsampling channels.
ENCODER = dict(
    output_downsampling_factor=2, downsampling_factor=(1, 2, 4, 2),
    encoder_dim=(16, 24, 32, 24), num_encoder_layers=(2, 1, 1, 1),
    encoder_unmasked_dim=(12, 16, 16, 16), query_head_dim=(8,), pos_head_dim=(4,),
    value_head_dim=(6,), num_heads=(2, 2, 4, 2), feedforward_dim=(32, 40, 48, 40),
    cnn_module_kernel=(15, 7, 5, 7), pos_dim=16,
)
SUBSAMPLING_CHANNELS = (4, 8, 16)
FEATURE_DIM = 80
GRADIENT_BATCH_COUNT = 3000.0  # mid-way through most of the gradient-only schedules
LENGTHS = (119, 83)  # frames of the two utterances
# Out-of-range limited parameters for the training-mode reference (icefall names).
OUT_OF_RANGE = {
    "encoder.encoders.0.layers.0.bypass.bypass_scale": 0.1,  # below scale_min
    "encoder.encoders.2.encoder.layers.0.norm.log_scale": 2.0,  # above 1.5
}


def _swoosh(shift: float, offset: float):
    def forward(x):
        return torch.logaddexp(torch.zeros_like(x), x - shift) - 0.08 * x - offset

    def forward_and_deriv(x):
        return forward(x), torch.sigmoid(x - shift) - 0.08

    return forward, forward_and_deriv


def install_stubs() -> None:
    """Pure-torch stand-ins for k2 and icefall.utils (only what the recipe uses)."""
    k2 = types.ModuleType("k2")
    for name, shift, offset in (("l", 4.0, 0.035), ("r", 1.0, 0.313261687)):
        forward, forward_and_deriv = _swoosh(shift, offset)
        setattr(k2, f"swoosh_{name}", forward)
        setattr(k2, f"swoosh_{name}_forward", forward)
        setattr(k2, f"swoosh_{name}_forward_and_deriv", forward_and_deriv)
    k2.RaggedTensor = type("RaggedTensor", (), {})  # appears in annotations only
    sys.modules["k2"] = k2

    utils = types.ModuleType("icefall.utils")

    @contextlib.contextmanager
    def torch_autocast(device_type="cuda", **kwargs):
        with torch.amp.autocast(device_type=device_type, **kwargs):
            yield

    def make_pad_mask(lengths, max_len=0):
        max_len = max(max_len, int(lengths.max()))
        return torch.arange(max_len, device=lengths.device)[None, :] >= lengths[:, None]

    def unused(*args, **kwargs):
        raise NotImplementedError("not needed by the fixture")

    utils.torch_autocast, utils.make_pad_mask = torch_autocast, make_pad_mask
    utils.add_sos = utils.time_warp = unused
    package = types.ModuleType("icefall")
    package.__path__ = []
    package.utils = utils
    sys.modules["icefall"], sys.modules["icefall.utils"] = package, utils


def load_module(path: Path, name: str) -> types.ModuleType:
    """Executes the file ``path`` as the module ``name``, registered in sys.modules first."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def import_recipe(icefall_dir: Path):
    recipe = icefall_dir / RECIPE
    missing = [name for name in RECIPE_MODULES + ("zipformer",) if not (recipe / f"{name}.py").is_file()]
    if missing:
        raise SystemExit(f"ERROR: {icefall_dir} is not an icefall checkout: no {RECIPE}/{missing[0]}.py")
    install_stubs()
    # The recipe's files import each other by bare name ("from scaling import ..."): each is
    # loaded from its file under that name, after the ones it imports, so those imports find
    # it in sys.modules without the recipe folder on sys.path.
    modules = {name: load_module(recipe / f"{name}.py", name) for name in RECIPE_MODULES}
    # "zipformer" would clash with this project's package: load it under another name.
    modules["zipformer"] = load_module(recipe / "zipformer.py", "icefall_recipe_zipformer")
    return modules


def build_model(recipe) -> torch.nn.Module:
    scaling = recipe["scaling"]
    dropout = scaling.ScheduledFloat((0.0, 0.3), (20000.0, 0.1))
    encoder_embed = recipe["subsampling"].Conv2dSubsampling(
        FEATURE_DIM, ENCODER["encoder_dim"][0], *SUBSAMPLING_CHANNELS, dropout=dropout)
    encoder = recipe["zipformer"].Zipformer2(**ENCODER, dropout=dropout, warmup_batches=4000.0)
    output_dim = max(ENCODER["encoder_dim"])
    decoder = recipe["decoder"].Decoder(vocab_size=len(TOKENS), decoder_dim=16, blank_id=0,
                                        context_size=2)
    joiner = recipe["joiner"].Joiner(encoder_dim=output_dim, decoder_dim=16, joiner_dim=16,
                                     vocab_size=len(TOKENS))
    return recipe["model"].AsrModel(
        encoder_embed=encoder_embed, encoder=encoder, decoder=decoder, joiner=joiner,
        encoder_dim=output_dim, decoder_dim=16, vocab_size=len(TOKENS),
        use_transducer=True, use_ctc=True)


def randomize(model: torch.nn.Module, generator: torch.Generator) -> None:
    """Weights of trained-model magnitude, so that every part reaches the output, and
    small enough biases that no channel a balancer looks at is nearly constant (its
    standard deviation, a difference of float32 moments, would be rounding noise)."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("bypass_scale"):
                param.uniform_(0.3, 0.9, generator=generator)
            elif name.endswith("log_scale"):
                param.uniform_(0.5, 1.2, generator=generator)
            elif param.ndim >= 2:
                param.normal_(0.0, 0.7 / math.sqrt(param[0].numel()), generator=generator)
            else:
                param.uniform_(-0.02, 0.02, generator=generator)


def run(model, features, lengths):
    """icefall's CTC path: forward_encoder, then ctc_output (dropout, linear, log-softmax)."""
    encoder_out, encoder_out_lens = model.forward_encoder(features, lengths)
    return encoder_out, model.ctc_output(encoder_out), encoder_out_lens


def outputs(model, features, lengths) -> dict:
    alone = [run(model, features[i:i + 1, :n], lengths[i:i + 1]) for i, n in enumerate(LENGTHS)]
    batch = run(model, features, lengths)
    return {
        "encoder_out": [a[0][0].detach() for a in alone],
        "log_probs": [a[1][0].detach() for a in alone],
        "encoder_out_lens": [int(a[2][0]) for a in alone],
        "batch_encoder_out": batch[0].detach(),
        "batch_log_probs": batch[1].detach(),
    }


def disable_regularizers(model: torch.nn.Module) -> None:
    """Training mode without randomness in the forward pass: ScheduledFloats without a
    batch count give their defaults (0 for every skip rate and dropout of the recipe);
    the plain-float dropouts and the feature masks are switched off here."""
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout) or type(module).__name__ == "Dropout2":
            module.p = 0.0
    encoder = model.encoder
    encoder.get_feature_masks = lambda x: [1.0] * len(encoder.encoder_dim)


def schedule_gradient_only_modules(model: torch.nn.Module, batch_count: float) -> None:
    """Give the schedules of the balancers, whitening modules and bypass minimums a batch
    count (the other schedules keep none, so dropouts and skip rates stay at their
    default 0): without one, icefall's ScheduledFloat defaults make some limits
    degenerate (a conv-module balancer's max_abs 1.0 below its min_abs 1.5, scale_min 0)."""
    for module in model.modules():
        kind = type(module).__name__
        if kind in ("Balancer", "Whiten"):
            for schedule in module.modules():
                if hasattr(schedule, "batch_count"):
                    schedule.batch_count = batch_count
        elif kind == "BypassModule":
            module.scale_min.batch_count = batch_count


def projection(numel: int, dtype=torch.float64) -> torch.Tensor:
    """A fixed dense vector with no random generator involved: cos(0.7 k + 0.3)."""
    return torch.cos(0.7 * torch.arange(numel, dtype=dtype) + 0.3)


def gradient_reference(model, features, lengths) -> dict:
    """Gradients of sum(encoder_out * projection) for the first utterance alone, with every
    random choice of the gradient-only modules taken (random.random() returns 0: each
    balancer, whitening, limit_param_value and score penalty applies; no skipping). Saved
    as two numbers per parameter (its projection onto projection() and its norm) to keep
    the fixture small. encoder_embed is left out: icefall's Swoosh backward in k2
    quantizes its derivative, so its gradients are not exact anywhere."""
    n = int(lengths[0])
    model.zero_grad()
    with mock.patch("random.random", return_value=0.0):
        encoder_out, _, _ = run(model, features[:1, :n], lengths[:1])
        (encoder_out * projection(encoder_out.numel()).view_as(encoder_out)).sum().backward()
    result = {}
    for name, param in model.named_parameters():
        if name.startswith("encoder.encoders.") and param.grad is not None:
            grad = param.grad.detach().double().flatten()
            result[name] = (float(grad @ projection(grad.numel())), float(grad.norm()))
    return result


def icefall_commit(icefall_dir: Path) -> str:
    try:
        return subprocess.run(["git", "-C", str(icefall_dir), "rev-parse", "HEAD"], check=True,
                              capture_output=True, text=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown (not a git checkout)"


def atomic_save(obj, path: Path) -> None:
    temporary = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    torch.save(obj, temporary)
    os.replace(temporary, path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("icefall_dir", type=Path, help="an icefall checkout")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent,
                        help="output folder (default: this script's, tests/data/icefall_zipformer)")
    parser.add_argument("--commit", default=None,
                        help="icefall commit to record (default: git rev-parse HEAD of the checkout)")
    parser.add_argument("--seed", type=int, default=20260611)
    args = parser.parse_args()
    recipe = import_recipe(args.icefall_dir)
    torch.manual_seed(args.seed)
    generator = torch.Generator().manual_seed(args.seed)

    model = build_model(recipe)
    randomize(model, generator)
    state_dict = {k: v.detach().clone() for k, v in model.state_dict().items()}
    features = torch.randn(len(LENGTHS), max(LENGTHS), FEATURE_DIM, generator=generator)
    lengths = torch.tensor(LENGTHS)
    features[1, LENGTHS[1]:] = 0.0  # padding; icefall's output for it is not checked

    reference = {"lengths": lengths, "features": features.clone(), "encoder": ENCODER,
                 "subsampling_channels": SUBSAMPLING_CHANNELS, "out_of_range": OUT_OF_RANGE,
                 "gradient_batch_count": GRADIENT_BATCH_COUNT,
                 "icefall_commit": args.commit or icefall_commit(args.icefall_dir),
                 "torch_version": torch.__version__}
    model.eval()
    with torch.no_grad():
        reference["eval_float32"] = outputs(model, features, lengths)
        reference["eval_float64"] = outputs(model.double(), features.double(), lengths)

    model.load_state_dict(state_dict)
    with torch.no_grad():
        for name, value in OUT_OF_RANGE.items():
            model.get_parameter(name).fill_(value)
    model.train()
    disable_regularizers(model)
    schedule_gradient_only_modules(model, GRADIENT_BATCH_COUNT)
    reference["train_float64"] = outputs(model, features.double(), lengths)
    reference["train_float64_gradients"] = gradient_reference(model, features.double(), lengths)

    args.out.mkdir(parents=True, exist_ok=True)
    atomic_save({"model": state_dict}, args.out / "pretrained.pt")
    atomic_save(reference, args.out / "reference.pt")
    tokens = "".join(f"{symbol} {i}\n" for i, symbol in enumerate(TOKENS))
    (args.out / "tokens.txt").write_text(tokens, encoding="utf-8")
    for name in ("pretrained.pt", "reference.pt", "tokens.txt"):
        print(f"{args.out / name}: {(args.out / name).stat().st_size / 1024:.0f} KiB")


if __name__ == "__main__":
    main()
