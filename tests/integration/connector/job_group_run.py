"""``sparkafka run`` whose foreachBatch writes (``--output-mode update``) run under a job group of
the user's own, as a foreachBatch function commonly sets one: ``SPARKAFKA_TEST_JOB_GROUP`` names it
(a name, or a UUID such as an orchestrator's run id). Setting a job group also replaces the job
description Spark gives the batch, which names the query run: the sink must tell runs apart
without it. Run as a script: ``python job_group_run.py <sparkafka run arguments>``."""

from __future__ import annotations

import os
import sys
from typing import Any

from pyspark.sql.readwriter import DataFrameWriter

JOB_GROUP = os.environ.get("SPARKAFKA_TEST_JOB_GROUP", "")
_save = DataFrameWriter.save


def _save_in_job_group(self: DataFrameWriter, *args: Any, **kwargs: Any) -> None:
    if JOB_GROUP:
        self._spark.sparkContext.setJobGroup(JOB_GROUP, "nightly export")
    _save(self, *args, **kwargs)


if __name__ == "__main__":
    DataFrameWriter.save = _save_in_job_group  # type: ignore[method-assign]
    sys.argv = ["sparkafka", "run", *sys.argv[1:]]
    from sparkafka.cli.app import main

    main()
