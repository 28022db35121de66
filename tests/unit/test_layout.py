"""The package layout's rules, checked on the source: what each part may import, and the public
import paths that keep working whatever moves inside."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "sparkafka"

# What each part may import of sparkafka (a name or anything below it). The connector reaches Kafka
# only over the wire, so it never imports the embedded broker; the broker stands alone.
ALLOWED = {
    "broker": ("sparkafka.broker",),
    "connector": ("sparkafka.connector", "sparkafka.errors"),
    "formats": ("sparkafka.formats", "sparkafka.errors", "sparkafka.connector.eventtime"),
    "runtime": ("sparkafka.runtime", "sparkafka.errors"),
}
# The package itself, imported for its location on disk.
ALLOWED_EXACTLY = {"runtime": {"sparkafka"}}


def _sparkafka_imports(source: str, module: str) -> set[str]:
    """Every sparkafka module that ``source``, the code of ``module``, imports at any depth."""
    found = set()
    for node in ast.walk(ast.parse(source, module)):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against the importing module's package
                base = module.split(".")[: -node.level]
                name = ".".join([*base, node.module] if node.module else base)
            else:
                name = node.module or ""
            found |= {f"{name}.{alias.name}" for alias in node.names} | {name}
    return {name for name in found if name == "sparkafka" or name.startswith("sparkafka.")}


def _permitted(name: str, allowed: tuple[str, ...]) -> bool:
    return any(name == prefix or name.startswith(prefix + ".") for prefix in allowed)


@pytest.mark.parametrize("part", sorted(ALLOWED))
def test_each_part_imports_only_what_it_may(part: str) -> None:
    allowed = ALLOWED[part]
    offences = []
    for path in sorted((PACKAGE / part).rglob("*.py")):
        module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        for name in sorted(_sparkafka_imports(path.read_text(), module)):
            if name in ALLOWED_EXACTLY.get(part, set()):
                continue
            # `from sparkafka.x import y` names both sparkafka.x and sparkafka.x.y: judge the module.
            if not _permitted(name, allowed) and not _permitted(name.rsplit(".", 1)[0], allowed):
                offences.append(f"{path.relative_to(PACKAGE)} imports {name}")
    assert not offences, "\n".join(offences)


def test_the_rule_sees_imports_inside_functions_and_relative_ones() -> None:
    """The connector imports lazily in places; a relative import names a module as well."""
    source = "def late():\n    from sparkafka.broker.server import Broker\nfrom ..broker import log\n"
    found = _sparkafka_imports(source, "sparkafka.connector.probe")
    assert {"sparkafka.broker.server", "sparkafka.broker.log"} <= found
    assert not _permitted("sparkafka.broker.server", ALLOWED["connector"])


@pytest.mark.parametrize(
    ("module", "name"),
    [
        ("sparkafka", "register"),
        ("sparkafka.functions", "from_json"),
        ("sparkafka.functions", "route_dead_letters"),
        ("sparkafka.eventtime", "drop_heartbeats"),
        ("sparkafka.session", "spark_session"),
        ("pyspark_sparkafka", "DefaultSource"),
        ("sparkafka.cli", "main"),
        ("sparkafka.runtime.python_exec", "main"),
        ("sparkafka.worker_daemon", "main"),
    ],
)
def test_public_import_paths_keep_working(module: str, name: str) -> None:
    assert callable(getattr(importlib.import_module(module), name))


def test_the_public_module_names_are_the_modules_themselves() -> None:
    """``sparkafka.functions`` is the formats module, not a copy: patches and private names reach it."""
    from sparkafka.formats import functions

    assert importlib.import_module("sparkafka.functions") is functions


def test_the_earlier_worker_daemon_module_imports_no_pyspark() -> None:
    """Spark starts ``spark.python.daemon.module`` before anything may import PySpark from its zip."""
    probe = "import sys, sparkafka.worker_daemon; print(any(m.startswith('pyspark') for m in sys.modules))"
    printed = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert printed.stdout.strip() == "False"
