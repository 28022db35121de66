"""Keeps the garbage collector of a reused Python worker off the objects that live as long as it.

Why: PySpark's worker daemon runs a full ``gc.collect()`` after every task of a reused worker, and a
full collection walks every container object the process tracks. After its first task a worker
holds the modules of PySpark, pyarrow, confluent-kafka and sparkafka, about 55,000 such objects:
20-30 ms of CPU per task, as much as reading 100,000 records (docs/benchmarks.md). Objects in the
permanent generation (``gc.freeze()``) are skipped by collections, which then walk only what the
current task made.

Steps, once per process and entry point (a worker that first writes, then reads, imports the
reader's modules later, so each entry point freezes once):

1. ``gc.collect()``: what is already garbage is freed, not kept for ever;
2. ``gc.freeze()``: every object alive now moves to the permanent generation.

Invariant: only objects alive at a freeze are kept from collection. One of them that later becomes
unreachable inside a reference cycle is never freed: at most the objects of the task that was
starting (the reader or writer and its options), once per entry point, so the cost is bounded.
Reference counting frees everything else as before.
"""

from __future__ import annotations

import gc
import os

_frozen: set[tuple[int, str]] = set()


def freeze_long_lived_objects(entry_point: str) -> None:
    """Freeze what this worker process holds, the first time ``entry_point`` runs in it."""
    key = (os.getpid(), entry_point)  # a forked child starts with its parent's set
    if key in _frozen:
        return
    _frozen.add(key)
    gc.collect()
    gc.freeze()
