"""``spark.read``: one job over ``[startingOffsets, endingOffsets)``, planned on the driver."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, InputPartition

from sparkafka.connector.source.options import SourceOptions
from sparkafka.connector.source.ranges import offset_ranges, split_offset_ranges
from sparkafka.connector.source.reader import read_offset_range
from sparkafka.connector.source.resolver import OffsetResolver
from sparkafka.errors import SparkafkaOptionError


class KafkaBatchReader(DataSourceReader):
    """``spark.read``: one job over ``[startingOffsets, endingOffsets)``."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options

    def partitions(self) -> Sequence[InputPartition]:
        admin = self.options.admin()
        try:
            resolver = OffsetResolver(self.options, admin)
            topic_partitions = resolver.partitions(require_topics=True)
            assert self.options.starting is not None and self.options.ending is not None, "set by for_batch()"
            latest = resolver.latest(topic_partitions)
            start = resolver.resolve(
                self.options.starting, topic_partitions, starting=True, latest_snapshot=latest
            )
            end = resolver.resolve(
                self.options.ending, topic_partitions, starting=False, latest_snapshot=latest
            )
        finally:
            admin.close()
        for tp in topic_partitions:
            if start[tp] > end[tp]:
                raise SparkafkaOptionError(
                    f"the starting offset {start[tp]} of topic '{tp[0]}' partition {tp[1]} is after its "
                    f"ending offset {end[tp]} ({self.options.starting.option} / {self.options.ending.option})"
                )
        return split_offset_ranges(
            offset_ranges(start, end),
            min_partitions=self.options.min_partitions,
            max_records_per_partition=self.options.max_records_per_partition,
        )

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_offset_range(partition, self.options)
