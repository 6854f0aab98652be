"""Export a trained Zipformer CTC model to ONNX for sherpa-onnx.

    python -m zipformer.export_onnx --exp-dir exp/m --epoch 30 --avg 15
    python -m zipformer.export_onnx --checkpoint exp/m/epoch-30.pt --output-dir onnx/

writes ``model.onnx`` (float32), ``model.int8.onnx`` (onnxruntime dynamic quantization
of the MatMul weights to int8) and ``tokens.txt`` into ``--output-dir`` (default
``<exp-dir>/onnx-<checkpoint suffix>``), for ``sherpa_onnx.OfflineRecognizer.
from_zipformer_ctc(model=..., tokens=...)``. Checkpoints are chosen as in
``asr.decode``; the model configuration and lang dir come from the checkpoint.

The graph (sherpa-onnx's Zipformer CTC contract, the one icefall's exported models have):
inputs ``x`` float32 (N, T, 80) fbank and ``x_lens`` int64 (N,); outputs ``log_probs``
float32 (N, T', V) and ``log_probs_len`` int64 (N,), T' = ((T - 7) // 2 + 1) // 2, with
N and T dynamic and V a number in the graph (sherpa reads the vocabulary size from the
output shape); metadata ``model_type=zipformer2_ctc``, ``version``, ``model_author``,
``comment``. T must be at least 9 frames, as for the PyTorch model.

Exporter: ``--exporter torchscript`` (torch.onnx.export with dynamo=False, opset 13) is
the default although torch (2.9 on) deprecates it: with torch 2.13 the graph of
``--exporter dynamo`` (torch.export, opset 18) serves only inputs whose frame count T has
the parity of the example's since commit d65a866 (channels-last depthwise convolutions:
torch.export specializes the encoder's shapes; onnxruntime fails on a Reshape for the
others), while the TorchScript graph serves every T. TorchScript also exports in seconds
where torch.export takes about half a minute (tiny preset) to two minutes (egs/mini),
its opset-13 graph loads in older onnxruntime builds still shipped on phones and embedded
boards, and it is how icefall exports the models sherpa-onnx users already run. Before
anything else is written, :func:`export_model` runs the graph in onnxruntime against
PyTorch on every residue of T mod 4 and deletes a graph that fails or differs on any, so
``--exporter dynamo`` ends with that error until torch.export keeps T symbolic through
the encoder (tests/zipformer/test_export_onnx.py).
"""

from __future__ import annotations

import argparse
import logging
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import torch
from torch import Tensor, nn

from asr.atomic_io import atomic_output
from asr.config import DecodeOptions, build_section, load_run_config, parse_value
from asr.weights import choose_weights, explicit_choice
from zipformer.encoder import MIN_INPUT_FRAMES
from zipformer.model import CTCModel
from zipformer.presets import config_from_dict

logger = logging.getLogger(__name__)

# sherpa-onnx takes the blank id from the first of these names that tokens.txt holds and
# ends the process (exit(-1), no exception) when it holds none
# (sherpa-onnx/csrc/offline-recognizer-ctc-impl.h, greedy search).
BLANK_SYMBOLS = ("<blk>", "<eps>", "<blank>")
EXPORTERS = ("torchscript", "dynamo")
INPUT_NAMES = ["x", "x_lens"]
OUTPUT_NAMES = ["log_probs", "log_probs_len"]
DEFAULT_OPSET = {"torchscript": 13, "dynamo": 18}
# Frame counts of the batches export_model checks onnxruntime against PyTorch on: every
# residue mod 4 (the encoder halves the frame rate twice), since a graph specialized to
# its example's length class fails or differs on the others.
CHECK_FRAMES = (120, 121, 122, 123)


class CTCLogProbs(nn.Module):
    """The exported computation: fbank (N, T, 80), lengths (N,) -> log-probs, lengths."""

    def __init__(self, model: CTCModel) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: Tensor, x_lens: Tensor) -> Tuple[Tensor, Tensor]:
        log_probs, lengths = self.model.log_probs(x, x_lens)
        return log_probs, lengths.to(torch.int64)


# ----------------------------------------------------------------------------- tokens

