"""freeze_long_lived_objects: garbage is freed first, then what lives is frozen, once per entry point
of a process. Run in a child process: freezing pytest's own objects would outlive the test."""

from __future__ import annotations

import json
import subprocess
import sys

CHILD = """
import gc, json, os, weakref
from sparkafka.connector.worker_heap import freeze_long_lived_objects

class Node:
    pass

garbage = Node()
garbage.itself = garbage
garbage_ref = weakref.ref(garbage)
del garbage  # unreachable, held only by its own cycle: a collection frees it, a freeze would keep it
freeze_long_lived_objects("source")
first = gc.get_freeze_count()
made_between = [[] for _ in range(100)]
freeze_long_lived_objects("source")  # the same entry point again: nothing more is frozen
again = gc.get_freeze_count()
made_later = [[] for _ in range(1000)]
freeze_long_lived_objects("sink")
after_sink = gc.get_freeze_count()
child = os.fork()
if child == 0:
    made_in_child = [[] for _ in range(10)]
    freeze_long_lived_objects("source")  # a forked worker is a process of its own
    os._exit(0 if gc.get_freeze_count() > after_sink else 1)
_, status = os.waitpid(child, 0)
print(json.dumps({
    "garbage_freed": garbage_ref() is None,
    "first": first,
    "again": again,
    "after_sink": after_sink,
    "forked_child_froze": os.waitstatus_to_exitcode(status) == 0,
}))
"""


def test_garbage_is_freed_then_live_objects_frozen_once_per_entry_point_and_process() -> None:
    result = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["garbage_freed"] is True
    assert report["first"] > 1000  # the interpreter's and sparkafka's modules
    assert report["again"] == report["first"]  # the same entry point freezes once
    assert report["after_sink"] >= report["first"] + 1000  # another entry point freezes what came since
    assert report["forked_child_froze"] is True
