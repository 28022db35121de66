"""The benchmark workloads on Quix Streams, run in its own virtualenv (see `quix_env.py`).

``processing_guarantee`` is the guarantee asked for; Quix commits (and, exactly-once, commits its
producer transaction) every ``commit_interval``. The count workload keeps the per-key count in Quix's
state store (RocksDB in ``--work-dir``, backed by a changelog topic Quix creates) and sends one
update per input record. Application.run() stops cleanly on SIGTERM.

Stdlib and quixstreams only.
"""

from __future__ import annotations

import sys
from pathlib import Path

from quixstreams import Application, State
from runner_args import consumer_group, runner_parser


def event(value: bytes) -> bytes:
    return b"EVENT(" + value + b")"


def running_count(_value: bytes, state: State) -> bytes:
    count = state.get("count", 0) + 1
    state.set("count", count)
    return str(count).encode()


def main() -> int:
    args = runner_parser(__doc__.split("\n\n")[0]).parse_args()
    app = Application(
        broker_address=args.bootstrap_servers,
        consumer_group=consumer_group("quix", args.output_topic),
        auto_offset_reset="earliest",
        commit_interval=args.commit_interval_ms / 1000,
        processing_guarantee=args.guarantee,
        state_dir=Path(args.work_dir) / "state",
        loglevel="WARNING",
    )
    source = app.topic(args.input_topic, key_deserializer="bytes", value_deserializer="bytes")
    sink = app.topic(args.output_topic, key_serializer="bytes", value_serializer="bytes")
    frame = app.dataframe(source)
    frame = frame.apply(event) if args.workload == "map" else frame.apply(running_count, stateful=True)
    frame.to_topic(sink)
    app.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