def read_token_table(path: Path) -> List[Tuple[str, int]]:
    """``symbol id`` lines of an icefall ``tokens.txt``, in file order."""
    entries = []
    for number, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        fields = line.split()
        if not fields:
            continue
        if len(fields) != 2 or not fields[1].isdigit():
            raise ValueError(f"{path}:{number}: expected '<symbol> <id>', found {line!r}")
        entries.append((fields[0], int(fields[1])))
    return entries


def check_token_table(entries: Sequence[Tuple[str, int]], vocab_size: int, blank_id: int,
                      source: str) -> List[Tuple[str, int]]:
    """The output classes 0 .. V-1, one symbol each, with a blank sherpa-onnx can find.

    Symbols starting with ``#`` (lexicon disambiguation symbols, not output classes) are
    dropped. Raises ValueError naming ``source`` when ids are missing or repeated, when
    the table is not the model's size, or when the first of ``BLANK_SYMBOLS`` in the table
    is not the model's blank (sherpa-onnx would decode with the wrong blank, or end the
    process without an error message when there is none).
    """
    classes = [(symbol, index) for symbol, index in entries if not symbol.startswith("#")]
    by_id: Dict[int, str] = {}
    for symbol, index in classes:
        if index in by_id:
            raise ValueError(f"{source}: id {index} is given to both {by_id[index]!r} and {symbol!r}")
        by_id[index] = symbol
    if sorted(by_id) != list(range(len(by_id))) or len(by_id) != vocab_size:
        raise ValueError(f"{source}: expected one symbol for each id 0..{vocab_size - 1} (the model's "
                         f"vocab_size {vocab_size}), found {len(by_id)} ids from {min(by_id, default=None)} "
                         f"to {max(by_id, default=None)}")
    by_symbol = {symbol: index for index, symbol in by_id.items()}
    found = next((symbol for symbol in BLANK_SYMBOLS if symbol in by_symbol), None)
    if found is None or by_symbol[found] != blank_id:
        seen = f"{found!r} has id {by_symbol[found]}" if found else "none of them is in the table"
        raise ValueError(f"{source}: the model's blank (id {blank_id}) is {by_id[blank_id]!r}; sherpa-onnx "
                         f"takes the blank id from the first of {', '.join(BLANK_SYMBOLS)} in tokens.txt "
                         f"({seen}) and exits without an error message when there is none: name the "
                         f"blank {BLANK_SYMBOLS[0]} in the token table")
    return sorted(classes, key=lambda entry: entry[1])


def token_table_of_lang_dir(lang_dir: Path) -> Tuple[List[Tuple[str, int]], str]:
    """(entries, source name): ``tokens.txt``, else the pieces of ``bpe.model``."""
    tokens, bpe_model = lang_dir / "tokens.txt", lang_dir / "bpe.model"
    if tokens.is_file():
        return read_token_table(tokens), str(tokens)
    if bpe_model.is_file():
        import sentencepiece

        processor = sentencepiece.SentencePieceProcessor()
        processor.load(str(bpe_model))
        return [(processor.id_to_piece(i), i) for i in range(processor.get_piece_size())], str(bpe_model)
    raise FileNotFoundError(f"lang dir {lang_dir} has neither tokens.txt nor bpe.model "
                            f"(looked for {tokens} and {bpe_model}); give --tokens")


def write_token_table(entries: Sequence[Tuple[str, int]], path: Path) -> None:
    with atomic_output(path) as partial:
        partial.write_text("".join(f"{symbol} {index}\n" for symbol, index in entries), encoding="utf-8")


# ----------------------------------------------------------------------------- export

def example_inputs(feature_dim: int) -> Tuple[Tensor, Tensor]:
    """A padded batch of two utterances (the tracer sees a real mask)."""
    generator = torch.Generator().manual_seed(0)
    features = torch.randn(2, 123, feature_dim, generator=generator)
    return features, torch.tensor([123, 87], dtype=torch.int64)


