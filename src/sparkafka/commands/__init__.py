"""Sub-commands of the `sparkafka` command line, one module per group."""
