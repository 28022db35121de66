"""Public name of :mod:`sparkafka.formats.functions`: ``from sparkafka.functions import from_json``."""

import sys

from sparkafka.formats import functions as _functions
from sparkafka.formats.functions import *  # noqa: F403
from sparkafka.formats.functions import __all__ as __all__

sys.modules[__name__] = _functions
