"""The three semirings of the alignment passes (see alignment.py).

- ``LOG_MAX``: max-plus on log scores, for the best alignment and the kept arcs.
- ``LOG_SUM``: log-sum-exp on log scores, exact but slower (the fallback).
- ``SCALED_SUM``: sum-product on probabilities, each frame divided by its largest value
  and emissions shifted by their per-frame maximum, the logs of both kept aside
  (Rabiner-style scaling); cheap, with a dynamic range of about 708 nats inside a frame.

The forward recursion runs one frame at a time over tensors of a few thousand values, so
its cost is the number of tensor operations per frame, not their arithmetic. ``recurse``
therefore takes arc weights with the target state's emission (and the arc's removal)
already folded in, reads the three arc sources as views of the previous history row,
writes into the next row and allocates nothing: four or five operations per frame.
"""

from __future__ import annotations

import torch

NEG_INF = float("-inf")


def arc_sources(history: torch.Tensor):
    """(T + 1, N, L + 2) history with two leading padding columns -> three tuples of
    T + 1 (N, L) views: row t's scores at s (the row's states themselves), at s - 1 and
    at s - 2, the sources of the stay, step and skip arcs into s at frame t + 1."""
    return (history[:, :, 2:].unbind(0), history[:, :, 1:-1].unbind(0),
            history[:, :, :-2].unbind(0))


class Semiring:
    zero: float
    one: float

    def plus_all(self, values: torch.Tensor) -> torch.Tensor:
        """Combines any number of alternatives along the last axis."""
        raise NotImplementedError

    def from_log_emissions(self, log_emissions: torch.Tensor):
        """(T, N, L) log emissions -> (emissions in this domain, per-frame log shift (T, N)
        or None)."""
        return log_emissions, None

    def recurse(self, history: torch.Tensor, stay: torch.Tensor, step: torch.Tensor,
                skip: torch.Tensor) -> torch.Tensor:
        """Fills rows 1..T of ``history`` (T + 1, N, L + 2) from row 0 (the virtual start)
        and returns the log of the factor each frame was divided by, (T, N).

        stay, step, skip: (T, N, L) weights of the arcs into s from s, s - 1 and s - 2:
        the emission of s, or the semiring's zero where the arc is removed. ``step`` may
        be ``stay`` itself (the same tensor), which saves an operation per frame."""
        raise NotImplementedError

    def to_log(self, values: torch.Tensor) -> torch.Tensor:
        return values

    def posterior(self, forward: torch.Tensor, after: torch.Tensor, emissions: torch.Tensor,
                  contributes: torch.Tensor) -> torch.Tensor:
        """State posteriors (T, N, L), normalized over the last axis, from forward scores
        (emission included), ``after`` = emission x backward, and the emissions; 0 on
        frames where ``contributes`` (T, N) is False and where undefined (no live state,
        or a state that emits the semiring's zero)."""
        raise NotImplementedError


class LogMax(Semiring):
    zero, one = NEG_INF, 0.0

    def plus_all(self, values):
        return values.amax(dim=-1)

    @staticmethod
    def plus(first: torch.Tensor, second: torch.Tensor, out: torch.Tensor) -> None:
        torch.maximum(first, second, out=out)

    def recurse(self, history, stay, step, skip):
        states, one_back, two_back = arc_sources(history)
        shared = step is stay
        stay, step, skip = stay.unbind(0), step.unbind(0), skip.unbind(0)
        candidate = torch.empty_like(states[0])
        for t in range(len(stay)):
            out = states[t + 1]
            if shared:
                self.plus(states[t], one_back[t], out=out)
                out.add_(stay[t])
            else:
                torch.add(states[t], stay[t], out=out)
                torch.add(one_back[t], step[t], out=candidate)
                self.plus(out, candidate, out=out)
            torch.add(two_back[t], skip[t], out=candidate)
            self.plus(out, candidate, out=out)
        return history.new_zeros(len(stay), history.shape[1])


class LogSum(LogMax):
    def plus_all(self, values):
        return torch.logsumexp(values, dim=-1)

    @staticmethod
    def plus(first, second, out):
        torch.logaddexp(first, second, out=out)

    def posterior(self, forward, after, emissions, contributes):
        joint = (forward + after - emissions).masked_fill(torch.isneginf(emissions), NEG_INF)
        posterior = torch.softmax(joint, dim=-1)
        return posterior.masked_fill_(~contributes.unsqueeze(-1) | torch.isnan(posterior), 0.0)


class ScaledSum(Semiring):
    zero, one = 0.0, 1.0
    tiny = torch.finfo(torch.float64).tiny

    def plus_all(self, values):
        return values.sum(dim=-1)

    def from_log_emissions(self, log_emissions):
        shift = log_emissions.amax(dim=2)
        shift = torch.where(torch.isneginf(shift), torch.zeros_like(shift), shift)
        return torch.exp(log_emissions - shift.unsqueeze(2)), shift

    def recurse(self, history, stay, step, skip):
        states, one_back, two_back = arc_sources(history)
        shared = step is stay
        stay, step, skip = stay.unbind(0), step.unbind(0), skip.unbind(0)
        max_frames, num_utterances = len(stay), history.shape[1]
        # A trailing column of `tiny` makes each frame's divisor at least `tiny`: a frame
        # with no live state stays 0, and the utterance's total becomes log 0 = -inf.
        work = history.new_empty(num_utterances, history.shape[2] - 1)
        work[:, -1] = self.tiny
        scores = work[:, :-1]
        scales = history.new_empty(max_frames, num_utterances, 1)
        frame_scales = scales.view(max_frames, num_utterances).unbind(0)
        scale_columns = scales.unbind(0)
        for t in range(max_frames):
            if shared:
                torch.add(states[t], one_back[t], out=scores)
                scores.mul_(stay[t])
            else:
                torch.mul(states[t], stay[t], out=scores)
                scores.addcmul_(one_back[t], step[t])
            scores.addcmul_(two_back[t], skip[t])
            torch.amax(work, dim=1, out=frame_scales[t])
            torch.div(scores, scale_columns[t], out=states[t + 1])
        return torch.log(scales.view(max_frames, num_utterances))

    def to_log(self, values):
        return torch.log(values)

    def posterior(self, forward, after, emissions, contributes):
        # A state that emits 0 has forward score 0 and gives 0 / 0 = NaN, left out of the
        # normalizer and set to 0; an infinite normalizer zeroes non-contributing frames.
        joint = (forward * after).div_(emissions)
        normalizer = joint.nansum(dim=-1, keepdim=True)
        normalizer.masked_fill_(~contributes.unsqueeze(-1), float("inf"))
        return joint.div_(normalizer).nan_to_num_(nan=0.0)


LOG_MAX = LogMax()
LOG_SUM = LogSum()
SCALED_SUM = ScaledSum()
