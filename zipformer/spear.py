"""SPEAR-XLarge v2 (and other SPEAR sizes) as this project's Zipformer encoder.

SPEAR is a self-supervised Zipformer2 (Yang et al., 2026; the paper's Table 3 encoder,
App. D.3: 128-dim fbank in, 1280-dim embeddings at about 50 frames/s). Its icefall
checkpoint (hub: ``marcoyang/spear-xlarge-speech-audio-v2-icefall``) is read here with
the icefall import (``zipformer.icefall_state_dict``): no remote code, no torchaudio.
Only the encoder is kept: the pre-training heads have no use for recognition.

Facts of the ``spear_xlarge_v2`` preset (``zipformer.presets``) and where they come from:

* 128-dim fbank in, 1280-dim output, about 50 frames/s: the paper (App. D.3) and the
  model card of ``marcoyang/spear-xlarge-speech-audio-v2`` (16 kHz input, 1280 features,
  about 50 Hz).
* ``output_downsampling_factor`` 1, ``downsampling_factor`` 1,2,4,8,4,2,1, layers
  1,2,3,4,1,1,1 (13), ``encoder_dim`` 1280 in every stack, ``encoder_unmasked_dim`` 768,
  8 heads, ``feedforward_dim`` 3840, kernels 31,31,15,15,15,31,31, query/pos/value head
  dims 32/4/12, ``pos_dim`` 48, Conv2dSubsampling(128 -> 1280) with icefall's default
  channels 8,32,128, ``causal`` False: the XLarge encoder built by the SPEAR authors'
  own SALMONN code (github.com/marcoyang1998/new-salmonn, ``modeling_salmonn.py``,
  ``get_audio_encoder``), which loads ``torch.load(path)["model"]`` of an icefall
  ``MultiKDModel`` (``spear_encoder/model.py``: ``encoder_embed``, ``encoder``, plus
  pre-training parts ``codebook_loss_net``, ``audio_tagging_proj``, ``mask_emb``).
  The public ``configuration_spear.py`` of the remote-code release has the same layout
  for SPEAR Large (1024 dims, layers 1,2,2,3,1,1,1, output downsampling 1).

Not established offline (marked here, checked at load time where possible):

* the file name inside the ``-icefall`` hub repository (give its path, or its folder
  when it holds exactly one ``.pt`` file);
* that this checkpoint's entries are named as ``MultiKDModel``'s (a ``model`` entry, or
  a bare state dict; ``module.`` prefixes are stripped). Whatever its layout, the
  architecture is inferred from the weights' shapes and compared with the preset;
* that SPEAR's own Zipformer2 copy (``zipformer_layerwise.py``) computes what icefall's
  ``egs/librispeech/ASR/zipformer/zipformer.py`` computes, which this project's Zipformer
  reproduces (tests/data/spear_zipformer proves the latter with factor 1).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import torch

from zipformer.encoder import ZipformerEncoder
from zipformer.icefall_state_dict import IcefallCheckpointError, infer_config, map_names, split_parts
from zipformer.presets import ZipformerConfig, get_preset

SPEAR_PRESET = "spear_xlarge_v2"
SPEAR_FEATURE_DIM = 128
ENCODER_PREFIXES = ("encoder_embed.", "encoder.")
# Fields that decide what the encoder computes; a checkpoint that differs is loaded as
# it is (its shapes rule) with a warning naming them.
COMPARED_FIELDS = ("feature_dim", "output_downsampling_factor", "downsampling_factor",
                   "num_encoder_layers", "encoder_dim", "feedforward_dim", "num_heads",
                   "cnn_module_kernel", "query_head_dim", "value_head_dim", "pos_head_dim",
                   "pos_dim", "subsampling_channels")


def resolve_checkpoint(path: Path) -> Path:
    """The checkpoint file: ``path`` itself, or the only ``.pt`` file of a folder."""
    if path.is_dir():
        candidates = sorted(path.glob("*.pt"))
        if len(candidates) != 1:
            raise FileNotFoundError(f"model.encoder_path: {path} is a folder with {len(candidates)} .pt files "
                                    f"({[c.name for c in candidates]}); name the checkpoint file")
        return candidates[0]
    if not path.is_file():
        raise FileNotFoundError(f"model.encoder_path: SPEAR checkpoint not found: {path}")
    return path


def encoder_state_dict(weights: Dict[str, torch.Tensor]) -> Tuple[Dict[str, torch.Tensor], List[str]]:
    """The ``encoder_embed.*`` and ``encoder.*`` entries; the prefixes of the rest."""
    kept, _ = split_parts(weights)  # strips DDP's "module."
    encoder = {k: v for k, v in kept.items() if k.startswith(ENCODER_PREFIXES)}
    skipped = sorted({k.split(".", 1)[0] for k in kept if not k.startswith(ENCODER_PREFIXES)})
    if not any(k.startswith("encoder_embed.") for k in encoder):
        raise IcefallCheckpointError("no 'encoder_embed.*' weights: not an icefall Zipformer2 (SPEAR) checkpoint")
    return encoder, skipped


def differences_from_preset(config: ZipformerConfig, preset: str = SPEAR_PRESET) -> List[str]:
    expected = get_preset(preset).to_dict()
    actual = config.to_dict()
    return [f"{name}={actual[name]} (preset {expected[name]})" for name in COMPARED_FIELDS
            if actual[name] != expected[name]]


def load_spear_encoder(path: Path, feature_dim: int = SPEAR_FEATURE_DIM, weights: str = "model",
                       allow_pickle: bool = False) -> Tuple[ZipformerEncoder, ZipformerConfig]:
    """SPEAR's encoder from an icefall checkpoint, in evaluation mode."""
    from zipformer.icefall_checkpoint import load_icefall_checkpoint, saved_training_args, select_weights

    path = resolve_checkpoint(Path(path))
    checkpoint = load_icefall_checkpoint(path, allow_pickle)
    state, skipped = encoder_state_dict(select_weights(checkpoint, weights, path))
    saved = {**saved_training_args(checkpoint), "feature_dim": feature_dim}
    config = infer_config(state, saved)
    encoder = ZipformerEncoder(config)
    mapped = {name[len("encoder."):]: value for name, value in map_names(state).items()}
    missing, unexpected = encoder.load_state_dict(mapped, strict=False)
    if missing or unexpected:
        raise IcefallCheckpointError(f"{path}: encoder weights do not fit the inferred architecture: missing "
                                     f"{sorted(missing)[:5]}, unexpected {sorted(unexpected)[:5]}")
    different = differences_from_preset(config)
    if different:
        logging.warning("%s is not SPEAR-XLarge v2's layout: %s", path, ", ".join(different))
    if skipped:
        logging.info("%s: skipped the pre-training parts %s", path, ", ".join(skipped))
    return encoder.eval(), config


def spear_output_lengths(num_frames, config: Optional[ZipformerConfig] = None):
    """Encoder frames for ``num_frames`` fbank frames (100/s in, 50/s out with factor 1)."""
    from zipformer.encoder import encoder_output_lengths

    factor = (config or get_preset(SPEAR_PRESET)).output_downsampling_factor
    return encoder_output_lengths(num_frames, factor)
