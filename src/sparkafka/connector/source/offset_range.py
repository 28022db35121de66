"""One Spark input partition of the source: what an executor's read is handed (the driver plans
them, :mod:`.ranges`; the executor reads them, :mod:`.reader`, and imports nothing of the planning)."""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql.datasource import InputPartition


@dataclass(frozen=True)
class OffsetRange(InputPartition):
    """One Spark input partition: records of ``topic``/``partition`` with ``start <= offset < end``."""

    topic: str
    partition: int
    start: int
    end: int

    @property
    def size(self) -> int:
        """Offsets in the range; the number of records may be lower (control records, aborted data)."""
        return self.end - self.start
