"""Tumbling-window counts on the Kafka record timestamp, exactly-once, with idle heartbeats. One command:

    .venv/bin/python examples/windowed_count.py

It starts the embedded broker (`sparkafka broker`) in a temporary directory and produces clicks with
explicit timestamps into three 10-second windows that ended 10-40 s ago, then produces nothing more.
A streaming query counts them per window in append mode:

    readStream sparkafka (idleHeartbeatIntervalMs=1000)  ->  withWatermark(timestamp, 5 s)
    ->  drop_heartbeats  ->  groupBy(window(timestamp, 10 s)).count()  ->  writeStream sparkafka,
    deliveryGuarantee=exactly-once

Append mode emits a window once the watermark (the largest event time seen minus 5 s) passes its
end. The clicks themselves move the watermark past the first two windows only; the last window closes
because the source sends an idle heartbeat once no partition has had new records for a second.
Without `idleHeartbeatIntervalMs` it would stay open until the next click. The query runs until
the three windows are committed, then the script prints what a read_committed consumer sees.

The same pipeline from the command line (from the repository root, where
`--transform` finds the `examples` package):

    .venv/bin/sparkafka run --source-topic clicks --sink-topic clicks-per-10s \\
        --checkpoint ./ckpt --source-option idleHeartbeatIntervalMs=1000 \\
        --transform examples.windowed_count:transform
"""

from __future__ import annotations

import math
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from confluent_kafka import Producer
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from sparkafka.broker.runner import BrokerProcess
from sparkafka.eventtime import drop_heartbeats
from sparkafka.session import spark_session

if not __package__:  # run as `python examples/windowed_count.py`: the repository root is not on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from examples.kafka_io import create_topics, read_committed

WINDOW_SECONDS = 10
WATERMARK_DELAY = "5 seconds"
HEARTBEAT_INTERVAL_MS = 1000
# Tiny input: one core (one Python worker, which keeps its transactional producer from batch to
# batch) and one shuffle partition, so one state store and one transactional id.
TINY_INPUT_CONF = {"spark.sql.shuffle.partitions": "1"}
# Seconds into the first window of each click: 3 clicks in the first window, 2 in the second, 4 in
# the third.
CLICK_OFFSETS_S = [1, 4, 8, 12, 17, 21, 22, 24, 26]


def transform(events: DataFrame) -> DataFrame:
    """Clicks -> (window start as ISO-8601 text, count as text), one record per closed window.

    Heartbeats are dropped after withWatermark, so that the watermark sees them and the counts do
    not. Append mode: each window is written once, when the watermark passes its end."""
    watermarked = drop_heartbeats(events.withWatermark("timestamp", WATERMARK_DELAY))
    counts = watermarked.groupBy(F.window("timestamp", f"{WINDOW_SECONDS} seconds")).count()
    return counts.select(
        F.date_format("window.start", "yyyy-MM-dd'T'HH:mm:ssXXX").alias("key"),
        F.col("count").cast("string").alias("value"),
    )


def produce_clicks(bootstrap: str) -> float:
    """Produce the clicks with explicit timestamps; returns the first window's start (epoch s).

    The windows end 10-40 s before now, so the first heartbeat (wall-clock time, a second or two
    from now) moves the watermark past the last of them."""
    first_window = math.floor(time.time() / WINDOW_SECONDS) * WINDOW_SECONDS - 4 * WINDOW_SECONDS
    sender = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for number, offset_s in enumerate(CLICK_OFFSETS_S):
        timestamp_ms = int((first_window + offset_s) * 1000)
        sender.produce(
            "clicks", value=f"click-{number}".encode(), partition=number % 2, timestamp=timestamp_ms
        )
    sender.flush(30)
    return first_window


def run_until_windows_closed(bootstrap: str, checkpoint: Path, windows: int, timeout_s: float = 120) -> None:
    """Run the query until `windows` windows are committed (or the timeout), then stop it."""
    spark = spark_session("sparkafka-example-windowed-count", master="local[1]", conf=TINY_INPUT_CONF)
    events = (
        spark.readStream.format("sparkafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", "clicks")
        .option("startingOffsets", "earliest")
        .option("idleHeartbeatIntervalMs", str(HEARTBEAT_INTERVAL_MS))
        .load()
    )
    query = (
        transform(events)
        .writeStream.format("sparkafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("topic", "clicks-per-10s")
        .option("deliveryGuarantee", "exactly-once")
        .option("checkpointLocation", str(checkpoint))
        .trigger(processingTime="500 milliseconds")
        .start()
    )
    deadline = time.monotonic() + timeout_s
    try:
        # A heartbeat is a micro-batch of its own; this loop ends soon after the first one.
        while len(read_committed(bootstrap, "clicks-per-10s")) < windows:
            if time.monotonic() > deadline:
                raise TimeoutError(f"fewer than {windows} windows were committed within {timeout_s:.0f} s")
            if not query.isActive:
                raise RuntimeError(f"the query stopped: {query.exception()}")
            time.sleep(0.5)
    finally:
        query.stop()
        spark.stop()


def main() -> None:
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # everything runs on this machine
    workdir = Path(tempfile.mkdtemp(prefix="sparkafka-windowed-count-"))
    broker = BrokerProcess(workdir / "kafka").start()
    try:
        bootstrap = broker.bootstrap_servers
        print(f"broker on {bootstrap} (data in {workdir})", flush=True)
        create_topics(bootstrap, "clicks", partitions=2)
        create_topics(bootstrap, "clicks-per-10s")
        produce_clicks(bootstrap)
        print(
            f"produced {len(CLICK_OFFSETS_S)} clicks into 3 windows of {WINDOW_SECONDS} s, then nothing; "
            f"running the pipeline (idle heartbeats every {HEARTBEAT_INTERVAL_MS} ms)...",
            flush=True,
        )
        run_until_windows_closed(bootstrap, workdir / "checkpoint", windows=3)
        # Windows closed by the same micro-batch land in the topic in no particular order.
        windows = sorted(
            (m.key().decode(), m.value().decode()) for m in read_committed(bootstrap, "clicks-per-10s")
        )
        print(f"\nclicks-per-10s ({len(windows)} windows, read_committed):")
        for number, (start, count) in enumerate(windows):
            closed_by = "an idle heartbeat" if number == len(windows) - 1 else "later clicks"
            print(f"  window {start}  count={count}  (closed by {closed_by})")
    finally:
        broker.terminate()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
