"""How many write tasks a write task's stage has, asked of the Spark driver's monitoring API.

PySpark tells a Python task its partition index, not how many partitions its stage has. The
exactly-once sink records that number in every commit marker, so that a replay split into another
number of write partitions is refused by its tasks before any of them writes (see
:mod:`sparkafka.connector.sink.replay`). Spark's monitoring REST API, served with the web UI, has it: a
stage's ``numTasks``. :func:`sparkafka.register` publishes the UI's address as a session setting
(:data:`STATUS_URL_SETTING`); Spark hands a session's settings to every task of its jobs.

Steps of :func:`stage_width` (run on a background thread, so that the request overlaps the task's
producer set-up and rows; the result is awaited only where it is needed):

(a) No published address (UI off, a session without ``register()``): unknown.
(b) GET ``{url}/api/v1/applications/{app}/stages/{stage}?details=false``. Spark's status store
   learns of a stage from its listener bus, asynchronously, so a task can ask before it is known:
   an "unknown stage" 404 is asked again, every 25 ms, until :data:`ASK_FOR_S` has passed; a
   "no such app" one means another application answers at this address (a stale one).
(c) The answer lists the stage's attempts; the first attempt runs every partition of a write job
   (a later one only those that failed), so the width is attempt 0's ``numTasks``; unknown when
   the status store missed that attempt (it drops events when its queue is full).

Invariant: the answer is right or None, never a guess. Anything unexpected (connection refused,
a timeout, an access control refusal, a malformed answer, a stage still unknown after the wait, a
width not above the task's partition) gives None and a warning once per address; the sink then
falls back to the checks that need no width. An address that failed is not asked again for
:data:`RETRY_UNREACHABLE_S`, so that a cluster whose executors cannot reach the driver's UI does not
pay a timeout per task; a decision that waits on the answer asks anyway (:class:`TaskWidth`). The
requests go to the driver directly, never through a proxy named in the
executors' environment."""

from __future__ import annotations

import http.client
import json
import logging
import threading
import time
import urllib.error
import urllib.request
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from urllib.parse import quote

log = logging.getLogger(__name__)

# A Spark SQL setting (its name starts with "spark", so Spark hands it to tasks as a local property).
STATUS_URL_SETTING = "spark.sparkafka.statusUrl"
APP_ID_PROPERTY = "spark.app.id"

# How long a task waits for its stage's width before its marker goes without one. Long enough for a
# driver's web UI on a loaded machine (3 s once timed out there, and a later replay of that batch
# in another shape was then told by row counts alone); an answer comes in milliseconds otherwise.
ASK_FOR_S = 10.0
DECISIVE_ASK_S = 30.0
DECISIVE_REQUEST_S = 5.0
RETRY_UNREACHABLE_S = 60.0
_NOT_YET_KNOWN_PAUSE_S = 0.025
_REMEMBERED_STAGES = 64

# Executors reach the driver directly; an http_proxy in their environment (common behind a
# corporate proxy, with no_proxy rarely naming the driver) would hide the driver's UI.
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))
_asker = ThreadPoolExecutor(max_workers=2, thread_name_prefix="sparkafka-stage-width")
_lock = threading.Lock()
_asked: OrderedDict[tuple[str, str, int], Future[int | None]] = OrderedDict()
_unreachable_until: dict[str, float] = {}
_warned: set[str] = set()


def stage_width_future(
    status_url: str | None, app_id: str | None, stage_id: int, partition: int
) -> Future[int | None]:
    """The width of ``stage_id``, asked once per stage in this worker process (its tasks share it)."""
    if not status_url or not app_id:
        done: Future[int | None] = Future()
        done.set_result(None)
        return done
    key = (status_url, app_id, stage_id)
    with _lock:
        asked = _asked.get(key)
        if asked is None:
            asked = _asker.submit(stage_width, status_url, app_id, stage_id, partition)
            _asked[key] = asked
            while len(_asked) > _REMEMBERED_STAGES:
                _asked.popitem(last=False)
    return asked


def awaited(future: Future[int | None]) -> int | None:
    """The width, or None when the driver did not answer in time."""
    try:
        return future.result(ASK_FOR_S + 1)
    except Exception:  # a timeout or a bug in the request: unknown, never a guess
        log.warning("the stage's write partitions are unknown", exc_info=True)
        return None


def stage_width(
    status_url: str, app_id: str, stage_id: int, partition: int, *, decisive: bool = False
) -> int | None:
    """Steps (b) and (c) of the module docstring. ``decisive``: a decision waits on the answer (see
    :class:`TaskWidth`), so a driver that failed before is asked anyway; a request that timed out, a
    connection reset and a 5xx answer (a driver too busy to answer) are asked again, each request
    bounded by :data:`DECISIVE_REQUEST_S` and the whole by :data:`DECISIVE_ASK_S`; a stage not yet
    known is asked again less and less often."""
    if not decisive and time.monotonic() < _unreachable_until.get(status_url, 0.0):
        return None
    give_up = _warn_once if decisive else _give_up
    url = _stages_url(status_url, app_id, f"/{stage_id}")
    deadline = time.monotonic() + (DECISIVE_ASK_S if decisive else ASK_FOR_S)
    pause = _NOT_YET_KNOWN_PAUSE_S
    while True:
        remaining = deadline - time.monotonic()
        request_s = min(remaining, DECISIVE_REQUEST_S) if decisive else remaining
        try:
            with _DIRECT.open(url, timeout=max(request_s, 0.5)) as response:
                attempts = json.load(response)
            break
        except urllib.error.HTTPError as error:
            try:
                body = error.read(200).decode("utf-8", "replace")
            except (OSError, http.client.HTTPException):
                body = ""
            # "unknown stage": not yet known, asked again; "no such app": another application's UI
            # at this address (the session's SparkContext was replaced), which will never know it.
            not_yet_known = error.code == 404 and not body.startswith("no such app")
            if (not_yet_known or (decisive and error.code >= 500)) and remaining > pause:
                time.sleep(pause)
                if decisive:
                    pause = min(pause * 2, 1.0)  # the driver is busy: asked less and less often
                continue
            give_up(status_url, f"{url} answered HTTP {error.code}: {body}")
            return None
        except (OSError, ValueError, http.client.HTTPException) as error:  # URLError, timeouts, bodies
            if decisive and _passing(error) and deadline - time.monotonic() > 0.5:
                continue  # a driver too busy to answer in time (a loaded machine): asked again
            give_up(status_url, f"{url} could not be read ({error})")
            return None
    # The first attempt runs every partition of a write job, a later one only those that failed:
    # only the first attempt's count is the width (the status store may have missed it: unknown).
    first = (
        [a for a in attempts if isinstance(a, dict) and a.get("attemptId") == 0]
        if isinstance(attempts, list)
        else []
    )
    width = first[0].get("numTasks") if first else None
    if not isinstance(width, int) or width <= partition:
        _warn_once(status_url, f"{url} gave no usable numTasks for write partition {partition}: {attempts!r}")
        return None
    return width


