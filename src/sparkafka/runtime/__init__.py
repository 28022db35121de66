"""How sparkafka runs Spark: the tuned local session, and the launchers of the Python processes
Spark starts (worker daemon, streaming source runner zygote, the ``sparkafka-python`` executable).
Nothing here imports PySpark at import time: the launchers must set the path first."""
