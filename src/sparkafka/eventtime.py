"""Public name of :mod:`sparkafka.connector.eventtime`:
``from sparkafka.eventtime import drop_heartbeats``."""

import sys

from sparkafka.connector import eventtime as _eventtime
from sparkafka.connector.eventtime import *  # noqa: F403
from sparkafka.connector.eventtime import __all__ as __all__

sys.modules[__name__] = _eventtime
