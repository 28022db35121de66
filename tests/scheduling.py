"""How scripts/check shares the suite between its xdist workers: by what each test cost last time.

xdist's ``--dist loadfile`` hands out whole files, those with the most tests first. The suite's
cost is elsewhere: the integration files hold few tests of a minute each (pipelines in their own
processes, Kafka clusters), so they came last and one worker ran them alone for the last minutes.

With ``--schedule-by-cost`` the controller's scheduler (:class:`CostOrderedScheduling`):

1. keeps together, on one worker and in a row, the tests of a file that share a fixture wider
   than a test but narrower than the session (a module's broker, Kafka or cluster is then started
   once, as with loadfile), one unit per value of that fixture's parameters (the module's embedded
   broker apart from its Apache Kafka);
2. hands out every other test as a unit of its own: it asks only per-test fixtures and the
   session's, which each worker starts once whatever it runs;
3. hands out the units longest first (longest processing time first), from tests/durations.json,
   so that the last unit to start is a short one: the workers order their collections so, and
   xdist's loadscope hands out units in collection order when its own reorder is off.

tests/durations.json is written by a whole run with ``--record-test-durations``. It only orders
and splits work: a stale or missing file makes a run slower, never different. A test it does not
name is kept with its file and counted at the median cost.

Each test's unit is decided on the workers, where the items are (the controller only sees test
ids): each test's report carries it as a user property, and the controller records it.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

DURATIONS = Path(__file__).resolve().parent / "durations.json"
# Fixture scopes started once per worker whatever the order of the tests: a test asking only these
# (and per-test ones) may run anywhere, alone.
SCOPES_ANY_ORDER = frozenset({"function", "session"})
UNIT = "schedule_unit"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("sparkafka scheduling")
    group.addoption(
        "--schedule-by-cost",
        action="store_true",
        help="with -n: split files into single tests where they share no module fixture, and hand "
        "out the longest work first, by tests/durations.json",
    )
    group.addoption(
        "--record-test-durations",
        action="store_true",
        help="write each test's duration (setup, call and teardown) to tests/durations.json",
    )


def file_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def unit_of(item: pytest.Item) -> str:
    """The unit ``item`` is handed out in: its own id when it asks no fixture that lives longer than
    a test but less than the session; else its file and the parameters of those fixtures."""
    file = file_of(item.nodeid)
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return file
    shared = [
        name
        for name in info.names_closure
        if (definitions := info.name2fixturedefs.get(name)) and definitions[-1].scope not in SCOPES_ANY_ORDER
    ]
    if not shared:
        return item.nodeid
    params = getattr(getattr(item, "callspec", None), "params", {})
    values = [f"{name}={params[name]}" for name in sorted(shared) if name in params]
    return f"{file}[{','.join(values)}]" if values else file


class SuiteCosts:
    """tests/durations.json: each test's seconds, and the unit of each test that shares fixtures
    (a test timed there and not in ``units`` runs alone)."""

    def __init__(self, seconds: dict[str, float], units: dict[str, str]) -> None:
        self.seconds = seconds
        self.units = units
        self.default = statistics.median(seconds.values()) if seconds else 1.0

    @classmethod
    def load(cls, path: Path = DURATIONS) -> SuiteCosts:
        if not path.is_file():
            return cls({}, {})
        data = json.loads(path.read_text())
        return cls(dict(data["seconds"]), dict(data["units"]))

    def unit_of(self, nodeid: str) -> str:
        if nodeid in self.units:
            return self.units[nodeid]
        return nodeid if nodeid in self.seconds else file_of(nodeid)

    def cost_of(self, nodeids: Iterable[str]) -> float:
        return sum(self.seconds.get(nodeid, self.default) for nodeid in nodeids)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Each test's unit goes into its report (for the recorder). With ``--schedule-by-cost`` every
    worker also orders its collection by unit, the longest unit first: each worker sorts alike, so
    the collections still agree, and xdist (told not to reorder) hands out the units in that order."""
    units: dict[str, list[pytest.Item]] = {}
    for item in items:
        unit = unit_of(item)
        item.user_properties.append((UNIT, unit))
        units.setdefault(unit, []).append(item)
    if not config.getoption("schedule_by_cost"):
        return
    costs = SuiteCosts.load()
    # Python's sort is stable: units of equal cost keep the collection's order.
    ordered = sorted(units.values(), key=lambda members: -costs.cost_of(item.nodeid for item in members))
    items[:] = [item for members in ordered for item in members]


def make_cost_ordered_scheduling(config: pytest.Config, log: Any) -> Any:
    # xdist is imported here, on the controller, so that a run without it still loads this plugin.
    from xdist.scheduler import LoadScopeScheduling

    costs = SuiteCosts.load()

    class CostOrderedScheduling(LoadScopeScheduling):
        """LoadScopeScheduling with the units of :class:`SuiteCosts`, in the workers' order."""

        def _split_scope(self, nodeid: str) -> str:
            return costs.unit_of(nodeid)

    # The workers' collection is already longest unit first; xdist's own reorder (by count of tests)
    # would undo it.
    config.option.loadscopereorder = False
    return CostOrderedScheduling(config, log)


# Optional: the hook exists only where xdist is loaded (``-p no:xdist`` runs without it).
@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    if not config.getoption("schedule_by_cost"):
        return None
    return make_cost_ordered_scheduling(config, log)


class DurationRecorder:
    """Adds up each test's phases from the reports the controller receives, and writes them into
    tests/durations.json at the end: the tests this run ran replace their entries, the others stay
    while their file exists (a run of a few files keeps the rest)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.units: dict[str, str] = {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.seconds[report.nodeid] = self.seconds.get(report.nodeid, 0.0) + report.duration
        # A worker's report arrives through JSON: its (name, value) tuples are lists by then.
        for name, value in report.user_properties:
            if name == UNIT:
                self.units[report.nodeid] = str(value)

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if not self.seconds:
            return
        kept = SuiteCosts.load()
        root = DURATIONS.parent.parent
        seconds = {n: s for n, s in kept.seconds.items() if (root / file_of(n)).is_file()}
        units = {n: u for n, u in kept.units.items() if n in seconds}
        for nodeid, spent in self.seconds.items():
            seconds[nodeid] = round(spent, 1)
            units.pop(nodeid, None)
            if self.units.get(nodeid, nodeid) != nodeid:
                units[nodeid] = self.units[nodeid]
        data = {"seconds": dict(sorted(seconds.items())), "units": dict(sorted(units.items()))}
        DURATIONS.write_text(json.dumps(data, indent=1) + "\n")


def pytest_configure(config: pytest.Config) -> None:
    # Workers do not record: their reports reach the controller, which does.
    if config.getoption("record_test_durations") and not hasattr(config, "workerinput"):
        config.pluginmanager.register(DurationRecorder(), "sparkafka-duration-recorder")
