"""`sparkafka run`'s restart strategies (Flink's fixed-delay and failure-rate): which failure ends the
pipeline."""

from __future__ import annotations

from sparkafka.tools.pipeline import RestartBudget


def test_fixed_delay_counts_every_failure_of_the_pipelines_life() -> None:
    budget = RestartBudget(attempts=2)
    assert budget.allows_another(0.0)
    assert budget.allows_another(86_400.0)
    assert not budget.allows_another(2 * 86_400.0)  # the third, however far apart
    assert budget.counted == 3
    assert budget.describe() == "--restart-attempts=2"


def test_failure_rate_counts_only_the_failures_of_the_last_interval() -> None:
    budget = RestartBudget(attempts=2, interval_s=600)
    assert budget.allows_another(0.0)
    assert budget.allows_another(300.0)
    assert budget.allows_another(700.0)  # the one at 0 s is more than 600 s old
    assert budget.counted == 2
    assert not budget.allows_another(800.0)  # three within 600 s: 300, 700, 800
    assert budget.describe() == "--restart-attempts=2 within --restart-failure-interval=600s"


def test_no_restart_attempts_ends_the_pipeline_at_its_first_failure() -> None:
    assert not RestartBudget(attempts=0).allows_another(0.0)
    assert not RestartBudget(attempts=0, interval_s=60).allows_another(0.0)
