"""kill -9 of a `sparkafka run` pipeline's process group ends every process of the pipeline: the
transaction a write task held open stays open until a restart aborts it, as seed 001 shows, no
process of the killed pipeline commits it behind the kill's back, and nothing a task started (a
subprocess, a fork from one of its threads) runs on to write anything."""

from __future__ import annotations

import time
from pathlib import Path

from sparkafka.broker.runner import BrokerProcess
from sparkafka.tools.pipeline_process import PipelineProcess, run_arguments
from sparkafka.tools.verify import transaction_open
from tests.integration.kafka_clients import create_topic, producer, read_to_end

HOLD_S = 4
# A user's transform whose UDF, once per Python worker, starts a subprocess and forks from a thread
# of its own: each waits for the worker to end, then writes a file (as it could write to Kafka).
# Neither gets a death signal of its own; PySpark's daemon ends them with its process group.
PROBE_MODULE = "kill_probe"
PROBE_SOURCE = '''
import os, subprocess, sys, threading
from pyspark.sql import functions as F
from pyspark.sql.types import StringType

WAITER = """
import os, sys, time
worker, kind, directory = int(sys.argv[1]), sys.argv[2], sys.argv[3]
def alive():
    try:
        with open(f"/proc/{worker}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
while alive():
    time.sleep(0.1)
time.sleep(1)
open(os.path.join(directory, f"survived-{kind}-{os.getpid()}"), "w").close()
"""
started = False


def start_helpers():
    global started
    if started:
        return
    started = True
    worker, directory = os.getpid(), os.environ["KILL_PROBE_DIR"]
    command = [sys.executable, "-c", WAITER, str(worker)]
    subprocess.Popen([*command, "subprocess", directory])

    def fork_and_wait():
        if os.fork() == 0:
            os.execv(sys.executable, [*command, "thread-fork", directory])

    thread = threading.Thread(target=fork_and_wait)
    thread.start()
    thread.join()
    open(os.path.join(directory, f"started-{worker}"), "w").close()


@F.udf(StringType())
def event(value):
    start_helpers()
    return f"EVENT({value})"


def transform(frame):
    return frame.select(event(F.col("value").cast("string")).alias("value"))
'''


def test_a_killed_pipelines_open_transaction_stays_open_until_a_restart_aborts_it(
    broker: BrokerProcess, topic_name: str, tmp_path: Path
) -> None:
    """The write task holds its transaction open for HOLD_S before committing. The pipeline's process
    group is killed during the hold; well after the hold would have ended, the transaction is still
    open and nothing of it is visible to read_committed readers, and no helper a task started wrote
    anything. (A worker forked by a daemon that leads its own process group once survived such a kill
    and committed; later a worker's subprocess and its thread's fork survived it.)"""
    bootstrap = broker.bootstrap_servers
    source, sink = topic_name, f"{topic_name}-out"
    create_topic(bootstrap, source, partitions=2)
    create_topic(bootstrap, sink, partitions=2)
    modules, probe = tmp_path / "modules", tmp_path / "probe"
    modules.mkdir()
    probe.mkdir()
    (modules / f"{PROBE_MODULE}.py").write_text(PROBE_SOURCE)
    args = run_arguments(
        bootstrap,
        source,
        sink,
        tmp_path / "checkpoint",
        transform=f"{PROBE_MODULE}:transform",
        trigger="500ms",
        sink_options=("debug.pauseAt=beforeCommit", f"debug.pauseMs={HOLD_S * 1000}"),
    )
    environment = {"PYTHONPATH": str(modules), "KILL_PROBE_DIR": str(probe)}
    pipeline = PipelineProcess(tmp_path / "pipeline.log", args, env=environment).start()
    try:
        send = producer(bootstrap)
        for number in range(20):
            send.produce(source, key=f"k{number}".encode(), value=f"v{number}".encode())
        assert send.flush(30) == 0
        pipeline.wait_for("sparkafka debug pause: beforeCommit", 180)
    finally:
        pipeline.kill_group()
    assert transaction_open(bootstrap, sink, 2), "the kill came while the write task held its transaction"
    assert any(path.name.startswith("started-") for path in probe.iterdir()), "no task started helpers"
    time.sleep(HOLD_S + 3)  # the hold's end, and then some: a surviving worker would have committed
    assert transaction_open(bootstrap, sink, 2)
    assert read_to_end(bootstrap, sink, partitions=2) == []
    assert len(read_to_end(bootstrap, sink, partitions=2, isolation="read_uncommitted")) > 0
    assert not [path.name for path in probe.iterdir() if path.name.startswith("survived-")]