def export_graph(model: CTCModel, path: Path, exporter: str = "torchscript",
                 opset: Optional[int] = None) -> None:
    """Write the float32 graph of ``model`` (eval mode) to ``path`` (atomically)."""
    if exporter not in EXPORTERS:
        raise ValueError(f"exporter must be one of {EXPORTERS}, got {exporter!r}")
    opset = opset or DEFAULT_OPSET[exporter]
    wrapper = CTCLogProbs(model).eval()
    inputs = example_inputs(model.config.feature_dim)
    with atomic_output(path) as partial, torch.no_grad():
        if exporter == "torchscript":
            torch.onnx.export(
                wrapper, inputs, str(partial), dynamo=False, opset_version=opset,
                input_names=INPUT_NAMES, output_names=OUTPUT_NAMES,
                dynamic_axes={"x": {0: "N", 1: "T"}, "x_lens": {0: "N"},
                              "log_probs": {0: "N", 1: "T_out"}, "log_probs_len": {0: "N"}})
        else:
            batch, frames = torch.export.Dim("N", max=1024), torch.export.Dim("T", min=MIN_INPUT_FRAMES,
                                                                              max=1_000_000)
            program = torch.onnx.export(
                wrapper, inputs, dynamo=True, opset_version=opset, input_names=INPUT_NAMES,
                output_names=OUTPUT_NAMES, dynamic_shapes={"x": {0: batch, 1: frames}, "x_lens": {0: batch}})
            program.save(str(partial), external_data=False)


def add_metadata(path: Path, metadata: Dict[str, str]) -> None:
    """Set ``metadata_props`` of the ONNX file at ``path`` (rewritten atomically)."""
    import onnx

    graph = onnx.load(str(path))
    kept = [prop for prop in graph.metadata_props if prop.key not in metadata]
    del graph.metadata_props[:]
    graph.metadata_props.extend(kept)
    for key, value in metadata.items():
        graph.metadata_props.add(key=key, value=str(value))
    with atomic_output(path) as partial:
        onnx.save(graph, str(partial))


def check_graph_contract(path: Path, vocab_size: int) -> None:
    """Names and dtypes of sherpa-onnx's contract, and V a number in the output shape."""
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    float32, int64 = onnx.TensorProto.FLOAT, onnx.TensorProto.INT64
    expected = [("input", graph.input, INPUT_NAMES, (float32, int64)),
                ("output", graph.output, OUTPUT_NAMES, (float32, int64))]
    for kind, values, names, types in expected:
        found = [(value.name, value.type.tensor_type.elem_type) for value in values]
        if found != list(zip(names, types)):
            raise RuntimeError(f"{path}: expected {kind}s {list(zip(names, types))} (name, ONNX type), got {found}")
    dims = graph.output[0].type.tensor_type.shape.dim
    if len(dims) != 3 or dims[2].dim_value != vocab_size:
        raise RuntimeError(f"{path}: the log_probs output must have the vocabulary size {vocab_size} as a "
                           f"fixed last dimension (sherpa-onnx reads it there), got {dims}")


def quantize_int8(fp32_path: Path, int8_path: Path) -> None:
    """onnxruntime dynamic quantization: MatMul weights to int8, activations at run time."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    with atomic_output(int8_path) as partial:
        quantize_dynamic(model_input=str(fp32_path), model_output=str(partial),
                         op_types_to_quantize=["MatMul"], weight_type=QuantType.QInt8)


def onnx_log_probs(path: Path, features: Tensor, feature_lens: Tensor) -> Tuple[Tensor, Tensor]:
    """Run the exported graph with onnxruntime (one thread) on a batch."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    session = onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    log_probs, lengths = session.run(OUTPUT_NAMES, {"x": features.numpy(), "x_lens": feature_lens.numpy()})
    return torch.from_numpy(log_probs), torch.from_numpy(lengths)


def check_against_pytorch(model: CTCModel, path: Path, tolerance: float = 1e-3) -> float:
    """Max abs difference of the graph at ``path`` (onnxruntime) from ``model`` over two-utterance
    batches of each frame count in ``CHECK_FRAMES``; RuntimeError naming the file and the
    frame count where onnxruntime fails or differs by more than ``tolerance``."""
    worst = 0.0
    for frames in CHECK_FRAMES:
        features = torch.randn(2, frames, model.config.feature_dim, generator=torch.Generator().manual_seed(frames))
        lengths = torch.tensor([frames, frames - 30], dtype=torch.int64)
        with torch.no_grad():
            expected, expected_lens = CTCLogProbs(model)(features, lengths)
        try:
            got, got_lens = onnx_log_probs(path, features, lengths)
        except Exception as error:  # onnxruntime raises its own exception types
            first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            raise RuntimeError(f"{path}: onnxruntime fails on a batch of T = {frames} frames, so the exported "
                               f"graph does not serve every input length ({first_line[:300]})") from error
        difference = max((got[i, :n] - expected[i, :n]).abs().max().item() for i, n in enumerate(expected_lens))
        if not torch.equal(got_lens, expected_lens) or difference > tolerance:
            raise RuntimeError(f"{path}: onnxruntime differs from PyTorch on a batch of T = {frames} frames "
                               f"(max abs {difference:.2e} > {tolerance:.0e}, lengths {got_lens.tolist()} vs "
                               f"{expected_lens.tolist()})")
        worst = max(worst, difference)
    return worst


