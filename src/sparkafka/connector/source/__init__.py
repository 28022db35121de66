"""The Kafka source: ``spark.readStream.format("sparkafka")`` and ``spark.read.format("sparkafka")``.

A PySpark Python data source on top of confluent-kafka. Options and output schema are those of
Spark's built-in Kafka source (``subscribe``, ``startingOffsets``, ``maxOffsetsPerTrigger`` …), plus
a few from Flink's connector (``startingOffsets=group``, ``commitOffsetsOnBatch``,
``partitionDiscoveryIntervalMs``). It must never import ``sparkafka.broker``: it runs against real
clusters.

Options (names as in Spark's source; keys are case-insensitive)
    ``kafka.bootstrap.servers``          required. Every ``kafka.*`` option goes to librdkafka without
                                         the prefix (``kafka.security.protocol``, ``kafka.sasl.*``,
                                         ``kafka.ssl.*``, ``kafka.client.rack`` …), except those below.
    ``kafka.isolation.level``            ``read_committed`` (default, unlike Spark) or ``read_uncommitted``.
    ``kafka.group.id``                   group for ``startingOffsets=group`` and ``commitOffsetsOnBatch``;
                                         the source never joins it (it assigns partitions itself).
    ``kafka.default.api.timeout.ms``     bound on every driver-side request (default 30000); not passed
                                         to librdkafka.
    ``subscribe`` | ``subscribePattern`` | ``assign``   exactly one; a pattern selects every topic whose
                                         name it matches anywhere (as Spark's ``findFirstIn``).
    ``startingOffsets``                  ``earliest``, ``latest`` (streaming default), ``group``, or
                                         JSON ``{"t":{"0":23,"1":-2}}`` (-2 earliest, -1 latest);
                                         ``startingOffsetsByTimestamp`` / ``startingTimestamp`` (with
                                         ``startingOffsetsByTimestampStrategy`` error|latest) win over it.
    ``groupOffsetsFallback``             where ``startingOffsets=group`` starts partitions the group has
                                         no commit for: ``latest`` (default, like Flink's
                                         setStartFromGroupOffsets with Kafka's default reset),
                                         ``earliest``, or ``none`` (fail).
    ``endingOffsets`` (``endingOffsetsByTimestamp``, ``endingTimestamp``)   batch only; default latest.
    ``maxOffsetsPerTrigger``, ``minOffsetsPerTrigger``, ``maxTriggerDelay`` (default 15m)   streaming.
    ``minPartitions``, ``maxRecordsPerPartition``   split large offset ranges into more Spark tasks.
    ``failOnDataLoss`` (default true), ``includeHeaders`` (default false), ``groupIdPrefix``.
    ``commitOffsetsOnBatch``             default true: processed offsets are committed to
                                         ``kafka.group.id`` (when set) so lag tools see progress.
                                         Monitoring only: recovery always uses the checkpoint.
    ``partitionDiscoveryIntervalMs``     how often new partitions of subscribed topics and new
                                         topics matching ``subscribePattern`` are looked for; they are
                                         read from their earliest offset. Default: every micro-batch,
                                         as Spark's source; > 0: at most that often; <= 0: never.
    ``idleHeartbeatIntervalMs``          streaming, default off: once no partition has had new records
                                         for this long, one micro-batch per interval carries a synthetic
                                         heartbeat row, so event-time windows close while the input is
                                         idle (see "Idle heartbeats" below and ``sparkafka.eventtime``).
    ``kafkaConsumer.pollTimeoutMs`` (default 120000), ``fetchOffset.numRetries`` (3),
    ``fetchOffset.retryIntervalMs`` (1000)   as in Spark.

Offsets
    A source offset is ``{"topic": {"partition": next offset to read}}``, Spark's format, with
    topics and partitions always in sorted order so that equal offsets serialise to equal JSON
    (the engine compares offsets as JSON text to decide whether there is new data).

Starting offsets
    The engine keeps every micro-batch's end offsets in the checkpoint, but not a new query's start:
    it asks ``initialOffset()`` when it plans the first micro-batch and asks again when it replays
    that batch after a failure. Spark's own Kafka source writes its starting offsets to a log of its
    own in the checkpoint; a Python data source has no access to the checkpoint. Starting offsets
    that resolve the same every time (``earliest``, numbers, -2; retention aside) are resolved
    again, and marked ``{"sparkafka:initialOffset": {"0": 0}}``; the first micro-batch's end offset
    then also carries its start, ``{"sparkafka:firstBatchStart:<topic>": {"partition": offset}}``,
    checkpointed with it, and ``partitions`` plans from that start: a replay reads the same range
    even after retention moved ``earliest``, and reports the lost records as data loss. For the
    others (``latest`` or -1, ``group``, timestamps) ``initialOffset()`` is a constant,
    ``{"sparkafka:startingOffsets": {"0": 0}}``, and the first ``latestOffset`` call resolves
    ``startingOffsets`` and returns the result (marked too) as the end of micro-batch 0, which reads
    no records;
    the engine checkpoints it like every end offset. Every batch that reads records then starts from
    the same offsets when replayed, even with ``startingOffsets=latest``, which would otherwise move
    between the first run and the replay. (With ``latest`` Spark's engine ran an empty first batch
    anyway, unless records arrived while it planned it.)

Exactly-once reading rests on three invariants:

1. ``partitions(start, end)`` depends on nothing but ``start`` and ``end``: a micro-batch replayed
   after a failure plans the same offset ranges.
2. ``read()`` of range ``[start, end)`` returns exactly the records of that range visible at the
   configured isolation level, however often it runs (unless retention removed them: data loss).
3. End offsets never pass the last stable offset (``read_committed``, the default) so a range never
   covers records of a transaction that is still open and might later abort.

Invariant 1 assumes the log under a planned range never changes. An unclean leader election
breaks that: it truncates records the query read, and new records take their offsets. End offsets
therefore carry each partition's leader epoch, ``{"sparkafka:leaderEpoch:<topic>": {"partition":
epoch}}`` (KIP-320); where a partition's epoch changed, ``latestOffset`` and the ``partitions`` of a
replay ask its leader where the recorded epoch ends (:mod:`.epochs`), and a truncation below the
position fails the query (``failOnDataLoss``) or is read on from the truncation point.

Idle heartbeats (``idleHeartbeatIntervalMs``)
    Spark's watermark only moves when rows arrive, so once the whole input is idle the last
    event-time window of an append-mode query never closes. With the option set, ``latestOffset``
    adds a synthetic entry ``{"sparkafka:idleHeartbeat": {"0": <wall-clock ms>}}`` to the end
    offsets when the input has been idle for the interval. ``:`` cannot occur in a Kafka topic name,
    so the key never collides with a topic. The time is part of the checkpointed offsets: a replayed
    batch plans and emits exactly the same heartbeat (invariant 1 holds). ``partitions(start, end)``
    turns an entry that grew between ``start`` and ``end`` into one :class:`HeartbeatPartition`,
    whose ``read()`` yields one row: key and value null, topic ``""``, partition -1, offset -1,
    timestamp = the heartbeat time (not shifted), timestampType -1 (not a Kafka timestamp). Queries
    drop it after ``withWatermark`` with :func:`sparkafka.connector.eventtime.drop_heartbeats`.

    Invariants: a heartbeat is only planned when the micro-batch would otherwise not run (no
    partition has unread offsets, none was added, reset or lost), so heartbeat batches carry no
    records and never count in rate limits; none while an open transaction holds a partition's last
    stable offset back (its records may carry older timestamps); none under Trigger.AvailableNow.
    Heartbeat times only increase. Every function that treats offset keys as topics
    (:func:`decode_offsets`, hence data-loss checks, partition discovery, rate limits and
    ``commitOffsetsOnBatch``) never sees the entry; ``latestOffset`` carries it forward unchanged
    from ``start`` until the next heartbeat replaces it.
"""
