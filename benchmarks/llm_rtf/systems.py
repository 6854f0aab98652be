"""What the RTF benchmark (``benchmarks.llm_rtf``), its profile and its precision check
share: LLM-CTC and LLM-CE built on the same random parts at the timing settings of the
paper (App. D.3, "SPEAR-Qwen3 timing settings": LLM weights BF16, encoder/projector BF16
mixed precision, LLM head FP32, vocabulary chunk 4,096, batch 1, one CPU thread), and one
utterance's recognition by each.

The precision options apply to both systems identically, so that neither is timed at a
cheaper setting than the other.
"""

from __future__ import annotations

import argparse
import functools
from pathlib import Path

import torch
from torch import nn

from benchmarks.llm_support import batch_of, build_model, load_utterances

PAPER_PRECISION = dict(llm_dtype="bfloat16", head_dtype="float32", encoder_autocast="bfloat16",
                       attn_implementation="sdpa", argmax="screened")


def warmup_and_timed_utterances(args) -> tuple:
    """(warm-up utterances, timed utterances) of ``--cuts`` (or synthesized ones): the
    warm-up ones first, the timed ones after them, no overlap (App. D.3's protocol)."""
    manifest = None if args.synthesized else args.cuts
    everything = load_utterances(manifest, args.warmup + args.utterances, seed=args.seed)
    if len(everything) < args.warmup + 1:
        raise SystemExit(f"--cuts: {manifest} has {len(everything)} utterances, fewer than --warmup + 1")
    return everything[:args.warmup], everything[args.warmup:]


def add_precision_arguments(parser: argparse.ArgumentParser) -> None:
    """Defaults: the paper's timing settings (App. D.3)."""
    parser.add_argument("--llm-dtype", default=PAPER_PRECISION["llm_dtype"], choices=["bfloat16", "float32"],
                        help="LLM weights (App. D.3: BF16)")
    parser.add_argument("--head-dtype", default=PAPER_PRECISION["head_dtype"], choices=["float32", "llm"],
                        help="the LLM head's weight: a resident float32 copy (App. D.3: FP32) or the LLM's "
                             "own (tied) weight, converted to float32 block by block when used")
    parser.add_argument("--encoder-autocast", default=PAPER_PRECISION["encoder_autocast"],
                        choices=["bfloat16", "none"],
                        help="encoder and projector under CPU/CUDA autocast (App. D.3: BF16 mixed precision)")
    parser.add_argument("--attn-implementation", default=PAPER_PRECISION["attn_implementation"],
                        choices=["sdpa", "eager"], help="the LLM's attention (transformers)")
    parser.add_argument("--argmax", default=PAPER_PRECISION["argmax"], choices=["screened", "exact"],
                        help="greedy's float32 head argmax (both systems): through a BF16 product first "
                             "(llm_ctc/head_argmax.py; the same ids) or float32 products of every block")


def precision_description(args) -> str:
    head = "FP32 head (resident copy)" if args.head_dtype == "float32" else "head in the LLM's dtype"
    encoder = ("encoder/projector under BF16 autocast" if args.encoder_autocast == "bfloat16"
               else "encoder/projector FP32")
    llm = "BF16" if args.llm_dtype == "bfloat16" else "FP32"
    argmax = ("greedy argmax of the FP32 head screened by a BF16 product (same ids)" if args.argmax == "screened"
              else "greedy argmax of the FP32 head block by block")
    return f"LLM weights {llm}, {head}, {encoder}, attention '{args.attn_implementation}', {argmax}"


def under_autocast(module: nn.Module, device: str, dtype: torch.dtype) -> None:
    """Runs ``module``'s forward under autocast from now on (the encoder and projector only:
    the head stays FP32 and the LLM has its own weight dtype)."""
    inner = module.forward

    @functools.wraps(inner)
    def forward(*arguments, **options):
        with torch.autocast(device_type=device, dtype=dtype):
            return inner(*arguments, **options)

    module.forward = forward


def use_float32_head(model: nn.Module) -> None:
    """The LLM head's weight as a resident float32 tensor (its own copy: a tied head stops
    sharing the BF16 input embedding, which keeps its dtype). App. D.3 times an FP32 head
    over BF16 LLM weights; without the copy, every use converts 151,936 x D rows."""
    head = model.lm_head
    if head.weight.dtype != torch.float32:
        head.weight = nn.Parameter(head.weight.detach().float(), requires_grad=False)
    if head.bias is not None and head.bias.dtype != torch.float32:
        head.bias = nn.Parameter(head.bias.detach().float(), requires_grad=False)


def apply_precision(model: nn.Module, args) -> nn.Module:
    model.config.screened_argmax = args.argmax == "screened"
    if args.head_dtype == "float32":
        use_float32_head(model)
    if args.encoder_autocast != "none":
        dtype = getattr(torch, args.encoder_autocast)
        under_autocast(model.encoder, args.device, dtype)
        under_autocast(model.projector, args.device, dtype)
    return model


def build_systems(args, work_dir: Path):
    """(LLM-CTC, LLM-CE) on the same random parts, at ``args``' precision, on ``args.device``."""
    ctc_model = build_model(args, work_dir, args.seed, llm_dtype=args.llm_dtype,
                            attn_implementation=args.attn_implementation)
    ce_model = build_model(args, work_dir, args.seed, objective="ce", tokenizer=ctc_model.tokenizer,
                           llm_dtype=args.llm_dtype, attn_implementation=args.attn_implementation)
    check_same_parts(ctc_model, ce_model)
    systems = []
    for model in (ctc_model, ce_model):
        systems.append(apply_precision(model.to(args.device), args))
    return tuple(systems)


def check_same_parts(ctc_model, ce_model) -> None:
    """The two systems must time the same encoder, projector, LLM and head."""
    ce_state = ce_model.state_dict()
    for name, tensor in ctc_model.state_dict().items():
        if name in ce_state and not torch.equal(tensor, ce_state[name]):
            raise RuntimeError(f"LLM-CTC and LLM-CE differ in {name}: not the same model")


def recognize_ctc(model, utterance, device: str) -> tuple[str, int]:
    """Framewise greedy over the full head by its argmax, collapse, detokenization."""
    from llm_ctc.decoding import recognize

    features, lengths = batch_of([utterance])
    _, texts = recognize(model, features.to(device), lengths.to(device))
    return texts[0], 0


def recognize_ctc_by_log_softmax(model, utterance, device: str) -> tuple[str, int]:
    """The greedy path before the argmax one: (T, V) log-probabilities, then search."""
    from asr.decode_methods import ctc_search
    from llm_ctc.tokenizer import LLMTokenizer

    features, lengths = batch_of([utterance])
    with torch.inference_mode():
        log_probs, frames = model.log_probs(features.to(device), lengths.to(device))
    ids = ctc_search("ctc-greedy-search", log_probs, frames, model.blank_id)
    tokenizer = LLMTokenizer.of_model(model)
    return tokenizer.decode_batch(ids)[0], 0


def recognize_ce(model, utterance, device: str, token_limit: int) -> tuple[str, int]:
    """Greedy generation with the KV cache, at most ``token_limit`` steps, detokenization."""
    features, lengths = batch_of([utterance])
    model.config.max_new_tokens = token_limit
    (ids,) = model.generate_ids(features.to(device), lengths.to(device))
    return model.decode_ids(ids), len(ids)