def export_model(model: CTCModel, token_entries: Sequence[Tuple[str, int]], output_dir: Path, *,
                 token_source: str = "tokens", exporter: str = "torchscript", opset: Optional[int] = None,
                 int8: bool = True, model_author: str = "pruned-ctc-asr", comment: str = "") -> Dict[str, Path]:
    """Write model.onnx, model.int8.onnx (if ``int8``) and tokens.txt; returns their paths.

    The token table is checked before anything is written (see :func:`check_token_table`),
    the graph against PyTorch before anything else is (:func:`check_against_pytorch`; a
    graph that fails it is deleted).
    """
    config = model.config
    if config.streaming:
        raise ValueError("this model reads chunk windows (model.streaming, zipformer/windows.py); an ONNX graph of "
                         "its encoder would read whole utterances in sherpa-onnx's offline CTC and so decode "
                         "differently: export a model trained without model.streaming")
    entries = check_token_table(token_entries, config.vocab_size, config.blank_id, token_source)
    output_dir.mkdir(parents=True, exist_ok=True)
    model = model.to("cpu").float().eval()
    paths = {"model": output_dir / "model.onnx", "tokens": output_dir / "tokens.txt"}
    metadata = {"model_type": "zipformer2_ctc", "version": "1", "model_author": model_author,
                "comment": comment or f"Zipformer CTC, {model.num_parameters()} parameters, "
                                      f"vocab_size {config.vocab_size}, exported with {exporter}",
                "vocab_size": str(config.vocab_size), "subsampling_factor": "4"}
    started = time.monotonic()
    export_graph(model, paths["model"], exporter, opset)
    logger.info("wrote %s with the %s exporter in %.1f s", paths["model"], exporter, time.monotonic() - started)
    try:
        add_metadata(paths["model"], metadata)
        check_graph_contract(paths["model"], config.vocab_size)
        difference = check_against_pytorch(model, paths["model"])
    except RuntimeError:
        paths["model"].unlink()
        raise
    logger.info("onnxruntime vs PyTorch at T = %s frames: max abs difference %.2e",
                ", ".join(map(str, CHECK_FRAMES)), difference)
    if int8:
        paths["int8"] = output_dir / "model.int8.onnx"
        quantize_int8(paths["model"], paths["int8"])
        add_metadata(paths["int8"], metadata)
        logger.info("wrote %s", paths["int8"])
    write_token_table(entries, paths["tokens"])
    return paths


# ----------------------------------------------------------------------------- command

