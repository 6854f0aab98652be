"""icefall Zipformer state dicts: infer the architecture, map names to this project's.

The parameter layout is icefall's ``egs/librispeech/ASR/zipformer`` (Zipformer2 inside
an AsrModel): ``encoder_embed.*`` (Conv2dSubsampling), ``encoder.encoders.<i>.*`` (one
Zipformer2Encoder per stack, wrapped in a DownsampledZipformer2Encoder when the stack
runs at a lower frame rate), ``encoder.downsample_output.bias`` and the CTC head
``ctc_output.1.*`` (Dropout, Linear, LogSoftmax). Names map one to one, values are
copied unchanged: this encoder computes what icefall's computes (positional-encoding
sign included). Only icefall's per-layer ``bypass_scale`` (created, never used in its
forward pass) has no counterpart and is dropped.
"""

from __future__ import annotations

import re
from typing import Dict, List, Mapping, Optional, Tuple

import torch

from zipformer.presets import PRESETS, ZipformerConfig, get_preset
from zipformer.subsampling import frequency_bins_after_subsampling

StateDict = Dict[str, torch.Tensor]
TRANSDUCER_PREFIXES = ("decoder.", "joiner.", "simple_am_proj.", "simple_lm_proj.",
                       "attention_decoder.")
CTC_WEIGHT, CTC_BIAS = "ctc_output.1.weight", "ctc_output.1.bias"
DEFAULT_POS_HEAD_DIM = 4  # icefall's --pos-head-dim default
DEFAULT_FEATURE_DIM = 80


class IcefallCheckpointError(ValueError):
    """The file is not an icefall Zipformer checkpoint this converter can take."""


def split_parts(state_dict: Mapping[str, torch.Tensor]) -> Tuple[StateDict, List[str]]:
    """(encoder and CTC-head entries, prefixes of the skipped transducer-only parts)."""
    kept, skipped = {}, set()
    for name, value in state_dict.items():
        name = name[len("module."):] if name.startswith("module.") else name  # DDP
        prefix = next((p for p in TRANSDUCER_PREFIXES if name.startswith(p)), None)
        if prefix is not None:
            skipped.add(prefix.rstrip("."))
        else:
            kept[name] = value
    return kept, sorted(skipped)


def _stack_layout(state_dict: Mapping[str, torch.Tensor]) -> List[Tuple[str, int, int]]:
    """Per stack: (prefix of its layers, downsampling factor, number of layers)."""
    indices = sorted({int(m.group(1)) for name in state_dict
                      if (m := re.match(r"encoder\.encoders\.(\d+)\.", name))})
    if not indices:
        raise IcefallCheckpointError("no 'encoder.encoders.<i>.*' weights: not an icefall "
                                     "Zipformer (Zipformer2) model")
    if indices != list(range(len(indices))):
        raise IcefallCheckpointError(f"encoder stacks {indices} are not numbered 0..N-1")
    layout = []
    for i in indices:
        bias = state_dict.get(f"encoder.encoders.{i}.downsample.bias")
        factor = 1 if bias is None else int(bias.shape[0])
        prefix = f"encoder.encoders.{i}." + ("layers." if bias is None else "encoder.layers.")
        layers = {int(m.group(1)) for name in state_dict
                  if (m := re.match(re.escape(prefix) + r"(\d+)\.", name))}
        if not layers:
            raise IcefallCheckpointError(f"stack {i} has no layers under '{prefix}'")
        layout.append((prefix, factor, len(layers)))
    return layout


def _shape(state_dict: Mapping[str, torch.Tensor], name: str) -> Tuple[int, ...]:
    if name not in state_dict:
        raise IcefallCheckpointError(f"missing weight '{name}'")
    return tuple(state_dict[name].shape)


def _saved_ints(saved_args: Mapping, name: str) -> Optional[Tuple[int, ...]]:
    """An icefall training argument stored in epoch-N.pt ("4,4,4,8,4,4", 4 or [4])."""
    value = saved_args.get(name)
    if value is None:
        return None
    if isinstance(value, str):
        return tuple(int(v) for v in value.split(","))
    if isinstance(value, int):
        return (value,)
    return tuple(int(v) for v in value)


def _one_value(values: List[int], name: str) -> int:
    if len(set(values)) != 1:
        raise IcefallCheckpointError(f"{name} differs between stacks ({values}); this project's "
                                     f"Zipformer has one {name} for all stacks")
    return values[0]


