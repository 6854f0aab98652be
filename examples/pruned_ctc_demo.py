#!/usr/bin/env python3
"""A runnable example of the loss: Pruned CTC in place of head + log_softmax + CTC.

Builds a batch of 16 utterances of 100 encoder frames (D = 512) with a 50,000-class head,
computes the loss and gradients with ``pruned_ctc_loss`` and with the dense baseline
``standard_ctc_loss``, and prints both with their agreement and time.

    python examples/pruned_ctc_demo.py [--vocab-size 50000]
"""

import argparse
import time

import torch

from pruned_ctc import DEFAULT_BEAM, DEFAULT_CHUNK_SIZE, pruned_ctc_loss, standard_ctc_loss


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vocab-size", type=int, default=50_000)
    parser.add_argument("--utterances", type=int, default=16)
    parser.add_argument("--beam", type=float, default=DEFAULT_BEAM)
    args = parser.parse_args()

    torch.manual_seed(0)
    frames, dim = 100, 512
    encoder_out = torch.randn(args.utterances, frames, dim)
    head = torch.nn.Linear(dim, args.vocab_size)
    # Targets: about 25 tokens per utterance, ids 1..V-1 (0 is blank).
    targets = [torch.randint(1, args.vocab_size, (int(torch.randint(15, 35, ()).item()),))
               .tolist() for _ in range(args.utterances)]
    lengths = torch.randint(80, frames + 1, (args.utterances,))

    results = {}
    for name, loss_function, options in (
        ("standard CTC", standard_ctc_loss, {}),
        ("Pruned CTC", pruned_ctc_loss, {"beam": args.beam}),
    ):
        x = encoder_out.clone().requires_grad_(True)
        head.zero_grad(set_to_none=True)
        start = time.perf_counter()
        loss = loss_function(x, head.weight, head.bias, targets, lengths, **options)
        loss.backward()
        elapsed = time.perf_counter() - start
        results[name] = (loss.item(), x.grad.clone(), head.weight.grad.clone())
        print(f"{name:13s} loss {loss.item():12.4f}   forward + backward {elapsed:.2f} s")

    (loss_a, dx_a, dw_a), (loss_b, dx_b, dw_b) = results.values()
    relative = lambda a, b: ((a - b).norm() / b.norm()).item()  # noqa: E731
    print(f"relative difference: loss {abs(loss_a - loss_b) / abs(loss_a):.1e}, "
          f"dL/dX {relative(dx_b, dx_a):.1e}, dL/dW {relative(dw_b, dw_a):.1e}")
    print(f"standard CTC materialized {args.utterances * frames:,} x {args.vocab_size:,} "
          f"logits; Pruned CTC never held more than {args.utterances * frames:,} x "
          f"{min(DEFAULT_CHUNK_SIZE, args.vocab_size):,} of them at once.")


if __name__ == "__main__":
    main()
