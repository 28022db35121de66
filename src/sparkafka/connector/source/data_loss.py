"""Data loss, as Spark's Kafka source reports it: fail the query (``failOnDataLoss=true``, the
default) or warn and go on from where records are left. Used by the driver's planning and the
executors' reads alike."""

from __future__ import annotations

import logging

from sparkafka.connector.source.options import SourceOptions
from sparkafka.errors import DataLossError

logger = logging.getLogger(__name__)

DATA_LOSS_CAUSE = (
    "Some data may have been lost because they are not available in Kafka any more; either the data was "
    "aged out by Kafka (retention) or the topic may have been deleted (and recreated) before all the "
    "data in the topic was processed."
)


def report_data_loss(options: SourceOptions, message: str, *, resume_at: int) -> int:
    """Fail (``failOnDataLoss=true``) or warn and return the offset to continue from."""
    if options.fail_on_data_loss:
        raise DataLossError(
            f"{message}. {DATA_LOSS_CAUSE} If you want your streaming query to continue from the earliest "
            'available offset instead of failing, set the source option "failOnDataLoss" to "false".'
        )
    logger.warning("%s. %s Continuing (failOnDataLoss=false).", message, DATA_LOSS_CAUSE)
    return resume_at
