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
    # The launcher's record of who started it (python_exec: light, imports nothing of PySpark).
    "connector": ("sparkafka.connector", "sparkafka.errors", "sparkafka.runtime.python_exec"),
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
            found |= {f"{name}.{alias.name}" for alias in node.names}
            # `from sparkafka import errors` names the module sparkafka.errors; the package itself
            # only where what is imported is not one of its modules.
            if name != "sparkafka" or any(not (PACKAGE / f"{a.name}.py").exists() for a in node.names):
                found.add(name)
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
    assert _sparkafka_imports("from sparkafka import errors\n", "sparkafka.connector.probe") == {
        "sparkafka.errors"
    }


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


# -- the contracts, followed through every module a part reaches ------------------------------------

SOURCE_ROOT = PACKAGE.parent


def _module_name(path: Path) -> str:
    parts = path.relative_to(SOURCE_ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _from_module(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    """The module a ``from ... import`` in ``module`` names, relative imports resolved."""
    if not node.level:
        return node.module or ""
    package = module.split(".") if is_package else module.split(".")[:-1]
    base = package[: len(package) - node.level + 1]
    return ".".join([*base, node.module] if node.module else base)


def _imports(source: str, module: str, is_package: bool) -> set[str]:
    """Every module ``source`` (the code of ``module``) imports at any depth, third-party ones
    included: ``import x``, ``from x import y`` (``x.y`` where that is a module, else ``x``),
    relative imports, and modules named by a constant string to ``importlib.import_module``."""
    found = set()
    for node in ast.walk(ast.parse(source, module)):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            name = _from_module(node, module, is_package)
            found.add(name)
            found |= {f"{name}.{alias.name}" for alias in node.names}
        elif (
            isinstance(node, ast.Call)
            and ast.unparse(node.func) in ("importlib.import_module", "import_module", "__import__")
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            found.add(node.args[0].value)
    return found


def _graph() -> dict[str, set[str]]:
    """Module -> the modules of sparkafka and pyspark_sparkafka it imports directly, and the
    third-party top-level packages it imports (by their top-level name)."""
    paths = sorted([*PACKAGE.rglob("*.py"), *(SOURCE_ROOT / "pyspark_sparkafka").rglob("*.py")])
    modules = {_module_name(path): path for path in paths}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        edges = set()
        for imported in _imports(path.read_text(), name, path.name == "__init__.py"):
            if imported in modules:
                edges.add(imported)
            elif imported.split(".")[0] in ("sparkafka", "pyspark_sparkafka"):
                # `from sparkafka.x import name`: the name is not a module, sparkafka.x is.
                parent = imported.rsplit(".", 1)[0]
                if parent in modules:
                    edges.add(parent)
            else:
                edges.add(imported.split(".")[0])
        graph[name] = edges
    return graph


def _reached(graph: dict[str, set[str]], start: str) -> dict[str, list[str]]:
    """Every module ``start`` reaches through imports, with one chain of imports that gets there."""
    chains = {start: [start]}
    queue = [start]
    while queue:
        current = queue.pop()
        for imported in sorted(graph.get(current, ())):
            if imported not in chains:
                chains[imported] = [*chains[current], imported]
                queue.append(imported)
    return chains


# Part -> what no module of it may reach, through any chain of imports (sparkafka modules by name
# prefix, third-party packages by their top-level name).
FORBIDDEN_REACH = {
    # The broker stands alone: no Spark, no connector, nothing of the tools.
    "sparkafka.broker": (
        "sparkafka.connector",
        "sparkafka.tools",
        "sparkafka.cli",
        "sparkafka.formats",
        "sparkafka.runtime",
        "pyspark",
        "pyarrow",
    ),
    # The connector reaches Kafka over the wire only.
    "sparkafka.connector": ("sparkafka.broker", "sparkafka.tools", "sparkafka.cli"),
    "sparkafka.formats": ("sparkafka.broker", "sparkafka.tools", "sparkafka.cli"),
    # The runtime's session registers the connector (through the package), nothing more.
    "sparkafka.runtime": ("sparkafka.broker", "sparkafka.tools", "sparkafka.cli"),
    "pyspark_sparkafka": ("sparkafka.broker", "sparkafka.tools", "sparkafka.cli"),
    # The executors' read of an offset range plans nothing: the driver's planning stays there.
    "sparkafka.connector.source.reader": (
        "sparkafka.connector.source.ranges",
        "sparkafka.connector.source.resolver",
        "sparkafka.connector.source.planning",
        "sparkafka.connector.source.stream",
        "sparkafka.connector.source.batch",
    ),
}


def _matches(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == prefix or name.startswith(prefix + ".") for prefix in prefixes)


@pytest.mark.parametrize("part", sorted(FORBIDDEN_REACH))
def test_no_part_reaches_what_it_must_not_through_any_chain_of_imports(part: str) -> None:
    graph = _graph()
    offences = []
    for module in sorted(name for name in graph if _matches(name, (part,))):
        for reached, chain in sorted(_reached(graph, module).items()):
            if _matches(reached, FORBIDDEN_REACH[part]):
                offences.append(" -> ".join(chain))
    assert not offences, "\n".join(offences[:20])


def test_the_contract_follows_chains_importlib_names_and_package_forms() -> None:
    """A chain through an allowed module still counts; a module named to importlib counts; and
    ``from sparkafka import errors`` names sparkafka.errors, not the whole package."""
    source = (
        "import importlib\nfrom sparkafka import errors\nimportlib.import_module('sparkafka.broker.server')\n"
    )
    found = _imports(
        source,
        "sparkafka.connector.probe",
        is_package=False,
    )
    assert {"sparkafka.errors", "sparkafka.broker.server"} <= found
    graph = {"a": {"b"}, "b": {"sparkafka.broker.log"}, "sparkafka.broker.log": set()}
    assert _reached(graph, "a")["sparkafka.broker.log"] == ["a", "b", "sparkafka.broker.log"]
    relative = _imports("from . import options\n", "sparkafka.connector.sink", is_package=True)
    assert "sparkafka.connector.sink.options" in relative


# What lies outside the connector reaches it through its doors only: the tools, the command line and
# the package root through connector/api.py; Spark through the data source; the public alias of the
# event-time helpers through the module it names. Part -> (modules of the part, doors).
CONNECTOR_DOORS = {
    "sparkafka.tools": ("sparkafka.connector.api",),
    "sparkafka.cli": ("sparkafka.connector.api",),
    "the package root": (
        "sparkafka.connector.api",
        "sparkafka.connector.datasource",
        "sparkafka.connector.eventtime",
    ),
    "pyspark_sparkafka": ("sparkafka.connector.datasource",),
}


def _modules_of(part: str) -> list[tuple[str, Path]]:
    if part == "the package root":
        paths = sorted(PACKAGE.glob("*.py"))
    elif part == "pyspark_sparkafka":
        paths = sorted((SOURCE_ROOT / part).rglob("*.py"))
    else:
        paths = sorted((SOURCE_ROOT / part.replace(".", "/")).rglob("*.py"))
    return [(_module_name(path), path) for path in paths]


def _through_other_doors(source: str, module: str, is_package: bool, doors: tuple[str, ...]) -> list[str]:
    """The connector modules ``source`` imports that are none of ``doors``."""
    return sorted(
        name
        for name in _imports(source, module, is_package)
        if name.startswith("sparkafka.connector.") and not _matches(name, doors)
    )


@pytest.mark.parametrize("part", sorted(CONNECTOR_DOORS))
def test_the_tools_cli_and_package_root_reach_the_connector_through_its_doors_only(part: str) -> None:
    offences = [
        f"{module} imports {name}"
        for module, path in _modules_of(part)
        for name in _through_other_doors(
            path.read_text(), module, path.name == "__init__.py", CONNECTOR_DOORS[part]
        )
    ]
    assert _modules_of(part), f"no modules found for {part}"
    assert not offences, "\n".join(offences)


def test_the_door_rule_sees_a_private_module_however_it_is_imported() -> None:
    doors = CONNECTOR_DOORS["sparkafka.tools"]
    for source in (
        "from sparkafka.connector.sink.options import SinkOptions\n",
        "from sparkafka.connector.sink import options\n",
        "def late():\n    import sparkafka.connector.kafka_admin\n",
        "import importlib\nimportlib.import_module('sparkafka.connector.source.offsets')\n",
    ):
        assert _through_other_doors(source, "sparkafka.tools.probe", False, doors), source
    allowed = "from sparkafka.connector.api import SinkOptions\nfrom sparkafka.connector import api\n"
    assert _through_other_doors(allowed, "sparkafka.tools.probe", False, doors) == []


def test_every_name_of_the_connectors_door_is_found_where_it_says() -> None:
    from sparkafka.connector import api

    assert sorted(api.__all__) == sorted(api._WHERE)
    for name in api.__all__:
        assert getattr(api, name) is not None, name


# Pairs of modules that import each other, each half inside a function, for a reason the import
# graph cannot see: the launcher Spark starts for every Python worker hands over to the zygote only
# when one serves (importing it always would cost every worker its start-up), and the class archive
# is built by starting a session while a session maps the archive it finds.
ALLOWED_LAZY_CIRCLES = (
    frozenset({"sparkafka.runtime.python_exec", "sparkafka.runtime.runner_zygote"}),
    frozenset({"sparkafka.runtime.class_archive", "sparkafka.runtime.session"}),
)


def _runtime_imports(source: str, module: str, is_package: bool, modules: set[str]) -> set[str]:
    """The modules of ``modules`` that ``source`` imports when it runs: anywhere but under ``if
    TYPE_CHECKING:`` (what the type checker alone reads). ``from package import module`` names the
    module, not the package (as :func:`_sparkafka_imports` judges it)."""
    tree = ast.parse(source, module)
    skipped = {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for inner in ast.walk(node)
    }
    found = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            name = _from_module(node, module, is_package)
            submodules = {f"{name}.{alias.name}" for alias in node.names} & modules
            found |= submodules or {name}
    return {name for name in found if name in modules and name != module}


def _circles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            edge = next(edges, None)
            if edge is not None:
                if edge not in index:
                    index[edge] = low[edge] = len(index)
                    stack.append(edge)
                    on_stack.add(edge)
                    work.append((edge, iter(sorted(graph[edge]))))
                elif edge in on_stack:
                    low[node] = min(low[node], index[edge])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.add(member)
                    if member == node:
                        break
                if len(group) > 1:
                    found.append(group)
    return found


def test_no_modules_import_each_other_in_a_circle() -> None:
    paths = sorted([*PACKAGE.rglob("*.py"), *(SOURCE_ROOT / "pyspark_sparkafka").rglob("*.py")])
    modules = {_module_name(path): path for path in paths}
    graph = {
        name: _runtime_imports(path.read_text(), name, path.name == "__init__.py", set(modules))
        for name, path in modules.items()
    }
    circles = [group for group in _circles(graph) if frozenset(group) not in ALLOWED_LAZY_CIRCLES]
    assert not circles, "modules importing each other: " + "; ".join(" <-> ".join(sorted(c)) for c in circles)


def test_the_circle_rule_sees_a_circle_and_not_what_only_the_type_checker_reads() -> None:
    modules = {"p.a", "p.b", "p.c"}
    a = _runtime_imports("from p import b\n", "p.a", False, modules)
    b = _runtime_imports("def late():\n    from p.a import thing\n", "p.b", False, modules)
    c = _runtime_imports(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from p import a\n", "p.c", False, modules
    )
    assert (a, b, c) == ({"p.b"}, {"p.a"}, set())
    assert _circles({"p.a": a, "p.b": b, "p.c": c | {"p.a"}}) == [{"p.a", "p.b"}]


# A function a screen holds: longer ones in the connector are split into steps that are named.
LONGEST_CONNECTOR_FUNCTION = 60


def _body_lines(function: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Lines of ``function``'s body after its docstring."""
    first = function.body[0]
    is_docstring = isinstance(first, ast.Expr) and isinstance(getattr(first, "value", None), ast.Constant)
    start = first.end_lineno + 1 if is_docstring and first.end_lineno is not None else first.lineno
    return (function.end_lineno or start) - start + 1


def test_no_connector_function_is_longer_than_a_screen() -> None:
    too_long = []
    for path in sorted((PACKAGE / "connector").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (
                isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
                and (lines := _body_lines(node)) > LONGEST_CONNECTOR_FUNCTION
            ):
                too_long.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {node.name} ({lines} lines)")
    assert too_long == []


# A class a reader can keep in mind: at most this many fields that change after construction.
MOST_MUTABLE_CONNECTOR_FIELDS = 10


def _mutable_fields(cls: ast.ClassDef) -> set[str]:
    """The fields of ``cls`` that may change once it is built: every ``self.<name>`` assigned in its
    methods but one annotated ``Final``, and a dataclass's fields unless it is frozen."""

    def unchangeable(annotation: ast.expr | None) -> bool:
        return annotation is not None and ast.unparse(annotation).split("[")[0].endswith(
            ("Final", "ClassVar")
        )

    decorators = [d for d in cls.decorator_list if ast.unparse(d).split("(")[0].endswith("dataclass")]
    frozen = any(
        isinstance(d, ast.Call)
        and any(k.arg == "frozen" and ast.unparse(k.value) == "True" for k in d.keywords)
        for d in decorators
    )
    fields: set[str] = set()
    if decorators and not frozen:
        fields |= {
            statement.target.id
            for statement in cls.body
            if isinstance(statement, ast.AnnAssign)
            and isinstance(statement.target, ast.Name)
            and not unchangeable(statement.annotation)
        }
    final: set[str] = set()
    for node in ast.walk(cls):
        targets = node.targets if isinstance(node, ast.Assign) else []
        if isinstance(node, ast.AnnAssign | ast.AugAssign):
            targets = [node.target]
        for target in targets:
            for name in ast.walk(target):
                if (
                    isinstance(name, ast.Attribute)
                    and isinstance(name.value, ast.Name)
                    and name.value.id == "self"
                ):
                    is_final = isinstance(node, ast.AnnAssign) and unchangeable(node.annotation)
                    (final if is_final else fields).add(name.attr)
    return fields - final


def test_no_connector_class_keeps_more_mutable_fields_than_a_reader_can_follow() -> None:
    crowded = []
    for path in sorted((PACKAGE / "connector").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (
                isinstance(node, ast.ClassDef)
                and len(fields := _mutable_fields(node)) > MOST_MUTABLE_CONNECTOR_FIELDS
            ):
                crowded.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {node.name} {sorted(fields)}")
    assert crowded == []


def test_the_field_rule_counts_what_can_change_and_not_what_cannot() -> None:
    source = """
@dataclass(frozen=True)
class Message:
    a: int
@dataclass
class Record:
    a: int
    b: ClassVar[int] = 0
class Reader:
    def __init__(self):
        self.options: Final = 1
        self.position = 0
    def step(self):
        self.position += 1
        self.cache, self.seen = {}, set()
"""
    classes = {node.name: node for node in ast.walk(ast.parse(source)) if isinstance(node, ast.ClassDef)}
    assert _mutable_fields(classes["Message"]) == set()
    assert _mutable_fields(classes["Record"]) == {"a"}
    assert _mutable_fields(classes["Reader"]) == {"position", "cache", "seen"}


def test_the_connectors_door_refuses_a_name_it_does_not_have() -> None:
    from sparkafka.connector import api

    with pytest.raises(AttributeError, match=r"'sparkafka\.connector\.api' has no attribute 'SinkWriter'"):
        api.SinkWriter  # noqa: B018 - the attribute access is the test


# The embedded broker's shape (issue "the broker along Kafka's seams"): a module a reader can hold.
BROKER_MODULE_MAX_LINES = 800
BROKER_CLASS_MAX_LINES = 600


def test_no_broker_module_or_class_outgrows_what_a_reader_can_hold() -> None:
    too_long = []
    for path in sorted((PACKAGE / "broker").rglob("*.py")):
        text = path.read_text()
        lines = len(text.splitlines())
        if lines > BROKER_MODULE_MAX_LINES:
            too_long.append(f"{path.relative_to(PACKAGE)}: {lines} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef) and node.end_lineno is not None:
                length = node.end_lineno - node.lineno + 1
                if length > BROKER_CLASS_MAX_LINES:
                    too_long.append(f"{path.relative_to(PACKAGE)}: class {node.name}, {length} lines")
    assert not too_long, "; ".join(too_long)
