"""The three semirings of the alignment passes (see alignment.py).

- ``LOG_MAX``: max-plus on log scores, for the best alignment and the kept arcs.
- ``LOG_SUM``: log-sum-exp on log scores, exact but slow on small tensors (the fallback).
- ``SCALED_SUM``: sum-product on probabilities, each frame divided by its largest value
  and emissions shifted by their per-frame maximum, the logs of both kept aside
  (Rabiner-style scaling); cheap, with a dynamic range of about 708 nats inside a frame.
"""

from __future__ import annotations

import torch

NEG_INF = float("-inf")


class Semiring:
    zero: float
    one: float

    def plus(self, candidates: torch.Tensor) -> torch.Tensor:
        """Combines the 3 arc alternatives along the last axis."""
        return self.plus_all(candidates)

    def plus_all(self, values: torch.Tensor) -> torch.Tensor:
        """Combines any number of alternatives along the last axis."""
        raise NotImplementedError

    def from_log_emissions(self, log_emissions: torch.Tensor):
        """(T, N, L) log emissions -> (emissions in this domain, per-frame log shift (T, N)
        or None)."""
        return log_emissions, None

    def step(self, candidates: torch.Tensor, emissions: torch.Tensor, out: torch.Tensor,
             scales: torch.Tensor) -> None:
        """One frame of the forward recursion: combines the arc candidates (N, L, 3),
        multiplies by the frame's emissions (N, L) and writes the result to ``out``,
        divided by per-utterance factors that it writes to ``scales`` (N,), if any."""
        torch.add(self.plus(candidates), emissions, out=out)

    def log_of_scales(self, scales: torch.Tensor) -> torch.Tensor:
        return torch.zeros_like(scales)

    def to_log(self, values: torch.Tensor) -> torch.Tensor:
        return values

    def posterior(self, forward: torch.Tensor, after: torch.Tensor,
                  emissions: torch.Tensor) -> torch.Tensor:
        """State posteriors (T, N, L), normalized over the last axis, from forward scores
        (emission included), ``after`` = emission x backward, and the emissions."""
        raise NotImplementedError


class LogMax(Semiring):
    zero, one = NEG_INF, 0.0

    def plus_all(self, values):
        return values.amax(dim=-1)


class LogSum(LogMax):
    def plus_all(self, values):
        return torch.logsumexp(values, dim=-1)

    def posterior(self, forward, after, emissions):
        joint = (forward + after - emissions).masked_fill(torch.isneginf(emissions), NEG_INF)
        return torch.softmax(joint, dim=-1)


class ScaledSum(Semiring):
    zero, one = 0.0, 1.0
    tiny = torch.finfo(torch.float64).tiny

    def plus_all(self, values):
        return values.sum(dim=-1)

    def plus(self, candidates):
        # Explicit adds: a reduction over a last axis of 3 is several times slower on CPU.
        return candidates[..., 0] + candidates[..., 1] + candidates[..., 2]

    def from_log_emissions(self, log_emissions):
        shift = log_emissions.amax(dim=2)
        shift = torch.where(torch.isneginf(shift), torch.zeros_like(shift), shift)
        return torch.exp(log_emissions - shift.unsqueeze(2)), shift

    def step(self, candidates, emissions, out, scales):
        scores = self.plus(candidates).mul_(emissions)
        # A frame with no live state (max 0) is divided by `tiny`: it stays 0, and the
        # utterance's total becomes log 0 = -inf as it should.
        torch.amax(scores, dim=1, out=scales).clamp_(min=self.tiny)
        torch.div(scores, scales.unsqueeze(1), out=out)

    def log_of_scales(self, scales):
        return torch.log(scales)

    def to_log(self, values):
        return torch.log(values)

    def posterior(self, forward, after, emissions):
        joint = torch.where(emissions > 0, forward * after / emissions,
                            torch.zeros_like(forward))
        return joint / joint.sum(dim=-1, keepdim=True)


LOG_MAX = LogMax()
LOG_SUM = LogSum()
SCALED_SUM = ScaledSum()
