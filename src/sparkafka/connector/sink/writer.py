"""The write tasks (executors) and the driver's commit: the exactly-once protocol, step by step,
in :meth:`KafkaStreamWriter.write` and :meth:`KafkaStreamWriter.commit`. The steps are numbered as
in the protocol's one text, the docstring of :mod:`sparkafka.connector.sink`."""

from __future__ import annotations

import dataclasses
import functools
import itertools
import logging
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from confluent_kafka import KafkaError, KafkaException, Producer
from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamArrowWriter, WriterCommitMessage

from sparkafka.connector import kafka_errors
from sparkafka.connector.kafka_admin import (
    waits_until_refused,
)
from sparkafka.connector.sink.batch_plan import BatchPlan
from sparkafka.connector.sink.commit_log import (
    CommitMarker,
    ProgressRecord,
    RefusalRecord,
    marker_of_query,
    refusal_record,
    write_progress,
    write_refusal,
)
from sparkafka.connector.sink.failures import (
    authorization_error,
    kafka_exception_of,
    sink_unreachable_error,
    transaction_timeout_error,
)
from sparkafka.connector.sink.fencing import fence_query_transactions, fence_transactional_id
from sparkafka.connector.sink.id_state import IdRun, task_producer
from sparkafka.connector.sink.marker_snapshot import MarkerSnapshot, query_markers, task_layout
from sparkafka.connector.sink.options import (
    ACCEPT_RESHAPED_OPTION,
    AT_LEAST_ONCE,
    BATCH_ID_OPTION,
    EXACTLY_ONCE,
    SinkOptions,
)
from sparkafka.connector.sink.producers import (
    CachedProducer,
    discard_producer,
    plain_producer,
)
from sparkafka.connector.sink.replay import (
    Action,
    TaskView,
    adaptive_execution_refusal,
    beyond_refusal,
    decide,
    kept_when_accepted,
    partitions_beyond,
)
from sparkafka.connector.sink.stage_width import APP_ID_PROPERTY, STATUS_URL_SETTING, TaskWidth
from sparkafka.connector.sink.task import TaskIdentity, task_identity
from sparkafka.connector.sink.transactional_ids import (
    effective_prefix,
    prefix_of,
    transactional_id,
    write_partition_of,
)
from sparkafka.connector.worker_heap import freeze_long_lived_objects
from sparkafka.errors import (
    OutputTopicNotFoundError,
    ProducerFencedError,
    RecordTooLargeError,
    ReplayRefused,
    ReshapedReplayRefused,
    SinkError,
    SparkafkaError,
    SparkafkaOptionError,
    TransactionTimeoutError,
    WrongShapeAcceptance,
)

log = logging.getLogger(__name__)

# -- the writer --------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class SinkCommitMessage(WriterCommitMessage):
    """What a write task reports to the driver's ``commit``: a message, never changed once sent."""

    partition: int
    records: int
    query_id: str | None
    batch_id: int | None
    # Exactly-once writes only:
    transactional_id: str | None = None
    transactional_id_prefix: str | None = None
    skipped_replay: bool = False
    # The task belongs to the first batch its id wrote in this query run (a replay is only possible
    # there): the driver checks that batch for partitions beyond the run's.
    run_first_batch: bool = False
    # The number of write partitions the task's marker records (None: unknown, or no marker written).
    write_partitions: int | None = None
    # Records this id had committed of the batch before, written again because the user accepted the
    # batch as written (acceptReshapedBatch): duplicates the driver logs.
    rewritten_records: int = 0
    # The run of the batch the task belongs to (the writer's own id, KafkaStreamWriter.run_id).
    run_id: str | None = None


class _RowEncoder:
    """Turns Arrow batches of the input into produce() arguments without per-row Spark Row objects.

    String columns are passed as ``str``: the client encodes them as UTF-8, as Spark's sink does."""

    def __init__(self, batch: pa.RecordBatch, default_topic: str | None) -> None:
        names = {name: i for i, name in enumerate(batch.schema.names)}
        self.length = batch.num_rows

        def column(name: str) -> list[Any] | None:
            return batch.column(names[name]).to_pylist() if name in names else None

        self.values = column("value") or [None] * self.length
        self.keys = column("key") or [None] * self.length
        # Per-row topics only where the 'topic' option does not decide for every row.
        self.topics = None if default_topic else column("topic")
        self.partitions = column("partition")
        self.headers = column("headers")
        self.default_topic = default_topic

    def topic_per_row(self) -> Iterator[str]:
        if self.default_topic:
            return itertools.repeat(self.default_topic, self.length)
        if self.topics is None or None in self.topics or "" in self.topics:
            raise SparkafkaError(
                "a row has a null 'topic' and no 'topic' option is set; every row needs a topic"
            )
        return iter(self.topics)

    def extra_arguments(self, row: int) -> dict[str, Any]:
        """The produce() keyword arguments beyond topic, value and key that ``row`` needs, if any."""
        extra: dict[str, Any] = {}
        if self.partitions is not None and self.partitions[row] is not None:
            extra["partition"] = self.partitions[row]
        if self.headers is not None and self.headers[row]:
            extra["headers"] = [(h["key"], h["value"]) for h in self.headers[row]]
        return extra


