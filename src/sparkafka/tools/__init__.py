"""The programs built on the connector: ``sparkafka run`` pipelines, the demo and ``verify``
experiments, and the harness that starts a broker and a pipeline process for them."""
