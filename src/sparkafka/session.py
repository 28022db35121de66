"""Public name of :mod:`sparkafka.runtime.session`: ``from sparkafka.session import spark_session``."""

import sys

from sparkafka.runtime import session as _session
from sparkafka.runtime.session import spark_session as spark_session

sys.modules[__name__] = _session
