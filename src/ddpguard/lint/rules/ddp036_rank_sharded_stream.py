"""DDP036 an IterableDataset that keeps one rank's share of its stream.

```python
class Lines(IterableDataset):
    def __iter__(self):
        for i, line in enumerate(open(self.path)):
            if i % dist.get_world_size() == dist.get_rank():
                yield json.loads(line)
```

A stream split by rank inside the dataset's own iteration (`i % world_size == rank`,
`islice(it, rank, None, world_size)`, `files[rank::world_size]`) gives each rank its own count
of samples: one more on some ranks whenever the stream's length is not a multiple of the
number of shares (times the loader's workers), and any sample the iteration skips (too long,
unreadable) changes one rank's count alone. Nothing pads it (a DistributedSampler cannot
serve an IterableDataset), so the ranks run different numbers of steps: the rank with fewer
batches leaves its loop while the others wait in the next step's gradient all-reduce. Reported
in `__iter__` or another generator method of a class derived from `IterableDataset`. Not
reported when a file linted with it trains under DDP's `join()` (or torch's `Join`), or
all-reduces with `ReduceOp.MIN`/`MAX` (the usual way to stop every rank at an agreed step).
Fix: stop every rank at a count they agree on (all-reduce the count with MIN, or a "this rank
is done" flag every step), train under `model.join()`, or cut the stream into equal shares
before training.
"""

from __future__ import annotations

from collections.abc import Iterator

from ..analysis.context import ModuleInfo
from ..analysis.streams import agrees_on_a_count, stream_shares, uses_join
from ..registry import Hit, rule


@rule('DDP036', 'rank-sharded-stream', 'warning',
      'an IterableDataset keeps one rank\'s share of its stream: the ranks get different '
      'sample counts, and the one with fewer batches leaves while the others wait',
      'stop every rank at a count they agree on (all-reduce the count with MIN), train under '
      'model.join(), or cut the stream into equal shares')
def ddp036(info: ModuleInfo) -> Iterator[Hit]:
    """Uneven inputs from a stream. DistributedSampler pads a map-style dataset so every rank
    runs the same number of steps; an IterableDataset that takes its rank's share itself has
    no such padding, and a rank that runs out of batches first leaves the others in DDP's
    gradient all-reduce."""
    if not info.classes:
        return
    shares = list(stream_shares(info))
    infos = getattr(info.file_set, "infos", [info])
    if not shares or any(uses_join(i) or agrees_on_a_count(i) for i in infos):
        return
    for node, cls, share in shares:
        yield node, "DDP036", (
            f"{cls} keeps one rank's share of its stream (`{share}`): the ranks get different "
            "sample counts whenever the stream's length is not a multiple of the shares, or "
            "an item is skipped on one rank, and nothing pads them (no sampler serves an "
            "IterableDataset); the rank with fewer batches leaves its loop while the others "
            "wait in the next gradient all-reduce. Stop every rank at a count they agree on "
            "(all-reduce it with MIN), or train under model.join()")


# Shown in docs/lint.md; tests/lint/test_docs.py checks that it is reported.
EXAMPLE = """\
import json

import torch.distributed as dist
from torch.utils.data import IterableDataset


class Lines(IterableDataset):
    def __init__(self, path):
        self.path = path

    def __iter__(self):
        with open(self.path) as fh:
            for i, line in enumerate(fh):
                if i % dist.get_world_size() == dist.get_rank():
                    yield json.loads(line)
"""

RULE = ddp036
