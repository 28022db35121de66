"""The number of write partitions a task's stage has, asked of a real Spark driver's monitoring API
(sparkafka.connector.sink.stage_width), and what happens where it cannot answer."""

from __future__ import annotations

import http.server
import json
import os
import socket
import subprocess
import sys
import threading

import pytest
from pyspark.sql import SparkSession
from pyspark.sql.functions import udf

from sparkafka.connector.sink import stage_width
from sparkafka.connector.sink.stage_width import STATUS_URL_SETTING, awaited, stage_width_future


def _what_the_task_learns(_: int) -> str:
    from pyspark import TaskContext

    from sparkafka.connector.sink.stage_width import (
        APP_ID_PROPERTY,
        STATUS_URL_SETTING,
        awaited,
        stage_width_future,
    )

    context = TaskContext.get()
    assert context is not None
    future = stage_width_future(
        context.getLocalProperty(STATUS_URL_SETTING),
        context.getLocalProperty(APP_ID_PROPERTY),
        context.stageId(),
        context.partitionId(),
    )
    return json.dumps({"stage": context.stageId(), "width": awaited(future)})


def _learned(spark: SparkSession, partitions: int) -> list[dict]:
    learn = udf(_what_the_task_learns, "string")
    frame = spark.range(40).repartition(partitions).select(learn("id").alias("learned"))
    return [json.loads(row.learned) for row in frame.collect()]


@pytest.mark.parametrize("partitions", [3, 5])
def test_every_task_learns_the_number_of_partitions_of_its_stage(
    spark: SparkSession, partitions: int
) -> None:
    assert spark.conf.get(STATUS_URL_SETTING, None), "register() published the UI's address"
    learned = _learned(spark, partitions)
    assert {entry["width"] for entry in learned} == {partitions}
    assert len({entry["stage"] for entry in learned}) == 1


def test_a_partition_beyond_the_answer_gives_no_width(spark: SparkSession) -> None:
    stage = _learned(spark, 2)[0]["stage"]
    url, app = spark.conf.get(STATUS_URL_SETTING), spark.sparkContext.applicationId
    assert stage_width.stage_width(url, app, stage, 1) == 2
    assert stage_width.stage_width(url, app, stage, 2) is None


