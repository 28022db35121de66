"""The benchmark workloads on sparkafka, through its command line: this process becomes
``python -m sparkafka run`` (exec, so the driver's SIGTERM reaches sparkafka's own handler).

The commit interval is the trigger: each micro-batch is one checkpointed (exactly-once: transactional)
write. map is seed 001's EVENT(a,b) in append mode; count is a running count per key in update mode,
one update per key per micro-batch. Spark runs local[2].

A backlog is read in micro-batches of at most BENCH_MAX_OFFSETS_PER_TRIGGER records (the source's
maxOffsetsPerTrigger, as a user sizing batches would set it; the driver sets it from the run's size,
default 200,000): output then becomes visible batch by batch, as it does with the other systems'
commits every commit interval, instead of all at once after one micro-batch that holds the whole
backlog.

BENCH_SPARK_CONF (space-separated KEY=VALUE) adds Spark settings to sparkafka's runs, for A/B
measurements of one setting (e.g. ``spark.ui.enabled=false``: commit markers without the number of
write partitions).

Stdlib only; started with the project venv's python, which has sparkafka installed.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from runner_args import runner_parser

MAP_SQL = "SELECT key, concat('EVENT(', CAST(value AS STRING), ')') AS value FROM input"
COUNT_SQL = "SELECT key, CAST(count(*) AS STRING) AS value FROM input GROUP BY key"


def main() -> None:
    args = runner_parser(__doc__.split("\n\n")[0]).parse_args()
    workload = (
        ["--sql", MAP_SQL] if args.workload == "map" else ["--output-mode", "update", "--sql", COUNT_SQL]
    )
    command = [
        sys.executable, "-m", "sparkafka", "run",
        "--bootstrap-servers", args.bootstrap_servers,
        "--source-topic", args.input_topic,
        "--source-option", "startingOffsets=earliest",
        "--source-option",
        f"maxOffsetsPerTrigger={os.environ.get('BENCH_MAX_OFFSETS_PER_TRIGGER', '200000')}",
        "--sink-topic", args.output_topic,
        "--checkpoint", str(Path(args.work_dir) / "checkpoint"),
        "--trigger", f"{args.commit_interval_ms}ms",
        "--delivery-guarantee", args.guarantee,
        "--master", "local[2]",
        *[a for setting in os.environ.get("BENCH_SPARK_CONF", "").split() for a in ("--spark-conf", setting)],
        *workload,
    ]  # fmt: skip
    sys.stdout.flush()
    os.execv(sys.executable, command)


if __name__ == "__main__":
    main()
