"""`python -m benchmarks`: sparkafka next to a hand-written confluent-kafka loop, Quix Streams and
PyFlink on the same workloads, broker and machine (see `benchmarks/__main__.py`)."""
