"""The command line every runner of `python -m benchmarks` accepts:

    <python> benchmarks/systems/<runner>.py --bootstrap-servers HOST:PORT --input-topic I --output-topic O \
        --workload map|count --guarantee exactly-once|at-least-once --work-dir DIR --commit-interval-ms 1000

A runner reads every partition of I from the earliest offset (consumer group ``bench-<system>-<O>``)
and writes to O. map: per input one output, same key, value ``EVENT(<input value>)``. count: per input
key the running number of records seen, as ASCII decimal, under that key (one update per record or
per key per commit; the last one must be the total). exactly-once: Kafka transactions committed every
``--commit-interval-ms``; at-least-once: no transactions. It runs until SIGTERM and exits within ~10 s;
the driver starts it in its own process group and kills what is left of the group afterwards.

Stdlib only: runners import it from the virtualenv of the system they drive, which has neither
sparkafka nor benchmarks.*.
"""

from __future__ import annotations

import argparse

WORKLOADS = ("map", "count")
GUARANTEES = ("exactly-once", "at-least-once")


def runner_parser(description: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--bootstrap-servers", required=True, help="HOST:PORT of the Kafka cluster")
    parser.add_argument("--input-topic", required=True, help="read from its earliest offsets")
    parser.add_argument("--output-topic", required=True)
    parser.add_argument("--workload", choices=WORKLOADS, required=True)
    parser.add_argument("--guarantee", choices=GUARANTEES, required=True)
    parser.add_argument("--work-dir", required=True, help="state, checkpoints and logs of this run")
    parser.add_argument(
        "--commit-interval-ms", type=int, default=1000, help="transaction / checkpoint interval"
    )
    return parser


def consumer_group(system: str, output_topic: str) -> str:
    return f"bench-{system}-{output_topic}"