@dataclass(frozen=True)
class _PreparedTask:
    """A write task after steps 0-3 of the protocol (sink package docstring;
    :meth:`KafkaStreamWriter._prepare`)."""

    view: TaskView
    cached: CachedProducer
    # What the id committed, as read through ``cached``.
    run: IdRun
    width: TaskWidth
    prefix: str
    # The prefix's refusal record, where it names this task's batch.
    refusal_of_batch: RefusalRecord | None
    # The task's commit message, given what it wrote.
    written: Callable[..., SinkCommitMessage]


class KafkaStreamWriter(DataSourceStreamArrowWriter):
    """Runs ``write`` in the executors' Python workers, ``commit``/``abort`` on the driver side.

    ``batch_write``: the write is a ``df.write`` inside ``foreachBatch``, one of possibly several
    writes of the same micro-batch (see :class:`KafkaBatchWriter`)."""

    def __init__(
        self,
        options: SinkOptions,
        *,
        batch_write: bool = False,
        plan: BatchPlan | None = None,
        snapshot: MarkerSnapshot | None = None,
    ) -> None:
        self.options = options
        self.batch_write = batch_write
        # The checkpoint's newest offsets-log entry when Spark created this writer (the driver, once
        # per micro-batch): the batch being written and the input it was planned from.
        self.plan = plan
        # What the commit log held of the query, read on the driver: a task at its id's first write
        # of a run reads only what follows it (step 3a of the protocol, sink package docstring).
        self.snapshot = snapshot
        # This run of the batch (before the tasks, sink package docstring): made here, on the driver,
        # and pickled into every task of the write, so a retried or speculative task carries it and
        # a later run of the batch does not. Markers, refusals and acceptances name runs by it (the
        # driver's commit of a streaming write runs on a writer PySpark builds anew, and takes the
        # run from the tasks' reports). Spark's own run id cannot serve: a foreachBatch function that
        # sets a job group hides it (and a UUID group of the user's would pass for it, the same in
        # every run), and a Spark Connect client's write is handed none.
        self.run_id = str(uuid.uuid4())

    # -- executor side ----------------------------------------------------------------------------

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SinkCommitMessage:
        """One write task. Exactly-once, the protocol's steps (numbered as in the one text of it, the
        docstring of :mod:`sparkafka.connector.sink`) run top to bottom:

        * step 0, the refusals that need no marker and the width asked in the background, and
          steps 1-3, the producer of ``{prefix}-{p}`` and what its id committed
          (:func:`~.id_state.task_producer`): :meth:`_prepare`;
        * step 4, write, skip or refuse (:func:`~.replay.decide`, parts 4a-4k), and the recording
          of a refusal: :meth:`_decide`;
        * step 5, rows and marker in one transaction, and step 6, a failed transaction aborted and
          its producer discarded: :meth:`_write_rows`, :meth:`_write_transaction`."""
        freeze_long_lived_objects("sink")
        identity = self._with_declared_batch(task_identity())
        batches = (b for b in iterator if b.num_rows)
        if self.options.delivery_guarantee != EXACTLY_ONCE:
            first = next(batches, None)
            records = 0 if first is None else self._write_without_transaction(first, batches)
            return SinkCommitMessage(
                partition=identity.partition,
                records=records,
                query_id=identity.query_id,
                batch_id=identity.batch_id,
            )
        task = self._prepare(identity)  # Steps 0-3
        task_input = _TaskInput(batches)
        if self._decide(task, task_input) is Action.SKIP:  # Step 4
            marker = task.run.state.marker
            assert marker is not None
            log.info(
                "batch %d of %s is a replay: %s already committed it (marker batch %d); writing nothing",
                task.view.batch_id,
                task.view.query_id,
                task.view.transactional_id,
                marker.batch_id,
            )
            return task.written(records=0, skipped_replay=True)
        return self._write_rows(task, task_input)  # Steps 5 and 6

    def _prepare(self, identity: TaskIdentity) -> _PreparedTask:
        """Steps 0-3 of the protocol (sink package docstring): the refusals that need no marker, the
        width asked in the background, the producer with what its id committed, and the task's view
        of them."""
        query_id, batch_id = identity.query_id, identity.batch_id
        if query_id is None or batch_id is None:
            raise SparkafkaError(
                "deliveryGuarantee=exactly-once needs a streaming query: writeStream, or df.write inside "
                "foreachBatch (from a Spark Connect client, which hands the write neither the query nor "
                f"the micro-batch, with .option('{BATCH_ID_OPTION}', batch_id) and the query's "
                "checkpointLocation); for a plain batch write use at-least-once"
            )
        # Step 0: the settings of the task's job decide whether a replay keeps this batch's shape;
        # the width is asked in the background.
        refusal = adaptive_execution_refusal(identity.properties, batch_write=self.batch_write)
        if refusal is not None:
            raise ReplayRefused(refusal)
        width = TaskWidth(
            identity.properties.get(STATUS_URL_SETTING),
            identity.properties.get(APP_ID_PROPERTY),
            identity.stage_id,
            identity.partition,
        )
        # Steps 1-3 come before any row is awaited: Spark keeps computing and sending this task's
        # rows while the producer initialises and reads the marker. Even a task without rows needs
        # them: on a fresh worker initialising the id aborts its leftover transaction from a crash
        # now, not at the broker's timeout. No transaction is open while rows are awaited.
        # Step 1: the transactional id.
        prefix = effective_prefix(self.options, query_id)
        own_id = transactional_id(prefix, identity.partition)
        plan = self.plan if self.plan is not None and self.plan.batch_id == batch_id else None
        # Steps 2 and 3: the producer, and what its id committed.
        cached, run = task_producer(
            self.options,
            identity,
            own_id,
            other_prefixes=not self.batch_write,
            plan=plan,
            snapshot=self.snapshot,
        )
        written = functools.partial(
            SinkCommitMessage,
            partition=identity.partition,
            transactional_id=own_id,
            # Every task of the run's first batch of this id, a retry reusing the producer included.
            run_first_batch=run.first_batch == batch_id,
            transactional_id_prefix=prefix,
            query_id=query_id,
            batch_id=batch_id,
            run_id=self.run_id,
        )
        last_refusal = run.state.refusal
        refusal_of_batch = (
            last_refusal if last_refusal is not None and last_refusal.names(query_id, batch_id) else None
        )
        view = self._task_view(identity, own_id, run, width, plan, refusal_of_batch)
        return _PreparedTask(view, cached, run, width, prefix, refusal_of_batch, written)

    def _task_view(
        self,
        identity: TaskIdentity,
        own_id: str,
        run: IdRun,
        width: TaskWidth,
        plan: BatchPlan | None,
        refusal_of_batch: RefusalRecord | None,
    ) -> TaskView:
        """What :func:`~.replay.decide` sees of this task: its identity, the options, and what the
        marker topic said at the id's first write of the run."""
        assert identity.query_id is not None and identity.batch_id is not None  # checked by _prepare
        return TaskView(
            query_id=identity.query_id,
            batch_id=identity.batch_id,
            partition=identity.partition,
            transactional_id=own_id,
            topic=self.options.topic or "",
            batch_write=self.batch_write,
            own_marker=run.state.marker,
            registered_query=run.state.registered_query,
            other_prefix_markers=run.state.other_prefix_markers,
            sibling_markers=run.state.sibling_markers,
            accepted_reshaped_batch=self.options.accepted_reshaped_batch,
            run_first_batch=run.first_batch,
            write_partitions=width.decisive,
            plan=None if plan is None else plan.digest,
            run_id=self.run_id,
            progress=run.state.progress,
            history_found=run.state.history_found,
            claim_missing=run.state.claim_missing,
            marker_topic=self.options.marker_topic,
            exactly_once_from=self.options.exactly_once_from,
            batch_input_records=None if plan is None else plan.input_records,
            refused_run=None if refusal_of_batch is None else refusal_of_batch.run_id,
            refusal_recorded=refusal_of_batch is not None,
            rejected_runs=() if refusal_of_batch is None else refusal_of_batch.rejected_runs,
        )

    def _decide(self, task: _PreparedTask, task_input: _TaskInput) -> Action:
        """Step 4 of the protocol (sink package docstring): write, skip, or refuse; a refusal is
        recorded in the marker topic where an acceptance depends on it."""
        try:
            return decide(task.view, rows=task_input.count)  # Step 4
        except ReshapedReplayRefused as refused:
            # Step 4: this run recorded as the one that refused the batch (4g, 4h).
            raise self._recorded(refused, task.prefix, task.view.query_id, self.run_id) from None
        except WrongShapeAcceptance as refused:
            # Step 4: this run recorded as an acceptance in a wrong shape (4e).
            raise self._rejected(refused, task.refusal_of_batch, self.run_id) from None

    def _write_rows(self, task: _PreparedTask, task_input: _TaskInput) -> SinkCommitMessage:
        """Step 5 of the protocol (sink package docstring): rows and marker in one transaction; no
        rows, no transaction."""
        view = task.view
        rewritten = _rewritten_by_acceptance(view)
        first, rest = task_input.first(), task_input.rest()
        if first is None:
            return task.written(records=0)
        accepted = self.options.accepted_reshaped_batch == view.batch_id
        draft = CommitMarker(
            view.transactional_id,
            view.query_id,
            view.batch_id,
            view.partition,
            0,
            0,
            self.options.topic or "",
            plan=view.plan,
            run_id=self.run_id,
            accepted_run=view.refused_run if accepted else None,
        )
        marker = self._write_transaction(task, draft, first, rest)
        return task.written(
            records=marker.records, write_partitions=marker.write_partitions, rewritten_records=rewritten
        )

    def _with_declared_batch(self, identity: TaskIdentity) -> TaskIdentity:
        """The task's identity, completed by option batchId where Spark named no query or batch (a
        foreachBatch df.write from a Spark Connect client runs as a command of its own). The driver
        checked the option against the checkpoint's newest micro-batch (``datasource._declared_plan``),
        whose query the plan names; where Spark does name them, they must agree with the option."""
        declared = self.options.batch_id
        if declared is None or not self.batch_write:
            return identity
        if identity.batch_id is not None:
            if identity.batch_id != declared:
                raise SparkafkaOptionError(
                    f"option {BATCH_ID_OPTION}={declared}, and Spark runs this write for micro-batch "
                    f"{identity.batch_id}: give it the batch id foreachBatch passed to the function"
                )
            return identity
        plan = self.plan
        if plan is None or plan.query_id is None or plan.batch_id != declared:
            return identity
        return dataclasses.replace(identity, query_id=plan.query_id, batch_id=declared)

    def _recorded(
        self, refused: ReshapedReplayRefused, prefix: str, query_id: str, run_id: str
    ) -> ReshapedReplayRefused:
        """``refused``, once this run is recorded as the one that refused its batch (the prefix's
        :class:`~.commit_log.RefusalRecord`): an acceptance of the batch then keeps what this run's tasks
        committed of it, as the refusal's cost assumes. Where nothing can be recorded, the refusal says
        that accepting writes those commits again too."""
        record = RefusalRecord(prefix, query_id, refused.batch_id, run_id, int(time.time() * 1000))
        try:
            write_refusal(self.options, record)
        except (SparkafkaError, KafkaException) as error:
            return ReshapedReplayRefused(
                f"{refused}. This refusal could not be recorded in the commit-marker topic ({error}): "
                "accepting the batch writes again also what this run's tasks committed of it (the "
                "driver's log lists them)",
                batch_id=refused.batch_id,
            )
        return refused

    def _rejected(
        self, refused: WrongShapeAcceptance, refusal: RefusalRecord | None, run_id: str
    ) -> WrongShapeAcceptance:
        """``refused``, once this run is recorded in the refusal record as an acceptance in a wrong
        shape: what its other tasks commit before it stops is then written again by the next
        acceptance, never kept by its count. Where it cannot be recorded, the refusal says what to do."""
        if refusal is None or run_id in refusal.rejected_runs:
            return refused
        record = dataclasses.replace(
            refusal, rejected_runs=(*refusal.rejected_runs, run_id), time_ms=int(time.time() * 1000)
        )
        try:
            write_refusal(self.options, record)
        except (SparkafkaError, KafkaException) as error:
            return WrongShapeAcceptance(
                f"{refused}. This run could not be recorded as an acceptance in a wrong shape ({error}): "
                "a later acceptance could keep what its tasks committed by their count. Fix what refused "
                "the write, and run this same acceptance once more before the right one: it refuses again "
                "and is recorded",
                batch_id=refused.batch_id,
            )
        return refused

    def _write_transaction(
        self,
        task: _PreparedTask,
        draft: CommitMarker,
        first: pa.RecordBatch,
        rest: Iterator[pa.RecordBatch],
    ) -> CommitMarker:
        """Step 5 of the protocol (sink package docstring): the rows, then ``draft`` completed with the
        row count, the time and the number of write partitions, in one transaction; step 6 where it
        fails. Returns the committed marker, which the task's reading of its id now holds."""
        cached, run = task.cached, task.run
        producer = cached.producer
        transactional_id, partition, batch_id = draft.transactional_id, draft.partition, draft.batch_id
        cached.delivery_errors.clear()
        records = 0
        began_at: float | None = None
        try:
            self.options.faults.pause("beforeProduce", partition=partition, batch_id=batch_id)
            # Step 5. The width is known by now nearly always (asked at step 0); a slow answer must
            # not keep the transaction open, holding back read_committed consumers of the output.
            write_partitions = task.width.known()
            producer.begin_transaction()
            began_at = time.monotonic()
            for batch in _chain(first, rest):
                records += self._produce_batch(producer, batch)
            if self.options.faults.holds_before_commit:
                producer.flush(self.options.operation_timeout_s)  # make the open transaction visible
                self.options.faults.pause("beforeCommit", partition=partition, batch_id=batch_id)
                self.options.faults.fail_first_attempt("beforeCommit")
            # Step 5. The marker goes last, just before the commit: the marker partition is shared by
            # every writer, and an open transaction there would hold back every reader of the markers.
            marker = dataclasses.replace(
                draft, records=records, time_ms=int(time.time() * 1000), write_partitions=write_partitions
            )
            producer.produce(
                self.options.marker_topic,
                key=transactional_id,
                value=marker.encode(),
                partition=run.state.layout.partition_of_key(transactional_id),
            )
            # librdkafka fails the commit with an abortable error when any record of the transaction
            # failed delivery (a record too large, an ACL, a topic gone): a commit that returns has
            # every row, and one that raises leaves the cause in delivery_errors for _failure.
            producer.commit_transaction(self.options.operation_timeout_s)
        except BaseException as raised:
            # Step 6: abort where the producer still can, discard a fenced or failed one, and fail
            # the task so that Spark retries it. The retry runs from step 0; its producer gone, it
            # initialises the id anew at step 2 and reads again at step 3.
            error = kafka_exception_of(raised)
            # Measured before the abort, which may itself wait up to operationTimeoutMs.
            open_ms = None if began_at is None else (time.monotonic() - began_at) * 1000
            self._abort_after_failure(cached, transactional_id, error)
            prefix = prefix_of(transactional_id, draft.partition)
            raise self._failure(error, cached.delivery_errors, transactional_id, open_ms, prefix) from None
        run.state.marker = marker
        return marker

    def _produce_batch(self, producer: Producer, batch: pa.RecordBatch) -> int:
        """Queue every row of ``batch``; delivery failures reach the producer's ``delivery_errors``.

        The loop for rows with only topic, value and key is separate because it runs once per output
        record: it makes one produce() call per row and nothing else."""
        encoder = _RowEncoder(batch, self.options.topic)
        produce = producer.produce
        topics = encoder.topic_per_row()
        if encoder.partitions is None and encoder.headers is None:
            for topic, value, key in zip(topics, encoder.values, encoder.keys, strict=True):
                try:
                    produce(topic, value, key)
                except BufferError:
                    _produce_when_queue_has_room(producer, topic, value, key, {})
        else:
            for row, (topic, value, key) in enumerate(zip(topics, encoder.values, encoder.keys, strict=True)):
                extra = encoder.extra_arguments(row)
                try:
                    produce(topic, value, key, **extra)
                except BufferError:
                    _produce_when_queue_has_room(producer, topic, value, key, extra)
        producer.poll(0)  # serve delivery reports now and then, not only at flush/commit
        return encoder.length

    def _failure(
        self,
        error: BaseException,
        delivery_errors: list[KafkaError],
        transactional_id: str,
        open_ms: float | None,
        prefix: str,
    ) -> BaseException:
        """What a failed transaction raises. A commit fails with "N message(s) failed delivery" when
        records were refused (an ACL, a record too large, a topic gone): the first delivery error then
        names the cause and its fix, where the sink knows one."""
        for delivered in delivery_errors[:1]:
            cause = self._explain(KafkaException(delivered), transactional_id, prefix=prefix)
            if type(cause) is not SinkError:
                return cause
        return self._explain(error, transactional_id, open_ms=open_ms, prefix=prefix)

    def _abort_after_failure(
        self, cached: CachedProducer, transactional_id: str, error: BaseException
    ) -> None:
        kafka_error = error.args[0] if isinstance(error, KafkaException) and error.args else None
        abortable = isinstance(kafka_error, KafkaError) and kafka_error.txn_requires_abort()
        if abortable or not isinstance(kafka_error, KafkaError) or not kafka_error.fatal():
            try:
                cached.producer.abort_transaction(self.options.operation_timeout_s)
            except KafkaException:
                log.warning(
                    "could not abort the transaction of %s; discarding its producer", transactional_id
                )
        # Step 6. A failed producer is never reused: the retry re-initialises the id, which aborts
        # anything left open, and re-reads the marker.
        discard_producer(self.options, transactional_id)

    def _explain(
        self,
        error: BaseException,
        transactional_id: str | None,
        *,
        open_ms: float | None = None,
        prefix: str | None = None,
    ) -> BaseException:
        """The error a failed write raises: Kafka's error told in terms of this sink's options.
        ``open_ms``: how long the failed transaction had been open; ``prefix``: that of
        ``transactional_id``."""
        if not isinstance(error, KafkaException) or not error.args:
            return error
        kafka_error = error.args[0]
        code = kafka_error.code()
        timeout_ms = self.options.transaction_timeout_ms
        if code in kafka_errors.FENCED and open_ms is not None and open_ms >= timeout_ms:
            # The coordinator aborts a transaction open longer than its timeout and bumps the epoch,
            # which fences this producer: no other attempt is involved, and a retry that is as slow
            # fails the same way.
            return TransactionTimeoutError(
                f"the transaction of transactional id '{transactional_id}' was open for "
                f"{open_ms / 1000:.1f} s, longer than kafka.transaction.timeout.ms={timeout_ms}, so the "
                "broker aborted it "
                f"({kafka_error.str()}). A write task's transaction stays open while Spark computes the "
                "task's rows: raise the sink option kafka.transaction.timeout.ms (up to the brokers' "
                "transaction.max.timeout.ms), or make micro-batches smaller (maxOffsetsPerTrigger)"
            )
        if code in kafka_errors.FENCED:
            return ProducerFencedError(
                f"transactional id '{transactional_id}' was fenced by a newer producer with the same id (a "
                "retried or duplicated task); this attempt's transaction was aborted and Spark retries "
                "the task"
            )
        if code in kafka_errors.TOO_LARGE:
            return RecordTooLargeError(
                f"a record is larger than the broker accepts ({kafka_error.str()}); raise the topic's "
                "max.message.bytes (and the sink option kafka.message.max.bytes) or write smaller values"
            )
        what = f"writing with transactional id '{transactional_id}'" if transactional_id else "writing"
        refused = authorization_error(self.options, what, error, prefix=prefix)
        if refused is not None:
            return refused
        if code in kafka_errors.UNKNOWN_TOPIC:
            return OutputTopicNotFoundError(
                f"the output topic does not exist on {self.options.bootstrap_servers} ({kafka_error.str()}); "
                "create it first (sparkafka topics create ...) or enable auto.create.topics.enable on the "
                "brokers"
            )
        if code == kafka_errors.TRANSACTION_TIMEOUT_REFUSED:
            return transaction_timeout_error(self.options)
        if transactional_id is None:
            return SinkError(f"writing to {self.options.bootstrap_servers} failed: {kafka_error.str()}")
        return SinkError(f"writing with transactional id '{transactional_id}' failed: {kafka_error.str()}")

    def _write_without_transaction(self, first: pa.RecordBatch, rest: Iterator[pa.RecordBatch]) -> int:
        cached = plain_producer(self.options)
        cached.delivery_errors.clear()
        try:
            records = sum(self._produce_batch(cached.producer, batch) for batch in _chain(first, rest))
        except KafkaException as refused:  # by the client before sending, e.g. a record too large
            raise self._explain(refused, None) from None
        remaining = _flush_unless_refused(cached, self.options.operation_timeout_s)
        # With acks=0 (none) a record counts as delivered once sent: what is still queued was never
        # sent, and a failed delivery failed in the client. Either fails the task, under both
        # guarantees, as Flink's writer fails on an asynchronous send error even with NONE.
        if remaining:
            discard_producer(self.options, None)
            acknowledged = self.options.delivery_guarantee == AT_LEAST_ONCE
            what, state = ("acknowledge", "acknowledged") if acknowledged else ("send", "sent")
            raise sink_unreachable_error(
                self.options,
                f"{what} {remaining} record(s) of this task, which fails so that Spark retries it",
                f"{remaining} record(s) not {state}",
                cached.client_errors,
            )
        if cached.delivery_errors:
            error = cached.delivery_errors[0]
            discard_producer(self.options, None)
            raise self._explain(KafkaException(error), None)
        return records

    # -- driver side ------------------------------------------------------------------------------

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        reports = [m for m in messages if isinstance(m, SinkCommitMessage)]
        if len(reports) != len(messages):
            raise SparkafkaError(
                f"batch {batchId}: {len(messages) - len(reports)} of {len(messages)} write tasks reported no "
                "result; refusing to mark the batch committed"
            )
        written = sum(r.records for r in reports)
        skipped = sum(1 for r in reports if r.skipped_replay)
        log.info(
            "batch %d committed: %d task(s) wrote %d record(s) (%s); %d replayed task(s) skipped",
            batchId,
            len(reports),
            written,
            self.options.delivery_guarantee,
            skipped,
        )
        recorded = {r.write_partitions for r in reports if r.write_partitions is not None}
        if recorded - {len(reports)}:
            # Markers recording a wrong number would make a replay of this batch refuse for nothing.
            log.warning(
                "batch %d: write tasks recorded %s write partitions in their commit markers, and the "
                "batch has %d; a replay of this batch may be refused needlessly (acceptReshapedBatch)",
                batchId,
                sorted(recorded),
                len(reports),
            )
        if self.options.delivery_guarantee == EXACTLY_ONCE and written and not recorded:
            _warn_no_width_once()
        if self.options.delivery_guarantee != EXACTLY_ONCE:
            self.options.faults.pause("driverCommit", partition=None, batch_id=batchId)
            return
        # After the tasks (sink package docstring): the check of a run's first batch, then progress.
        rewritten = {r.partition: r.rewritten_records for r in reports if r.rewritten_records}
        first_of_run = sorted(r.partition for r in reports if r.run_first_batch)
        if first_of_run:
            log.info(
                "micro-batch %d is the first of its run for write partition(s) %s: checking the ids of "
                "write partitions beyond the batch's %d",
                batchId,
                first_of_run,
                len(reports),
            )
            rewritten.update(self._check_first_batch_of_run(reports, batchId))
        if rewritten:
            log.warning(
                "micro-batch %d, accepted as written (%s): %d record(s) written a second time, by write "
                "partition of the batch's first run: %s",
                batchId,
                ACCEPT_RESHAPED_OPTION,
                sum(rewritten.values()),
                ", ".join(f"{p}: {n}" for p, n in sorted(rewritten.items())),
            )
        self._record_progress(reports, batchId)
        self.options.faults.pause("driverCommit", partition=None, batch_id=batchId)

    def _record_progress(self, reports: list[SinkCommitMessage], batch_id: int) -> None:
        """Every task of ``batch_id`` committed: record it, with where its input ended, as the
        prefix's progress (after the tasks, sink package docstring; see
        :class:`~.commit_log.ProgressRecord`). Before Spark's own commit log, so the record is never
        behind the checkpoint; a crash between the two replays a batch whose tasks all skip."""
        plan = self.plan if self.plan is not None and self.plan.batch_id == batch_id else None
        # A batch without write tasks (a new query's first from latest or a group's offsets) has no
        # report: the checkpoint names the query then.
        query_id = next((r.query_id for r in reports if r.query_id), None) or (
            None if plan is None else plan.query_id
        )
        prefix = next((r.transactional_id_prefix for r in reports if r.transactional_id_prefix), None)
        if prefix is None and query_id is not None and not self.batch_write:
            prefix = effective_prefix(self.options, query_id)
        if prefix is None or query_id is None:
            return
        record = ProgressRecord(
            prefix,
            query_id,
            batch_id,
            None if plan is None else plan.digest,
            None if plan is None else plan.end_offsets,
            int(time.time() * 1000),
        )
        write_progress(self.options, record)

    def _accepts(self, found: Mapping[str, bytes], prefix: str, query_id: str, batch_id: int) -> bool:
        """Whether option acceptReshapedBatch accepts this batch: it names the batch, and the prefix's
        refusal record (in the marker partition ``found``) names this batch of this query. Left set on
        a query whose batch was never refused, the option has no effect, so an ordinary replay is not
        written twice on the strength of an option meant for another refusal."""
        if self.options.accepted_reshaped_batch != batch_id:
            return False
        refusal = refusal_record(found, prefix)
        return refusal is not None and refusal.names(query_id, batch_id)

    def _check_first_batch_of_run(self, reports: list[SinkCommitMessage], batch_id: int) -> dict[int, int]:
        """The driver's check after the tasks (sink package docstring), at the first batch of a query
        run (a restart, when the batch may be a replay). Its parts:

        (a) fence the registered ids of write partitions this batch does not have (a restart with
            fewer partitions), aborting what they left open;
        (b) fail the batch if any of them committed this very batch: the replay was split otherwise
            than the first run, and the tasks could not tell, because the markers of the first run
            or the tasks of this one do not know the batch's number of write partitions
            (:func:`~sparkafka.connector.sink.replay.partitions_beyond`) — unless the user accepted
            the batch as written: then returns those partitions' records, now in the output twice."""
        prefix = next((r.transactional_id_prefix for r in reports if r.transactional_id_prefix), None)
        query_id = next((r.query_id for r in reports if r.query_id), None)
        if prefix is None or query_id is None:
            return {}
        layout = task_layout(self.options, self.snapshot, prefix, query_id)
        found = query_markers(self.options, layout, prefix, query_id, self.snapshot)
        fence_query_transactions(self.options, prefix, from_partition=len(reports), markers=found)
        # Only this query's markers count (a prefix shared with an older query's ids holds its too).
        of_prefix = [
            marker
            for key, value in found.items()
            if write_partition_of(key, prefix) is not None
            and (marker := marker_of_query(key, value, query_id)) is not None
        ]
        beyond = partitions_beyond(
            of_prefix, query_id=query_id, batch_id=batch_id, prefix=prefix, partitions=len(reports)
        )
        if beyond and self._accepts(found, prefix, query_id, batch_id):
            log.warning(
                "micro-batch %d taken as written (%s): write partition(s) %s, which this run does not "
                "have, had committed %d record(s) of it, which this run wrote again",
                batch_id,
                ACCEPT_RESHAPED_OPTION,
                ", ".join(f"{m.partition} ({m.records} records)" for m in beyond),
                sum(m.records for m in beyond),
            )
            return {m.partition: m.records for m in beyond}
        if beyond:
            # The run of the tasks, from their reports: for a streaming write PySpark builds the writer
            # that commits anew (streamWriter() again), so this object's own id is no task's.
            run_id = next((r.run_id for r in reports if r.run_id), self.run_id)
            # Partitions that skipped by another run's marker: accepting writes them again.
            skipped = sorted(
                (
                    m
                    for m in of_prefix
                    if m.query_id == query_id
                    and m.batch_id == batch_id
                    and m.partition < len(reports)
                    and not kept_when_accepted(m, run_id=run_id, refused_run=run_id)
                ),
                key=lambda m: m.partition,
            )
            refused = beyond_refusal(beyond, skipped, batch_id=batch_id, partitions=len(reports))
            raise self._recorded(refused, prefix, query_id, run_id)
        return {}

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """After the tasks, a failed batch (sink package docstring): log what its tasks committed,
        and re-initialise the ids of failed tasks."""
        if self.options.delivery_guarantee != EXACTLY_ONCE:
            return
        committed = {
            m.partition: m.records for m in messages if isinstance(m, SinkCommitMessage) and m.records
        }
        if committed:
            log.warning(
                "micro-batch %d failed after write partition(s) %s committed their part of it (records: %s): "
                "a replay of the same shape skips them; accepting the batch as written (%s) keeps them where "
                "this run refused the batch, and writes them a second time otherwise",
                batchId,
                sorted(committed),
                ", ".join(f"{p}: {n}" for p, n in sorted(committed.items())),
                ACCEPT_RESHAPED_OPTION,
            )
        prefix = self.options.transactional_id_prefix or next(
            (m.transactional_id_prefix for m in messages if isinstance(m, SinkCommitMessage)), None
        )
        failed = [index for index, message in enumerate(messages) if message is None]
        if prefix is None:
            log.warning(
                "batch %d aborted before any task reported its transactional id; open transactions are "
                "aborted when the ids are initialised again or after kafka.transaction.timeout.ms",
                batchId,
            )
            return
        for index in failed:
            failed_id = transactional_id(prefix, index)
            try:
                fence_transactional_id(self.options, failed_id)
            except KafkaException as error:
                log.warning("could not re-initialise %s after batch %d failed: %s", failed_id, batchId, error)


