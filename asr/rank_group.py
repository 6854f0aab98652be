"""The ranks one training process trains as (``train.virtual_ranks``).

Under DDP, W processes train as W ranks: each draws its own batches (Lhotse's samplers
keep every W-th batch of one shared stream), runs forward and backward on them with its
own random state, and the update averages the W ranks' gradients. A process with
``train.virtual_ranks`` = N trains as N consecutive ranks of a world of W x N: a sampler
per rank (ranks p x N ... p x N + N - 1 for process p), each rank's microbatch in turn
under that rank's random state, the summed gradients times 1/N before the update
(:attr:`asr.train_step.Trainee.gradient_weight`). The update is then the one W x N processes make, on W processes: one
process on a laptop's single core, or one GPU for a run planned on two. asr.train
checkpoints the random states of all W x N ranks, so a run resumes exactly with any W and
N of the same product (the samplers' state is the same on every rank).
"""

from __future__ import annotations

import contextlib
from typing import Any, Dict, Iterator, List, Optional, Sequence

from asr.checkpoint import capture_rng_state, restore_rng_state
from asr.cut_filters import TrainingCutFilter
from asr.data import TrainData


class RankGroup:
    """The training data of ranks ``first_rank`` ... ``first_rank + len(parts) - 1`` of a
    world of ``world_size`` ranks, and the random states of all but the first (whose state
    is the process's own)."""

    def __init__(self, parts: Sequence[TrainData], first_rank: int, world_size: int) -> None:
        if not parts:
            raise ValueError("a rank group needs the training data of one rank at least")
        if not 0 <= first_rank <= world_size - len(parts):
            raise ValueError(f"ranks {first_rank}-{first_rank + len(parts) - 1} are not in a world of {world_size}")
        self.parts = list(parts)
        self.first_rank = first_rank
        self.world_size = world_size
        self._random_states: List[Optional[Dict[str, Any]]] = [None] * len(parts)

    def __len__(self) -> int:
        return len(self.parts)

    @property
    def sampler(self):
        """The first rank's sampler: its checkpoint state restores every rank's (Lhotse's
        sampler state holds no rank)."""
        return self.parts[0].sampler

    @property
    def cut_filter(self) -> TrainingCutFilter:
        """The first rank's filter (every rank's sampler reads, and filters, every cut)."""
        return self.parts[0].cut_filter

    def set_epoch(self, epoch: int) -> None:
        for part in self.parts:
            part.set_epoch(epoch)

    def rounds(self) -> Iterator[List[dict]]:
        """One microbatch of every rank at a time, in rank order, to the end of the epoch.

        Lhotse gives every rank of a world the same number of batches (it drops or
        splits the last ones); a rank that ends before the others is an error."""
        iterators = [iter(part.loader) for part in self.parts]
        while True:
            batches = [next(iterator, None) for iterator in iterators]
            ended = [self.first_rank + index for index, batch in enumerate(batches) if batch is None]
            if len(ended) == len(batches):
                return
            if ended:
                raise RuntimeError(f"the training batches of rank(s) {ended} of {self.world_size} ended before "
                                   f"those of the other ranks of this process")
            yield batches

    def share_random_state(self) -> None:
        """Start every rank from the process's random state, as DDP's processes start from
        the same seed (asr.train, on a run that no checkpoint continues)."""
        state = capture_rng_state()
        self._random_states = [None] + [state] * (len(self.parts) - 1)

    @contextlib.contextmanager
    def random_state_of(self, index: int) -> Iterator[None]:
        """Run the body under the random state of the group's rank ``index`` (0: the
        process's own, untouched); the state the body leaves is that rank's next one."""
        if index == 0:
            yield
            return
        own = capture_rng_state()
        saved = self._random_states[index]
        if saved is not None:
            restore_rng_state(saved)
        try:
            yield
        finally:
            self._random_states[index] = capture_rng_state()
            restore_rng_state(own)

    def random_states(self) -> List[Dict[str, Any]]:
        """The random states of the group's ranks, in rank order (for a checkpoint)."""
        own = capture_rng_state()
        return [own] + [state if state is not None else own for state in self._random_states[1:]]

    def restore_random_states(self, states: Sequence[Dict[str, Any]]) -> None:
        """Inverse of :meth:`random_states`."""
        if len(states) != len(self.parts):
            raise ValueError(f"{len(states)} random state(s) for a group of {len(self.parts)} rank(s)")
        restore_rng_state(states[0])
        self._random_states = [None, *states[1:]]