def infer_config(state_dict: Mapping[str, torch.Tensor], saved_args: Mapping = (),
                 pos_head_dim: Optional[int] = None) -> ZipformerConfig:
    """The :class:`ZipformerConfig` of an icefall state dict (names as icefall's).

    Shapes give everything except how the attention projection splits between heads and
    head dimensions, and ``encoder_unmasked_dim`` (a training-only setting): those come
    from the training arguments that icefall stores in ``epoch-N.pt`` (``saved_args``)
    when present; otherwise ``pos_head_dim`` (icefall's default 4) fixes the heads, and
    the unmasked dims are the matching preset's (S, M, L) or min(dim, smallest dim).
    """
    saved_args = dict(saved_args)
    if any(".causal_conv." in name or ".chunkwise_conv." in name for name in state_dict):
        raise IcefallCheckpointError("this is a streaming (causal) Zipformer: its chunk-causal "
                                     "convolutions are not supported; convert a non-streaming model")
    layout = _stack_layout(state_dict)
    dims, ffs, kernels, heads, qdims, vdims, pdims = [], [], [], [], [], [], []
    saved_heads = _saved_ints(saved_args, "num_heads")
    saved_pos = _saved_ints(saved_args, "pos_head_dim")
    for i, (prefix, _, _) in enumerate(layout):
        layer = f"{prefix}0."
        dims.append(_shape(state_dict, layer + "norm.bias")[0])
        ffs.append(_shape(state_dict, layer + "feed_forward2.in_proj.weight")[0])
        kernels.append(_shape(state_dict, layer + "conv_module1.depthwise_conv.weight")[-1])
        pos_out, pos_dim = _shape(state_dict, layer + "self_attn_weights.linear_pos.weight")
        projection = _shape(state_dict, layer + "self_attn_weights.in_proj.weight")[0]
        values = _shape(state_dict, layer + "self_attn1.in_proj.weight")[0]
        if saved_heads is not None:
            num_heads = saved_heads[i if len(saved_heads) > 1 else 0]
        else:
            p = pos_head_dim or (saved_pos[i if len(saved_pos) > 1 else 0] if saved_pos
                                 else DEFAULT_POS_HEAD_DIM)
            if pos_out % p:
                raise IcefallCheckpointError(
                    f"stack {i}: linear_pos has {pos_out} outputs, not a multiple of "
                    f"pos_head_dim {p}: give --pos-head-dim or --num-heads")
            num_heads = pos_out // p
        if pos_out % num_heads or values % num_heads or projection % num_heads:
            raise IcefallCheckpointError(f"stack {i}: {num_heads} heads do not divide the "
                                         f"attention projections ({projection}, {pos_out}, {values})")
        heads.append(num_heads)
        pdims.append(pos_out // num_heads)
        vdims.append(values // num_heads)
        qdims.append((projection // num_heads - pdims[-1]) // 2)
    out_bias = _shape(state_dict, "encoder.downsample_output.bias")
    subsampling = tuple(_shape(state_dict, f"encoder_embed.conv.{k}.weight")[0] for k in (0, 4, 7))
    feature_dim = int(saved_args.get("feature_dim", DEFAULT_FEATURE_DIM))
    flat = _shape(state_dict, "encoder_embed.out.weight")[1]
    if flat != subsampling[2] * frequency_bins_after_subsampling(feature_dim):
        raise IcefallCheckpointError(f"encoder_embed.out takes {flat} inputs, which does not fit "
                                     f"{feature_dim}-dimensional features")
    if CTC_WEIGHT in state_dict:
        vocab_size = _shape(state_dict, CTC_WEIGHT)[0]
    else:
        vocab_size = int(saved_args.get("vocab_size", 2))
    fields = dict(
        feature_dim=feature_dim, num_encoder_layers=tuple(n for _, _, n in layout),
        downsampling_factor=tuple(f for _, f, _ in layout), feedforward_dim=tuple(ffs),
        num_heads=tuple(heads), encoder_dim=tuple(dims), cnn_module_kernel=tuple(kernels),
        query_head_dim=_one_value(qdims, "query_head_dim"),
        value_head_dim=_one_value(vdims, "value_head_dim"),
        pos_head_dim=_one_value(pdims, "pos_head_dim"), pos_dim=pos_dim,
        output_downsampling_factor=out_bias[0], subsampling_channels=subsampling,
        vocab_size=vocab_size)
    fields["encoder_unmasked_dim"] = (_saved_ints(saved_args, "encoder_unmasked_dim")
                                      or _unmasked_dims(fields))
    try:
        return ZipformerConfig(**fields)
    except ValueError as error:
        raise IcefallCheckpointError(f"inferred configuration is not valid: {error}") from None


def _unmasked_dims(fields: dict) -> Tuple[int, ...]:
    name = preset_name(fields)
    if name is not None:
        return get_preset(name).encoder_unmasked_dim
    smallest = min(fields["encoder_dim"])
    return tuple(min(d, smallest) for d in fields["encoder_dim"])


def preset_name(fields) -> Optional[str]:
    """"S", "M" or "L" when the architecture is that icefall size, else None."""
    if isinstance(fields, ZipformerConfig):
        fields = fields.to_dict()
    ignored = {"vocab_size", "encoder_unmasked_dim"}
    for name in PRESETS:
        preset = get_preset(name).to_dict()
        if all(_same(preset[k], v) for k, v in fields.items() if k not in ignored and k in preset):
            return name
    return None


def _same(a, b) -> bool:
    return list(a) == list(b) if isinstance(a, (list, tuple)) else a == b


def map_names(state_dict: Mapping[str, torch.Tensor]) -> StateDict:
    """icefall names -> this project's (``CTCModel``); values unchanged.

    The layers' unused ``bypass_scale`` is dropped; ``ctc_output.1`` becomes ``head``.
    """
    mapped = {}
    for name, value in state_dict.items():
        if re.fullmatch(r"encoder\.encoders\.\d+\.(encoder\.)?layers\.\d+\.bypass_scale", name):
            continue  # icefall creates it in every layer and never uses it
        if name in (CTC_WEIGHT, CTC_BIAS):
            mapped["head." + name.rsplit(".", 1)[1]] = value
            continue
        if name.startswith("encoder_embed."):
            mapped["encoder." + name] = value
            continue
        new = re.sub(r"^encoder\.encoders\.(\d+)\.encoder\.", r"encoder.stacks.\1.stack.", name)
        new = re.sub(r"^encoder\.encoders\.(\d+)\.", r"encoder.stacks.\1.", new)
        new = new.replace(".self_attn_weights.", ".attention_weights.")
        mapped[new] = value
    return mapped