def load_model(args: argparse.Namespace) -> Tuple[CTCModel, dict, str, Path]:
    """(model with the chosen weights, training configuration, checkpoint suffix, the
    folder of the weights: the experiment folder or the checkpoint's)."""
    if args.checkpoint:
        path = Path(args.checkpoint)
        if not path.is_file():
            raise FileNotFoundError(f"--checkpoint: file not found: {path}")
        checkpoint = torch.load(path, map_location="cpu", weights_only=False)
        config = checkpoint.get("config") if isinstance(checkpoint, dict) else None
        if not config or "model" not in config or checkpoint.get(args.entry) is None:
            raise ValueError(f"--checkpoint {path}: expected a checkpoint of asr.train with a "
                             f"'config' and a '{args.entry}' entry")
        weights, suffix, folder = checkpoint[args.entry], path.stem, path.parent
    else:
        # The checkpoint choice of asr.decode (decode.epoch/iter/avg/use_averaged_model): from
        # the decode section of --config, else the defaults, with the flags on top.
        flags = {"epoch": args.epoch, "iter": args.iter, "avg": args.avg, "use_averaged_model": args.use_averaged_model}
        flags = [f"{k}={v}" for k, v in flags.items() if v is not None]
        exp_dir = args.exp_dir
        if args.config is not None:
            run = load_run_config(args.config, explicit_choice(args.overrides + [f"decode.{f}" for f in flags]))
            exp_dir = exp_dir or run.train.exp_dir
            options = run.decode
        else:
            options = build_section(DecodeOptions, {}, flags, "decode")
        if not exp_dir:
            raise ValueError("give --exp-dir (with --epoch/--iter, --avg), --config or --checkpoint")
        chosen = choose_weights(exp_dir, options)
        config, weights, suffix, folder = chosen.saved.to_dict(), chosen.state_dict(), chosen.suffix, Path(exp_dir)
    model = CTCModel(config_from_dict(config["model"]))
    model.load_state_dict(weights)
    return model.eval(), config, suffix, folder


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Path]:
    args = parse_args(argv)
    # Warnings only from the exporters and the quantizer (their INFO lines run to thousands).
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(message)s", force=True)
    logger.setLevel(logging.INFO)
    try:
        model, config, suffix, folder = load_model(args)
        if args.tokens:
            token_entries, source = read_token_table(Path(args.tokens)), args.tokens
        else:
            lang_dir = Path(args.lang_dir or config["train"]["lang_dir"])
            token_entries, source = token_table_of_lang_dir(lang_dir)
        output_dir = Path(args.output_dir) if args.output_dir else folder / f"onnx-{suffix}"
        paths = export_model(model, token_entries, output_dir, token_source=source, exporter=args.exporter,
                             opset=args.opset, int8=args.int8, model_author=args.model_author,
                             comment=args.comment)
    except (FileNotFoundError, ValueError, KeyError, RuntimeError) as error:
        raise SystemExit(f"ERROR: {error}") from None
    print("\n".join(f"wrote {path}" for path in paths.values()))
    return paths


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Export a Zipformer CTC model to ONNX for sherpa-onnx.")
    parser.add_argument("--config", type=Path, default=None,
                        help="a recipe preset: train.exp_dir and the decode section choose the weights")
    parser.add_argument("overrides", nargs="*", help="section.field=value overrides of --config")
    parser.add_argument("--exp-dir", default=None, help="experiment folder of asr.train")
    parser.add_argument("--epoch", help="decode.epoch as in asr.decode: a number or 'last' (the default)")
    parser.add_argument("--iter", help="decode.iter as in asr.decode: a batch number, 'last', or 0 (use --epoch)")
    parser.add_argument("--avg", help="decode.avg as in asr.decode")
    parser.add_argument("--use-averaged-model", help="decode.use_averaged_model as in asr.decode (true/false)")
    parser.add_argument("--checkpoint", default=None, help="one checkpoint file instead of --exp-dir averaging")
    parser.add_argument("--entry", choices=("model", "model_avg"), default="model",
                        help="with --checkpoint: the weights to export")
    parser.add_argument("--lang-dir", default=None, help="default: the training run's train.lang_dir")
    parser.add_argument("--tokens", default=None, help="a tokens.txt to use instead of the lang dir's")
    parser.add_argument("--output-dir", default=None, help="default: <exp-dir>/onnx-<checkpoint suffix>")
    parser.add_argument("--exporter", choices=EXPORTERS, default="torchscript",
                        help="torchscript (dynamo=False, fast, opset 13) or dynamo (torch.export, opset 18)")
    parser.add_argument("--opset", type=int, default=None, help="default: 13 (torchscript), 18 (dynamo)")
    parser.add_argument("--int8", type=lambda raw: parse_value(raw, "bool", "--int8"), default=True,
                        help="also write model.int8.onnx")
    parser.add_argument("--model-author", default="pruned-ctc-asr", help="ONNX metadata model_author")
    parser.add_argument("--comment", default="", help="ONNX metadata comment")
    args = parser.parse_args(argv)
    if args.overrides and args.config is None:
        parser.error("section.field=value overrides need --config")
    if args.checkpoint and args.exp_dir and args.output_dir is None:
        parser.error("--checkpoint and --exp-dir: give one of them (or --output-dir)")
    return args


if __name__ == "__main__":
    main()