def _flush_unless_refused(cached: CachedProducer, timeout_s: float) -> int:
    """``flush()`` for at most ``timeout_s``, but no longer once the cluster refused the producer's
    credentials (:func:`~sparkafka.connector.kafka_admin.waits_until_refused`); the records still queued."""
    remaining = 0
    for wait_s in waits_until_refused(timeout_s, cached.client_errors):
        remaining = cached.producer.flush(wait_s)  # serves error_cb too
        if not remaining:
            break
    return int(remaining)


def _produce_when_queue_has_room(
    producer: Producer, topic: str, value: Any, key: Any, extra: dict[str, Any]
) -> None:
    """produce() after BufferError: the client's local queue is full, so let it send (and serve
    delivery reports) until the record fits. Nothing is dropped and nothing is queued twice: a
    BufferError means the record was not queued."""
    while True:
        producer.poll(0.1)
        try:
            producer.produce(topic, value, key, **extra)
            return
        except BufferError:
            continue


class _TaskInput:
    """A write task's non-empty Arrow batches, counted without losing them: a replay being checked
    is counted before it is skipped or refused, and a batch accepted as written (acceptReshapedBatch)
    is counted and then written, so counting keeps what it read."""

    def __init__(self, batches: Iterator[pa.RecordBatch]) -> None:
        self._batches = batches
        self._kept: list[pa.RecordBatch] | None = None

    def count(self) -> int:
        if self._kept is None:
            self._kept = list(self._batches)
        return sum(batch.num_rows for batch in self._kept)

    def first(self) -> pa.RecordBatch | None:
        if self._kept is not None:
            return self._kept[0] if self._kept else None
        return next(self._batches, None)

    def rest(self) -> Iterator[pa.RecordBatch]:
        """The batches after :meth:`first` (call it first)."""
        return iter(self._kept[1:]) if self._kept is not None else self._batches


