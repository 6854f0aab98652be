"""benchmarks.query_task: each query position is scored on the content token of its own
index in its block (offline: the whole sequence; streaming: its chunk)."""

import random

from benchmarks.query_task.__main__ import example


def test_queries_target_the_content_of_their_index_in_their_block():
    for chunk in (0, 4):
        ids, targets = example(random.Random(3), vocab=50, min_len=9, max_len=9, chunk=chunk)
        bos, query = 50, 51
        assert ids[0] == bos and len(ids) == len(targets) == 1 + 2 * 9
        content = [t for t in ids if t < 50]
        size = chunk or 9
        blocks = [content[s:s + size] for s in range(0, 9, size)]
        expected_ids, expected_targets = [bos], [-100]
        for block in blocks:
            expected_ids += block + [query] * len(block)
            expected_targets += [-100] * len(block) + block
        assert (ids, targets) == (expected_ids, expected_targets)