def test_a_stage_still_unknown_after_the_wait_gives_no_width_nor_for_the_next_stages(
    spark: SparkSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stage not yet known is asked again until ASK_FOR_S; one still unknown then (the driver's
    status events dropped under load) would cost every later stage the same wait, inside its task."""
    monkeypatch.setattr(stage_width, "ASK_FOR_S", 0.3)
    stage = _learned(spark, 2)[0]["stage"]
    url, app = spark.conf.get(STATUS_URL_SETTING), spark.sparkContext.applicationId
    try:
        assert stage_width.stage_width(url, app, 10_000_000, 0) is None
        assert url in stage_width._unreachable_until
        assert stage_width.stage_width(url, app, stage, 0) is None, "not asked again for a while"
    finally:
        stage_width._unreachable_until.pop(url, None)
    assert stage_width.stage_width(url, app, stage, 0) == 2


def test_a_proxy_in_the_executors_environment_is_not_used(
    spark: SparkSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Behind a corporate proxy executors often have http_proxy set, and no_proxy rarely names the
    driver: asked through the proxy, the driver's UI would never answer."""
    stage = _learned(spark, 2)[0]["stage"]
    url, app = spark.conf.get(STATUS_URL_SETTING), spark.sparkContext.applicationId
    with socket.socket() as closed:  # a proxy nobody runs
        closed.bind(("127.0.0.1", 0))
        proxy = f"http://127.0.0.1:{closed.getsockname()[1]}"
    for name in ("http_proxy", "HTTP_PROXY"):
        monkeypatch.setenv(name, proxy)
    for name in ("no_proxy", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
    try:
        assert stage_width.stage_width(url, app, stage, 0) == 2
    finally:
        stage_width._unreachable_until.pop(url, None)


UI_PORTS_TAKEN = """
from sparkafka.runtime.session import spark_session
spark = spark_session("ui-ports-taken", master="local[1]")
print("STARTED", spark.sparkContext.uiWebUrl)
spark.stop()
"""


def test_sparkafkas_session_starts_with_sparks_default_ui_ports_taken() -> None:
    """Spark tries port 4040 and the 16 after it; on a busy host all may be taken, and Spark would
    then not start the session at all. sparkafka's sessions take any free port."""
    taken = []
    try:
        for port in range(4040, 4057):
            listener = socket.socket()
            try:
                listener.bind(("0.0.0.0", port))
                listener.listen(1)
                taken.append(listener)
            except OSError:
                listener.close()  # taken already, which serves as well
        env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"}
        done = subprocess.run(
            [sys.executable, "-c", UI_PORTS_TAKEN], capture_output=True, text=True, timeout=300, env=env
        )
    finally:
        for listener in taken:
            listener.close()
    assert "STARTED http" in done.stdout, done.stdout + done.stderr[-2000:]


def test_another_applications_ui_is_not_asked_again_for_a_while(spark: SparkSession) -> None:
    """A stale address: the session's SparkContext was replaced, and the UI found there is another's."""
    url = spark.conf.get(STATUS_URL_SETTING)
    try:
        assert stage_width.stage_width(url, "app-that-is-not-this-one", 0, 0) is None
        assert url in stage_width._unreachable_until
    finally:
        stage_width._unreachable_until.pop(url, None)


def test_no_published_address_gives_no_width_at_once() -> None:
    assert awaited(stage_width_future(None, "app", 3, 0)) is None
    assert awaited(stage_width_future("http://127.0.0.1:4040", None, 3, 0)) is None


def test_an_unreachable_driver_is_not_asked_again_for_a_while() -> None:
    with socket.socket() as closed:  # a port nobody listens on
        closed.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{closed.getsockname()[1]}"
    assert stage_width.stage_width(url, "app", 1, 0) is None
    assert url in stage_width._unreachable_until
    assert stage_width.stage_width(url, "app", 2, 0) is None


def test_a_decision_asks_again_for_an_answer_that_did_not_come_in_time(
    spark: SparkSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a loaded machine the driver can answer after the task's first wait. Where a marker of the
    batch recorded its number, the task's decision waits longer for its own (the driver's earlier
    failure notwithstanding) instead of refusing a healthy batch; the marker then records it too."""
    monkeypatch.setattr(stage_width, "ASK_FOR_S", 0.3)
    previous = _learned(spark, 2)[0]["stage"]
    url, app = spark.conf.get(STATUS_URL_SETTING), spark.sparkContext.applicationId
    upcoming = previous + 2  # the next _learned job: a shuffle map stage, then its result stage
    later: list[list[dict]] = []
    job = threading.Timer(1.5, lambda: later.append(_learned(spark, 3)))
    try:
        width = stage_width.TaskWidth(url, app, upcoming, 0)
        job.start()
        assert width.known() is None, "the stage is not known within the first wait"
        assert url in stage_width._unreachable_until
        assert width.decisive() == 3
        assert width.known() == 3
    finally:
        job.join()
        stage_width._unreachable_until.pop(url, None)
    assert {task["stage"] for task in later[0]} == {upcoming}


def test_the_api_is_asked_once_in_the_background_when_its_address_is_published() -> None:
    """register() warms the monitoring API up: Spark sets its REST resources up at the first request,
    about a second of the driver's time that the first write tasks would otherwise wait for. Here a
    slow server stands for the driver, to see the request and that nobody waits for it."""
    asked: list[str] = []
    answer = threading.Event()

    class SlowDriver(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            asked.append(self.path)
            answer.wait(30)
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"[]")

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), SlowDriver)
    serving = threading.Thread(target=server.serve_forever, daemon=True)
    serving.start()
    try:
        warming = stage_width.warm_up(f"http://127.0.0.1:{server.server_address[1]}/", "app-20261129 1")
        assert warming.is_alive()  # returned before the answer
        answer.set()
        warming.join(30)
        assert not warming.is_alive()
        assert asked == ["/api/v1/applications/app-20261129%201/stages?details=false"]
    finally:
        server.shutdown()
        server.server_close()


def test_warming_up_an_unreachable_driver_ends_quietly() -> None:
    with socket.socket() as closed:  # a port nobody listens on
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    warming = stage_width.warm_up(f"http://127.0.0.1:{port}", "app-1")
    warming.join(30)
    assert not warming.is_alive()
