"""How sparkafka's log records look in a process whose logging nobody configured.

Spark's Python workers configure no logging (unless ``spark.sql.pyspark.worker.logging.enabled``
captures it), and neither does a plain script. There Python's last-resort handler prints a warning
as its bare message, so the executors' records (librdkafka's connection errors during a broker
outage, the source's data-loss warnings) appeared in the executor log without time, level or
origin, between Spark's own formatted lines.

:func:`install` gives the ``sparkafka`` logger a handler that stands in for the last resort and
nothing more. Invariants:

* it writes exactly the records the last resort would have written: WARNING and above, and only
  when there is no other handler on the record's way to the root (whatever that handler's level);
* it writes them to the current ``sys.stderr`` (as the last resort does), as one line with the time,
  level and logger name;
* configured logging (``basicConfig``, PySpark's worker log capture, a handler on any sparkafka
  logger) gets every record exactly as before, and this handler then writes nothing.
"""

from __future__ import annotations

import logging
import sys

_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class _LastResortWithContext(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.setFormatter(logging.Formatter(_FORMAT))

    def emit(self, record: logging.LogRecord) -> None:
        if self._another_handler_takes(record):
            return
        try:
            sys.stderr.write(self.format(record) + "\n")
            sys.stderr.flush()
        except Exception:  # as logging's own handlers do: a logging failure must not fail the caller
            self.handleError(record)

    def _another_handler_takes(self, record: logging.LogRecord) -> bool:
        """Logger.callHandlers' walk without this handler: does it find any handler (then Python would
        not use its last resort), or is there no last resort at all?"""
        if logging.lastResort is None:
            return True
        logger: logging.Logger | None = logging.getLogger(record.name)
        while logger is not None:
            if any(handler is not self for handler in logger.handlers):
                return True
            if not logger.propagate:
                return False
            logger = logger.parent
        return False


def install(logger_name: str = "sparkafka") -> None:
    """Give ``logger_name`` the stand-in for the last resort, once per process."""
    logger = logging.getLogger(logger_name)
    if not any(isinstance(h, _LastResortWithContext) for h in logger.handlers):
        logger.addHandler(_LastResortWithContext())
