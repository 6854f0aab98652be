"""Fold the LoRA of an LLM-CTC / LLM-CE checkpoint into the LLM's layers, as the start of a
run that trains those layers whole (``model.lora_rank=0 model.llm_full_finetune=true``)::

    python -m llm_ctc.merge_lora exp/full_llm_ctc/decoding.pt exp/full_llm_ctc/decoding_merged.pt
    python -m asr.train --config conf/llm_ctc.yaml model.lora_rank=0 model.llm_full_finetune=true \\
        train.init_from=exp/full_llm_ctc/decoding_merged.pt ...

The input is a checkpoint ``asr.train`` writes (or ``local.export_decoding_weights``): its
``model`` entry the trainable weights, its ``config`` the run's configuration, whose
``model`` section names the LLM and encoder to rebuild. The output holds the same model
with W + (alpha / r) B A in every LoRA target (peft's merge, as decoding folds it) and the
LLM's layers and final norm among the trainable weights, so that the model it starts
computes what the LoRA model computed; its ``config`` is the input's with the two
settings above. It is written to a temporary name and renamed; an existing file is kept.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
from pathlib import Path
from typing import Any, Dict, Optional, Sequence

import torch

from llm_ctc.build import build_model
from llm_ctc.config import LLMASRConfig


def merged_checkpoint(checkpoint: Dict[str, Any], source: str = "the checkpoint") -> Dict[str, Any]:
    """The contents of the merged checkpoint for ``checkpoint`` (read from ``source``)."""
    run_config = checkpoint.get("config") if isinstance(checkpoint, dict) else None
    if not isinstance(run_config, dict) or not isinstance(run_config.get("model"), dict) or \
            not isinstance(checkpoint.get("model"), dict):
        raise ValueError(f"{source} is not a checkpoint of asr.train (expected 'model' weights and a 'config' "
                         "with a 'model' section)")
    family = run_config.get("family")
    if family != "llm_ctc":
        raise ValueError(f"{source} is a checkpoint of the {family!r} family, not of LLM-CTC / LLM-CE "
                         "(family: llm_ctc)")
    config = LLMASRConfig.from_dict(run_config["model"])
    if config.lora_rank == 0:
        raise ValueError(f"{source} has no LoRA to merge (model.lora_rank is 0)")
    lora_model = build_model(config)
    lora_model.load_checkpoint_state_dict(checkpoint["model"])
    lora_model.prepare_for_decoding()  # peft's merge: W + (alpha / r) B A
    merged = dict(lora_model.named_parameters())
    whole = build_model(dataclasses.replace(config, lora_rank=0, llm_full_finetune=True),
                        tokenizer=lora_model.tokenizer)
    trainable = [name for name, parameter in whole.named_parameters() if parameter.requires_grad]
    missing = [name for name in trainable if name not in merged]
    if missing:
        raise ValueError(f"{source}: the merged model lacks {missing[:5]} ({len(missing)} in all)")
    new_config = copy.deepcopy(run_config)
    new_config["model"].update(lora_rank=0, llm_full_finetune=True)
    contents = {key: value for key, value in checkpoint.items() if key in ("format_version",)}
    contents.update(model={name: merged[name].detach().clone() for name in trainable}, config=new_config,
                    merged_from=source)
    return contents


def main(argv: Optional[Sequence[str]] = None) -> None:
    from asr.atomic_io import torch_save_atomically

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint", type=Path, help="a checkpoint of a LoRA run (asr.train's or decoding.pt)")
    parser.add_argument("out", type=Path, help="the merged checkpoint to write")
    args = parser.parse_args(argv)
    if args.out.is_file():
        print(f"merge_lora: {args.out} exists, skipping")
        return
    if not args.checkpoint.is_file():
        raise SystemExit(f"ERROR: checkpoint: file not found: {args.checkpoint}")
    checkpoint = torch.load(args.checkpoint, map_location="cpu", weights_only=False)
    try:
        contents = merged_checkpoint(checkpoint, str(args.checkpoint))
    except (ValueError, KeyError) as error:
        raise SystemExit(f"ERROR: {error}") from None
    torch_save_atomically(contents, args.out)
    print(f"merge_lora: wrote {args.out} ({len(contents['model'])} trainable tensors, LoRA folded into the LLM)")


if __name__ == "__main__":
    main()
