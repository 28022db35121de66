"""The Kafka sink: ``writeStream.format("sparkafka")`` with ``deliveryGuarantee`` exactly-once,
at-least-once or none.

Exactly-once protocol, per write task (Spark partition ``p`` of micro-batch ``b`` of query ``q``).
This is its one full text; the code marks each step with its number here (``# Step N``).

0. The task refuses while adaptive execution could split a replay of the batch otherwise
   (:func:`~.replay.adaptive_execution_refusal`), and starts asking the driver, in the background,
   how many write partitions the batch has (:mod:`.stage_width`).
1. The transactional id is ``{prefix}-{p}``; the prefix defaults to ``sparkafka-{q}``. Spark keeps
   the query id in the checkpoint, so a restarted query uses the same ids, and two queries never
   share a prefix unless a user sets the same ``transactionalIdPrefix`` for both. A ``df.write``
   inside ``foreachBatch`` has no default: a call may write several times, and each write needs ids
   of its own (:func:`require_batch_write_prefix`).
2. The Python worker keeps one producer per transactional id across micro-batches. Before a new
   producer initialises its id, the prefix's owner is settled: the first query to commit
   ``claim/<prefix>`` (through the prefix's own transactional id ``{prefix}.claim``, whose fencing
   lets one of two racing claims commit) owns every id of it; another query refuses here, before it
   could fence the owner's producers. The driver claims before the query's first tasks and records
   the claim in the checkpoint (:mod:`.claims`); a topic that lost a recorded claim lost the
   query's markers, refused here even for a replay of the first batch. The new producer then calls
   ``init_transactions()``: the broker aborts whatever a crashed or zombie attempt with the same id
   left open and fences it (its later requests fail with PRODUCER_FENCED).
3. At the id's first write of a query run (a restart, possibly in the same application: the only
   time a batch can be a replay), the task reads, with read_committed, the id's latest commit marker
   and registration from the compacted commit-marker topic (key = transactional id; only the
   partitions that hold its prefix, its query's records of its claims and the other prefixes those
   name: :class:`~.commit_log.MarkerLayout`), the markers of
   the same query under its prefix and, for a streaming write, under other prefixes, and the
   prefix's progress record. It reads them only past the driver's snapshot of them, which the
   writer carries (:mod:`.marker_snapshot`: taken from the checkpoint and read on, to the last stable
   offset, when Spark creates the writer), and lays what it reads over the snapshot: once per run,
   not once per task. A run past the query's first batch that finds nothing of the query
   there refuses before registering (markers deleted or moved); a query adopting another's ids
   refuses while that query's last batch is partly committed (:mod:`.id_state`). It tracks its
   marker locally from then on.
4. :func:`sparkafka.connector.sink.replay.decide` takes it from there: a marker of this query and
   batch ``b`` with the row count the task has now means ``b`` is a replay this id already
   committed, and the task writes nothing; an id registered to another query, a row count that
   differs, ``b`` committed under another prefix, a marker or progress record past ``b``, or a
   marker of ``b`` planned from other input (the checkpoint went back behind its output:
   :mod:`.batch_plan`) fail the task (a replay of another shape would lose or double records).
5. Otherwise: begin a transaction, produce the rows, produce the new marker (id, query, batch,
   partition, record count, topic, write partitions, plan digest, run, time) in the same
   transaction, commit. Output and marker become visible together or not at all. An empty partition
   opens no transaction.
6. Any failure aborts the transaction when the producer still can; a fenced or failed producer is
   discarded, and the task fails so Spark retries it — the retry starts again at step 2.

The driver's ``commit`` checks every task reported; on the first batch of a run it also fences
transactional ids of partitions the query no longer has (a restart with fewer partitions), found
through the registration record each id commits to the marker topic, in a transaction of its own,
before its first output, and fails the batch if one of them committed this very batch; then it
records the batch, with where its input ended, as the prefix's progress (``progress/<prefix>``).
``abort`` logs what tasks of the failed batch committed and re-initialises the ids of failed
tasks (:mod:`.fencing`), so read_committed readers are not held back until the transaction times out.
No transaction ever spans two processes.
"""