def warm_up(status_url: str, app_id: str) -> threading.Thread:
    """Ask the driver's monitoring API once, in the background, as soon as its address is published.

    Why: Spark's UI sets up its REST resources at the first request, about 1 s of the driver's
    CPU on two cores (4.3: 1.1 s, then 5-80 ms a request); without this the first micro-batch's
    write tasks wait for it. The answer is not used; a failure is the tasks' to report."""

    def ask() -> None:
        url = _stages_url(status_url, app_id)
        try:
            with _DIRECT.open(url, timeout=DECISIVE_ASK_S) as response:
                response.read()
        except (OSError, http.client.HTTPException) as error:
            log.debug("warming up %s failed: %s", url, error)

    thread = threading.Thread(target=ask, name="sparkafka-status-warm-up", daemon=True)
    thread.start()
    return thread


def _stages_url(status_url: str, app_id: str, stage: str = "") -> str:
    """The monitoring API's address of the application's stages (``stage``: ``/{id}`` for one)."""
    return f"{status_url.rstrip('/')}/api/v1/applications/{quote(app_id)}/stages{stage}?details=false"


def _passing(error: BaseException) -> bool:
    """A failure a busy driver causes and a later request may not meet: a timeout, a reset or
    dropped connection, an incomplete answer."""
    reason = error.reason if isinstance(error, urllib.error.URLError) else error
    return isinstance(
        reason, (TimeoutError, ConnectionResetError, ConnectionAbortedError, http.client.HTTPException)
    )


class TaskWidth:
    """A write task's answer. Asked in the background at the task's start (:func:`stage_width_future`)
    and awaited once, for :data:`ASK_FOR_S`: the marker records it when it came in time, and none
    otherwise. Where a decision depends on it (a marker of the batch recorded its number, so an
    unknown answer refuses the batch), an answer that did not come is asked again, for
    :data:`DECISIVE_ASK_S`: a driver slow to answer on a loaded machine must not fail a healthy
    query, and a replay split otherwise must still be refused before it writes."""

    def __init__(self, status_url: str | None, app_id: str | None, stage_id: int, partition: int) -> None:
        self._where = (status_url, app_id, stage_id, partition)
        self._future = stage_width_future(status_url, app_id, stage_id, partition)
        self._answer: int | None = None
        self._awaited = self._asked_again = False

    def known(self) -> int | None:
        """The answer as far as it is known: what the marker records."""
        if not self._awaited:
            self._answer = awaited(self._future)
            self._awaited = True
        return self._answer

    def decisive(self) -> int | None:
        """The answer a decision waits for: asked again, patiently, when it is not known. An answer
        found so clears the driver's "unreachable" mark and serves the stage's other tasks."""
        status_url, app_id, stage_id, partition = self._where
        if self.known() is None and not self._asked_again and status_url and app_id:
            self._asked_again = True
            try:
                self._answer = stage_width(status_url, app_id, stage_id, partition, decisive=True)
            except Exception:  # a bug or an odd answer: unknown, never a guess, never a crash
                log.warning("the stage's write partitions are unknown", exc_info=True)
                self._answer = None
            if self._answer is not None:
                found: Future[int | None] = Future()
                found.set_result(self._answer)
                with _lock:
                    _unreachable_until.pop(status_url, None)
                    _asked[(status_url, app_id, stage_id)] = found
        return self._answer


def _give_up(status_url: str, what: str) -> None:
    """No width from ``status_url``, nor for :data:`RETRY_UNREACHABLE_S`: an address that failed
    once (unreachable, refusing, or not knowing the stage after :data:`ASK_FOR_S`) would most
    likely cost the next stages the same wait, inside their tasks."""
    with _lock:
        _unreachable_until[status_url] = time.monotonic() + RETRY_UNREACHABLE_S
    _warn_once(status_url, what)


def _warn_once(status_url: str, what: str) -> None:
    with _lock:
        first = status_url not in _warned
        _warned.add(status_url)
    if first:
        log.warning(
            "the exactly-once sink cannot learn how many write partitions a micro-batch has: %s. Commit "
            "markers then record no width, and a replay split otherwise is found only by row counts and "
            "by the driver after it wrote (docs/guarantees.md). Let executors reach the driver's web UI "
            "(spark.ui.enabled=true, its port open to them) to have it refused before it writes",
            what,
        )
