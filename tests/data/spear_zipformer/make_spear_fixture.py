"""Write the SPEAR-layout test fixture (tests/data/spear_zipformer/).

A miniature of SPEAR-XLarge v2's encoder (zipformer/spear.py gives the real layout): the
same seven stacks (downsampling 1,2,4,8,4,2,1, layers 1,2,3,4,1,1,1, kernels
31,31,15,15,15,31,31, one width for every stack), output downsampling 1 (50 frames/s),
128-dim fbank, Conv2dSubsampling channels 8,32,128, built with icefall's own classes
(Conv2dSubsampling, Zipformer2 from egs/librispeech/ASR/zipformer of an icefall
checkout) at a small width, with random weights, and saved as SPEAR's icefall
``MultiKDModel`` stores it: ``{"model": state_dict}`` with ``encoder_embed.*``,
``encoder.*`` and pre-training parts (``audio_tagging_proj.1.*``, ``mask_emb``) that a
speech encoder does not use. ``reference.pt`` holds input features and icefall's encoder
output (evaluation mode, float64 and float32; each utterance alone and the padded batch).

icefall's LibriSpeech Zipformer2 asserts an output downsampling factor of 2 where it
computes the output lengths (zipformer.py, Zipformer2.forward); SPEAR's copy runs with 1.
The script builds the model with 1 (so its ``downsample_output`` is SimpleDownsample(1),
an identity) and sets the attribute that assertion reads to 2 afterwards; the reference
lengths are then the subsampled lengths, which factor 1 keeps unchanged.

Nothing of icefall enters this repository: it is loaded from the checkout given on the
command line, with the pure-torch stand-ins of
tests/data/icefall_zipformer/make_icefall_fixture.py.

Usage, from the repository root:
    python tests/data/spear_zipformer/make_spear_fixture.py /path/to/icefall \\
        [--out tests/data/spear_zipformer]
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

import torch

FEATURE_DIM = 128
WIDTH = 32
ENCODER = dict(
    output_downsampling_factor=1, downsampling_factor=(1, 2, 4, 8, 4, 2, 1),
    num_encoder_layers=(1, 2, 3, 4, 1, 1, 1), encoder_dim=(WIDTH,) * 7,
    encoder_unmasked_dim=(16,) * 7, query_head_dim=(8,), pos_head_dim=(4,),
    value_head_dim=(6,), num_heads=(2,) * 7, feedforward_dim=(48,) * 7,
    cnn_module_kernel=(31, 31, 15, 15, 15, 31, 31), pos_dim=16,
)
LENGTHS = (151, 97)  # frames of the two utterances (100 per second)
NUM_EVENTS = 5  # the audio-tagging head SPEAR pre-training adds (527 AudioSet classes there)


def _icefall_fixture_module():
    path = Path(__file__).resolve().parents[1] / "icefall_zipformer" / "make_icefall_fixture.py"
    spec = importlib.util.spec_from_file_location("make_icefall_fixture", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class SpearLayout(torch.nn.Module):
    """The parameter names of SPEAR's icefall MultiKDModel (encoder and pre-training parts)."""

    def __init__(self, recipe) -> None:
        super().__init__()
        dropout = recipe["scaling"].ScheduledFloat((0.0, 0.3), (20000.0, 0.1))
        self.encoder_embed = recipe["subsampling"].Conv2dSubsampling(FEATURE_DIM, WIDTH, dropout=dropout)
        self.encoder = recipe["zipformer"].Zipformer2(**ENCODER, dropout=dropout, warmup_batches=4000.0)
        self.encoder.output_downsampling_factor = 2  # see the module docstring
        self.audio_tagging_proj = torch.nn.Sequential(torch.nn.Dropout(0.1), torch.nn.Linear(WIDTH, NUM_EVENTS))
        self.mask_emb = torch.nn.Parameter(torch.zeros(FEATURE_DIM))

    def forward(self, features, lengths):
        x, x_lens = self.encoder_embed(features, lengths)
        padding = torch.arange(x.shape[1])[None, :] >= x_lens[:, None]
        out, _ = self.encoder(x.permute(1, 0, 2), x_lens, padding)
        return out.permute(1, 0, 2), x_lens


def outputs(model, features, lengths) -> dict:
    alone = [model(features[i:i + 1, :n], lengths[i:i + 1]) for i, n in enumerate(LENGTHS)]
    batch, batch_lens = model(features, lengths)
    return {"encoder_out": [a[0][0].detach() for a in alone],
            "encoder_out_lens": [int(a[1][0]) for a in alone],
            "batch_encoder_out": batch.detach(), "batch_encoder_out_lens": batch_lens}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("icefall_dir", type=Path, help="an icefall checkout")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent,
                        help="output folder (default: this script's, tests/data/spear_zipformer)")
    parser.add_argument("--commit", default=None, help="icefall commit to record (default: the checkout's HEAD)")
    parser.add_argument("--seed", type=int, default=20261124)
    args = parser.parse_args()
    helpers = _icefall_fixture_module()
    recipe = helpers.import_recipe(args.icefall_dir)
    torch.manual_seed(args.seed)
    generator = torch.Generator().manual_seed(args.seed)

    model = SpearLayout(recipe)
    helpers.randomize(model, generator)
    state_dict = {k: v.detach().clone() for k, v in model.state_dict().items()}
    features = torch.randn(len(LENGTHS), max(LENGTHS), FEATURE_DIM, generator=generator)
    lengths = torch.tensor(LENGTHS)
    features[1, LENGTHS[1]:] = 0.0
    reference = {"lengths": lengths, "features": features.clone(), "encoder": ENCODER,
                 "feature_dim": FEATURE_DIM,
                 "icefall_commit": args.commit or helpers.icefall_commit(args.icefall_dir),
                 "torch_version": torch.__version__}
    model.eval()
    with torch.no_grad():
        reference["eval_float32"] = outputs(model, features, lengths)
        reference["eval_float64"] = outputs(model.double(), features.double(), lengths)

    args.out.mkdir(parents=True, exist_ok=True)
    helpers.atomic_save({"model": state_dict}, args.out / "pretrained.pt")
    helpers.atomic_save(reference, args.out / "reference.pt")
    for name in ("pretrained.pt", "reference.pt"):
        print(f"{args.out / name}: {(args.out / name).stat().st_size / 1024:.0f} KiB", file=sys.stderr)


if __name__ == "__main__":
    main()
