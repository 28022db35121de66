"""The systems compared, where their runners live, and the Python each one runs with.

A system's runner is ``benchmarks/systems/<runner>``; systems with an ``environment`` module there get
a virtualenv of their own from its ``ensure_environment(venvs_dir) -> Path``, the others run with the
project's python. A system whose files are missing, or whose environment cannot be built, is skipped
with the reason.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from benchmarks.common import REPO

SYSTEMS_DIR = REPO / "benchmarks" / "systems"


@dataclass(frozen=True)
class System:
    name: str  # as given to --systems
    label: str  # as shown in tables and plots
    runner: str
    environment: str | None  # module in benchmarks/systems with ensure_environment(); None: project venv
    distributions: tuple[str, ...]  # whose versions the report lists
    runner_args: tuple[str, ...] = ()
    workloads: tuple[str, ...] = ("map", "count")
    guarantees: tuple[str, ...] = ("exactly-once", "at-least-once")
    # Set in the runner's environment: a variant of a system, run when named in --systems only.
    variables: tuple[tuple[str, str], ...] = ()

    @property
    def runner_path(self) -> Path:
        return SYSTEMS_DIR / self.runner


SYSTEMS: tuple[System, ...] = (
    System("sparkafka", "sparkafka", "sparkafka_run.py", None, ("sparkafka", "pyspark", "confluent-kafka")),
    System(
        "sparkafka-quick-jit",
        "sparkafka (SPARKAFKA_DRIVER_JIT=quick)",
        "sparkafka_run.py",
        None,
        ("sparkafka", "pyspark", "confluent-kafka"),
        variables=(("SPARKAFKA_DRIVER_JIT", "quick"),),
    ),
    System(
        "spark-kafka",
        "Spark's kafka connector",
        "spark_kafka.py",
        None,
        ("pyspark",),
        guarantees=("at-least-once",),  # Spark's Kafka sink has no transactions
    ),
    System("handwritten", "confluent-kafka loop", "handwritten.py", None, ("confluent-kafka",)),
    System("quix", "Quix Streams", "quix.py", "quix_env.py", ("quixstreams", "confluent-kafka")),
    System(
        "flink-python",
        "PyFlink (Python UDF)",
        "flink.py",
        "flink_env.py",
        ("apache-flink", "shigawire-apache-flink-libraries"),
        ("--udf", "python"),
    ),
    System(
        "flink-java",
        "PyFlink (Java UDF)",
        "flink.py",
        "flink_env.py",
        ("apache-flink", "shigawire-apache-flink-libraries"),
        ("--udf", "java"),
        workloads=("map",),
    ),
)
# `--systems flink` means both PyFlink rows.
ALIASES = {"flink": ("flink-python", "flink-java")}
# What a run without --systems compares: every system but the variants.
DEFAULT_SYSTEMS = tuple(system for system in SYSTEMS if not system.variables)


def select(names: str) -> list[System]:
    """The systems named in a comma-separated list (in the order of SYSTEMS), or ValueError."""
    by_name = {system.name: system for system in SYSTEMS}
    wanted: set[str] = set()
    for name in filter(None, (n.strip() for n in names.split(","))):
        if name in ALIASES:
            wanted.update(ALIASES[name])
        elif name in by_name:
            wanted.add(name)
        else:
            known = ", ".join([*by_name, *ALIASES])
            raise ValueError(f"unknown system {name!r} in --systems; known systems: {known}")
    return [system for system in SYSTEMS if system.name in wanted]


def _environment_builder(module_file: str) -> Callable[[Path], Path]:
    path = SYSTEMS_DIR / module_file
    spec = importlib.util.spec_from_file_location(f"bench_env_{path.stem}", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    builder: Callable[[Path], Path] = module.ensure_environment
    return builder


def prepare(system: System, venvs_dir: Path) -> tuple[Path | None, str]:
    """(python to run the system's runner with, "") or (None, why the system is skipped)."""
    missing = [
        f"benchmarks/systems/{name}"
        for name in (system.runner, system.environment)
        if name is not None and not (SYSTEMS_DIR / name).is_file()
    ]
    if missing:
        return None, f"{' and '.join(missing)} not found"
    if system.environment is None:
        return Path(sys.executable), ""
    try:
        return _environment_builder(system.environment)(venvs_dir.resolve()), ""
    except Exception as error:  # any failure of a third-party install skips that system only
        return None, f"its virtualenv could not be set up by benchmarks/systems/{system.environment}: {error}"


_VERSIONS_SCRIPT = """
import importlib.metadata as metadata, json, sys
found = {}
for name in sys.argv[1:]:
    try:
        found[name] = metadata.version(name)
    except metadata.PackageNotFoundError:
        found[name] = "not installed"
try:
    import confluent_kafka
    found["librdkafka"] = confluent_kafka.libversion()[0]
except ImportError:
    pass
print(json.dumps(found))
"""


def versions(python: Path, distributions: tuple[str, ...]) -> dict[str, str]:
    """Installed versions of ``distributions`` (and librdkafka, where confluent-kafka is) in ``python``."""
    completed = subprocess.run(
        [str(python), "-c", _VERSIONS_SCRIPT, *distributions], capture_output=True, text=True, check=False
    )
    if completed.returncode != 0:
        return {name: "unknown" for name in distributions}
    found: dict[str, str] = json.loads(completed.stdout)
    return found
