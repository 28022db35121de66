"""The Kafka sink: ``writeStream.format("sparkafka")`` with ``deliveryGuarantee`` exactly-once,
at-least-once or none.

Exactly-once protocol, per write task (Spark partition ``p`` of micro-batch ``b`` of query ``q``).
This is its one full text. Its steps are numbered 0 to 6, some with lettered parts (3a, 4e); the
driver's work before and after the tasks frames them. Other modules refer to "step N of the protocol
(sink package docstring)", and the code marks where each step happens with ``# Step N``. A list in
another module's docstring, lettered (a), (b), ..., holds that function's own sub-steps, not these.

Why the checks. A task skips ``b`` when the commit marker of its transactional id says ``b`` is
committed. That is right only if a replay of ``b`` sends the same rows to the same write partition
``p`` as the first run did. The checkpoint pins the input of ``b`` (its offsets) and
``spark.sql.shuffle.partitions``; the source pins its split of the offsets into input partitions
(``sparkafka:split`` in the end offset); step 0 keeps adaptive execution from splitting the plan
anew. What is left (a query or setting changed between the crash and the replay, another
``transactionalIdPrefix``, another query on the same ids, a checkpoint gone back, markers lost) is
detected as far as the markers allow, and the query fails naming the cause and the way on.

Before the tasks, on the driver, each time Spark creates the sink's writer (every micro-batch, after
it wrote the batch's offsets-log entry; :mod:`sparkafka.connector.datasource`):

- It holds the checkpoint's lease (``sparkafka/lease.json``, :mod:`.lease`): a second process on a
  running query's checkpoint refuses here, naming the first.
- It makes sure the commit-marker topic exists, and reads the batch's plan from the checkpoint: the
  batch id, a digest of the input it was planned from, where that input ends (:mod:`.batch_plan`).
- It settles the prefix's claim with the checkpoint's record of it (``sparkafka/claims/``,
  :func:`~.claims.settle_checkpoint_claim`). A record of this prefix in this marker topic leaves
  nothing more to do. Otherwise, unless ``exactlyOnceFromBatch`` names this batch, it refuses: where
  the record names another topic and ``previousCommitMarkerTopic`` names yet another; where the
  record names another topic, that option is not set, and this topic does not hold the query as far
  as the recorded one; for a streaming write, where a prefix new to the checkpoint comes with a new
  marker topic while the old prefix's topic holds this batch in part, or a later one; and where
  ``adoptTransactionalIdsFrom`` names a query this topic holds nothing of. Then it carries the
  markers over from ``previousCommitMarkerTopic`` (:mod:`.carry_over`), claims the prefix (refusing
  when another query owns it and is not adopted) and records the claim in the checkpoint.
- It takes the snapshot of what the commit log holds of the query (:mod:`.marker_snapshot`); the
  writer carries it to every task.
- It makes the run id: one per writer, carried by every task of the write (a retried task too) and
  by no later run of the batch. Markers, refusals and acceptances name runs by it.

The steps of a write task:

0. The task refuses while adaptive execution could split a replay of the batch otherwise than its
   first run (:func:`~.replay.adaptive_execution_refusal`; the settings come with the task from its
   job): a ``writeStream`` needs ``spark.sql.adaptive.streaming.stateless.enabled`` false, a
   ``df.write`` inside ``foreachBatch`` ``spark.sql.adaptive.enabled`` false (enough for a
   ``writeStream`` too). It starts asking the driver's monitoring API, in the background, how many
   write partitions its stage has (:mod:`.stage_width`): PySpark tells a task its index, not that
   number.
1. The transactional id is ``{prefix}-{p}``; the prefix defaults to ``sparkafka-{q}``. Spark keeps
   the query id in the checkpoint, so a restarted query uses the same ids, and two queries never
   share a prefix unless a user sets the same ``transactionalIdPrefix`` for both. A ``df.write``
   inside ``foreachBatch`` has no default: a call may write several times, and each write needs ids
   of its own (:func:`~.transactional_ids.require_batch_write_prefix`).
2. The producer. The Python worker keeps one producer per transactional id across micro-batches, and
   reuses it while no other worker of the machine initialised the id since (:mod:`.ownership`; Spark
   runs a task in any idle worker, and a worker closes its producers of ids that moved at its next
   task). A reused producer skips the rest of this step. For a new one, the prefix's owner is
   settled first (:func:`~.claims.settle_prefix_owner`; skipped where this process already found the
   prefix owned by ``q``): a quick read of the prefix's partition to its last stable offset, on from
   the driver's snapshot, finds ``claim/<prefix>``. A prefix nobody claimed yet is claimed here,
   through the prefix's own transactional id ``{prefix}.claim``, whose fencing lets one of two
   racing claims commit. But where the checkpoint recorded a claim in this topic, the topic lost the
   query's markers: the task refuses by the first check of 4c, even at the query's first batch,
   before a new claim could hide the loss. A query that finds another's claim refuses, unless it
   adopts that query's ids, before it could fence the owner's producers. A prefix whose ids were
   registered before claims existed has no claim; 4a checks its ids one by one. The new producer
   then calls ``init_transactions()``: the broker aborts whatever a crashed or zombie attempt with
   the same id left open and fences it (its later requests fail with PRODUCER_FENCED). Steps 1-3 run
   before the task waits for its first row, so Spark computes and sends the rows meanwhile.
3. At the id's first write of a query run, the task learns what the id committed
   (:func:`~.id_state.read_committed_state`). A run is known by Spark's run id in the description of
   the batch's jobs (:mod:`.task`); where a ``foreachBatch`` function replaced that description,
   every write counts as a first. A run's first batch is the only one that can be a replay. Later
   writes of the run use what was read, and the producer tracks its own marker from then on. A new
   producer later in the run (the id moved to another Python worker) reads again, but keeps the
   run's first batch where a worker of this machine recorded one for the id and run
   (:mod:`.ownership`), so the checks of a run's first batch (4b, 4c, the driver's after the tasks)
   run at that batch and not at every batch a new producer serves.

   a. It reads, with read_committed and waiting out open transactions, the partitions of the
      compacted commit-marker topic (key = transactional id) that hold the id's prefix, the query's
      records of its claims, and the other prefixes those name (:class:`~.commit_log.MarkerLayout`).
      The read starts where the driver's snapshot ends and is laid over it
      (:mod:`.marker_snapshot`), so the topic is read once per run, not once per task. It gives the
      id's latest marker and its registration, the markers of ``q`` of the prefix's other ids
      (siblings) and, for a streaming write, of ``q`` under other prefixes, and the prefix's
      progress and refusal records.
   b. Markers lost: the first check of 4c, applied here before anything is registered, so that a
      refused run leaves nothing a later run could take for the query's history.
   c. Adoption: where ``adoptTransactionalIdsFrom`` names the query the id's registration names, and
      ``acceptReshapedBatch`` does not name this batch, it refuses while that query's markers hold a
      batch past its progress record (a batch it committed in part), or while this query's
      checkpoint starts elsewhere than where that query's last complete batch ended (input read
      twice or never); the message counts both. An old query without a progress record is only
      warned about.
   d. The claim once more (:func:`~.claims.require_prefix_claim`): claimed here where nobody claimed
      the prefix and none of its ids is registered; taken over from an adopted query; another owner
      refuses. The query's record of its claim, ``query/<q>/<prefix>``, is written where missing.
   e. It registers the id (``registration/<id>``, naming ``q``) where the id has no registration, or
      where this query adopts it, in a transaction of its own before any output: a restart with
      fewer write partitions finds the id through it (the driver's commit, below).

   The producer then looks up the marker topic's leaders, so that its first commit does not wait
   for them; only now, after the read found the topic there (a look-up of a missing topic would
   have the broker create it with its defaults).
4. Write, skip or refuse: :func:`~.replay.decide`, a pure function of what steps 0-3 learned. The
   first of these rules that applies, in this order, decides:

   a. The id's registration (where step 3 read it) names another query: refuse. Two queries sharing
      ids overwrite each other's markers, and either could then write a batch twice. An adopted id
      passes: 3e registered it to ``q``.
   b. ``acceptReshapedBatch`` names a batch past the run's first: refuse. Only a run's first batch
      can be a replay, so the option is a mistake that would wait to take a later batch as written.
   c. Markers lost, at the run's first batch only. The marker topic holds nothing of ``q`` (no
      registration of this id, no marker of ``q``, no progress record of it), and the batch is past
      ``q``'s first, or the checkpoint recorded a claim the topic lost: refuse. A marker topic
      deleted or renamed between two runs would otherwise let a replay write again. The way on,
      ``exactlyOnceFromBatch`` naming this batch, starts the exactly-once output here; naming a
      later batch it is refused, naming an earlier one it has no effect. Then, for a streaming write
      whose plan is known: a progress record of ``q`` older than ``b - 1`` comes from a marker topic
      or prefix the query used before (Spark commits ``b - 1`` only after the driver recorded its
      progress), so its markers since are elsewhere: refuse, unless ``exactlyOnceFromBatch`` names
      this batch.
   d. The checkpoint is behind its output: a marker of ``q`` (the id's own, a sibling's, or one
      under another prefix) or the progress record of ``q`` holds a later batch than ``b``; or,
      where the plan is known, one of them holds ``b`` with another plan digest (``b`` was planned
      anew from other input: :mod:`.batch_plan`): refuse. Writing would double what the output
      holds, skipping would drop the input that arrived since. The message offers the newest
      checkpoint copy, or a new checkpoint from where the output ends, with its exact cost.
   e. ``acceptReshapedBatch`` names ``b``, and the prefix's refusal record names ``b`` of ``q``
      (otherwise the option has no effect, and the checks go on at 4f). The id's own marker of ``b``
      is kept where this run committed it (a retried task), where the run the refusal record names
      did, or where a run that accepted that refusal did; never where a rejected run did. A kept
      marker naming another topic: refuse. A kept marker that recorded a width while the task cannot
      learn its own: refuse. A kept marker of another width or row count: refuse, and this run is
      recorded as rejected (below). A kept marker that matches: skip. No kept marker: refuse where
      4i applies, else write all the rows. A marker of another run holds rows of another shape,
      which a count cannot tell apart from this one's, so its partition is written again: nothing is
      missing, and what other runs committed of ``b`` is in the output twice, as the refusal that
      offered the option counted beforehand, per write partition.
   f. Two shapes: the refusal record names ``b`` of ``q`` and a run other than this one, and the
      markers of ``b`` (the id's own and its siblings') hold commits of that run's shape beside
      commits of another run (a refused replay whose tasks committed before the query stopped):
      refuse; accepting the refusing run's shape is the way on. Where the record names no run (one
      of an earlier version), any marker of ``b`` refuses, and an acceptance keeps none of them.
   g. Width: a marker of ``b`` (the id's own or a sibling's) recorded the batch's number of write
      partitions, and the task's stage has another number, or the task cannot learn its number
      (asked again for up to 30 s): refuse. Every task of the replay sees the same markers and the
      same number, so all refuse before any writes.
   h. The id's own marker holds ``b`` of ``q`` (a replay of output this id already committed):
      naming another topic, refuse (two writes of one ``foreachBatch`` call sharing a prefix, or the
      topic changed in the middle of a replay); with another row count than the task has, refuse
      (the replay's shape differs, and skipping would lose or double records); otherwise skip.
   i. A streaming write finds ``b`` committed by ``q`` under another prefix: refuse (the prefix
      changed in the middle of a replay, and writing would double what the old ids committed).
   j. A streaming write finds a sibling's marker of ``b`` naming another topic: refuse (the output
      topic changed in the middle of a replay; every task refuses, so the batch is never split over
      two topics).
   k. Otherwise write.

   A refusal that finds the batch split otherwise names the way on, ``acceptReshapedBatch``, with
   its exact cost: the records written twice, per write partition. Those of 4g and of 4h's row
   count, and the driver's check after the tasks, first record the refusing run in
   ``refusal/<prefix>`` (replacing the record before): an acceptance then keeps what that run
   committed, so the cost stated is the cost paid. Where it cannot be recorded, the message says
   that accepting writes those commits again too. An acceptance refused in 4e for another width or
   row count adds its run to the record's rejected runs, so that no later acceptance keeps what its
   other tasks committed.

   Where the first run could not learn its width (the web UI off, or not reachable from the
   executors), its markers record none and 4g does not apply. A replay split into fewer partitions
   is then seen only by the driver's check, after its tasks wrote; and the tasks decide one by one,
   so one may commit while another refuses at 4h. Either refusal names the way on, and any later run
   meets 4f.
5. Otherwise the task takes the width asked in step 0 (known by then nearly always; a slow answer
   must not keep a transaction open), begins a transaction, produces the rows, then the new marker
   (id, query, batch, partition, record count, topic, write partitions, plan digest, run, the
   accepted run under ``acceptReshapedBatch``, time), and commits. Output and marker become visible
   together or not at all. The marker goes last: its partition is shared by every writer, and an
   open transaction there would hold back every reader of the markers. An empty partition opens no
   transaction.
6. Any failure aborts the transaction where the producer still can; a fenced or failed producer is
   discarded, and the task fails so that Spark retries it. The retry runs from step 0; its producer
   gone, it initialises the id anew in step 2 (aborting what was left open) and reads again in step
   3.

After the tasks, on the driver. ``commit`` checks that every task reported, and warns where markers
recorded another width than the batch's number of tasks (a replay would be refused needlessly). On
the first batch of a run (its tasks report it) it fences the registered ids of write partitions the
batch does not have (a restart with fewer partitions: :mod:`.fencing`), aborting what they left
open, and fails the batch if one of them committed this very batch
(:func:`~.replay.partitions_beyond`): the replay was split otherwise, and its tasks could not tell
for want of the width. That failure is a recorded refusal (see step 4). Where
``acceptReshapedBatch`` accepts the batch (as in 4e), it only logs those records as written twice.
Then it records the batch as the prefix's progress (``progress/<prefix>``: ``b``, its plan digest,
where its input ended), outside any transaction and before Spark's own commit log, so the record is
never behind the checkpoint; a crash between the two replays a batch whose tasks all skip. The
record tells a query whose checkpoint went back where its output ends (4d). A streaming batch
without write tasks is recorded too, where the checkpoint names the query. ``abort`` logs what tasks
of the failed batch committed and re-initialises the ids of failed tasks (:mod:`.fencing`), so
read_committed readers are not held back until the transaction times out. No transaction ever spans
two processes.

Inside ``foreachBatch`` (how update- and complete-mode queries write exactly once) a ``df.write``
runs the same protocol: Spark hands its tasks the query and batch ids. Each exactly-once write there
names a prefix of its own (step 1), and a marker names its write's topic, so two writes to two
topics sharing a prefix fail (4h) instead of one skipping its rows.

Invariants. A task never skips unless a marker of its own id, of this query and batch (and, where
both are known, of the same plan), holds the row count the task has now; under
``acceptReshapedBatch``, a marker of the refusing run, of this run or of an accepting one. Every way
on a refusal offers loses no record, and says how many are written twice. A task whose view is
incomplete (no registration read) never refuses because of it, with one deliberate exception: a
replay that cannot learn its width where the first run recorded it refuses (4g), because the check
it would skip is the only one that fires before a narrower replay writes. Nothing here raises a
false alarm for queries whose output values are not deterministic (``uuid()``, ``rand()``,
``current_timestamp()``): only row counts and widths are compared. The price: other rows in the same
number are not seen, for one rows that a round-robin repartition deals out anew because a
non-deterministic column changed their order (docs/guarantees.md).
"""