def _rewritten_by_acceptance(view: TaskView) -> int:
    """The records this id committed of the batch before, now written again because the user accepted
    the batch as written; logged here, and totalled by the driver."""
    marker = view.own_marker
    if view.accepted_reshaped_batch != view.batch_id or not view.refusal_recorded or marker is None:
        return 0
    if marker.query_id != view.query_id or marker.batch_id != view.batch_id:
        return 0
    log.warning(
        "micro-batch %d of %s, accepted as written (%s): %s committed %d record(s) of it before, "
        "written again now, so they are in the output twice",
        view.batch_id,
        view.query_id,
        ACCEPT_RESHAPED_OPTION,
        view.transactional_id,
        marker.records,
    )
    return marker.records


def _chain(first: pa.RecordBatch, rest: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    yield first
    yield from rest


class KafkaBatchWriter(DataSourceArrowWriter):
    """``df.write.format("sparkafka")``: a bounded DataFrame, or one micro-batch inside
    ``foreachBatch``.

    Inside ``foreachBatch`` Spark gives the write tasks the query id and micro-batch id, so
    exactly-once works as in the streaming sink (transactional ids, commit markers): this is how
    update- and complete-mode queries, which Python streaming sinks cannot take directly, write
    exactly once. One difference: a ``foreachBatch`` call may write several times, and nothing a
    write task sees tells those writes apart, so each exactly-once write names its own
    ``transactionalIdPrefix`` (:func:`require_batch_write_prefix`; Flink's KafkaSink likewise needs a
    transactional id prefix per sink, Delta's idempotent writes a txnAppId per write). A plain
    ``df.write`` outside a streaming query has no batch id a retry could be matched against; there
    exactly-once fails with a clear message in the tasks."""

    def __init__(
        self, options: SinkOptions, plan: BatchPlan | None = None, snapshot: MarkerSnapshot | None = None
    ) -> None:
        self.options = options
        self._writer = KafkaStreamWriter(options, batch_write=True, plan=plan, snapshot=snapshot)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SinkCommitMessage:
        return self._writer.write(iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        self._writer.commit(messages, _reported_batch_id(messages))

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        self._writer.abort(messages, _reported_batch_id(messages))


@functools.cache
def _warn_no_width_once() -> None:
    log.warning(
        "the exactly-once sink's commit markers record no number of write partitions: its tasks could "
        "not ask the driver's monitoring API (spark.ui.enabled=false, sparkafka.register(spark) not "
        "called, or the UI's port closed to the executors). A replay split into fewer write partitions "
        "than its first run is then found by the driver after it wrote, not refused before "
        "(docs/guarantees.md)"
    )


def _reported_batch_id(messages: list[WriterCommitMessage | None]) -> int:
    return next(
        (m.batch_id for m in messages if isinstance(m, SinkCommitMessage) and m.batch_id is not None), -1
    )
