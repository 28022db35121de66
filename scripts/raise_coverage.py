r"""Every error path of sparkafka, and whether a test asserts it — and, with ``--run``, triggers it.

    .venv/bin/python scripts/raise_coverage.py                  # asserted, per package (fast)
    .venv/bin/python scripts/raise_coverage.py --list           # also list the sites no test asserts
    .venv/bin/python scripts/raise_coverage.py --run            # also run the suite under coverage
    .venv/bin/python scripts/raise_coverage.py --run -- tests/unit   # with other pytest arguments

An error path is a ``raise`` of an exception anywhere in src/sparkafka — broker, connector, cli,
tools, formats — which covers the command line's error exits too (``typer.Exit(n)`` with n != 0,
``typer.BadParameter``). Not counted: a bare ``raise`` (re-raising what was caught), ``typer.Exit()``
with code 0, and exceptions of private classes (``_Name``), which the code raises to catch itself.

A site is **asserted** when the tests' source holds what identifies its failure:

* a piece of its message: a string constant of at least MIN_FRAGMENT characters from the raise
  itself, from the assignments to the variable it raises with in its function, or from the body of
  the helper function of its own module it calls for the message (regular-expression escapes in the
  tests are undone first, so ``match=r"timeout\.ms"`` counts);
* or its exception class, where at most SPECIFIC_CLASS_SITES sites raise that class;
* or, for the broker's ``BrokerError(ErrorCode.X, ...)``, the error code X (what a client sees).

With ``--run`` the tests run under coverage.py, with every Python process they start measured too:
pytest's workers, `sparkafka run` pipelines, and Spark's own Python processes (the driver-side data
source workers and the executors' workers, which Spark forks and ends with os._exit, SIGHUP or
SIGTERM: see SAVE_ON_SIGNAL). A site is **triggered** when its line ran; the report then counts the
sites both triggered and asserted.

Exits 1 when the asserted share of all sites is below ``--target`` percent, or of connector/sink
below ``--sink-target`` (with ``--run``: the triggered-and-asserted share).
"""

from __future__ import annotations

import argparse
import ast
import os
import re
import subprocess
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[1]
SOURCES = REPOSITORY / "src" / "sparkafka"
TESTS = REPOSITORY / "tests"
# As scripts/check shares the suite between its workers.
PYTEST_OPTIONS = ["-n", "3", "--schedule-by-cost", "-q", "-p", "no:cacheprovider"]
MIN_FRAGMENT = 12
MIN_ASSERTION = 15
SPECIFIC_CLASS_SITES = 2
SUCCESS_EXITS = {"typer.Exit()", "typer.Exit(0)", "typer.Exit(code=0)"}


@dataclass(frozen=True)
class RaiseSite:
    path: Path
    line: int
    text: str  # the raise statement's first line, for the listing
    exception: str  # the class raised (its last dotted name), or the expression raised
    fragments: frozenset[str] = field(default=frozenset())
    error_code: str | None = None

    @property
    def package(self) -> str:
        parts = self.path.relative_to(SOURCES).parts
        if parts[0] == "connector" and len(parts) > 2:
            return f"connector/{parts[1]}"
        return parts[0] if len(parts) > 1 else "(top)"


def _constants(node: ast.AST) -> list[str]:
    """The string constants under ``node``, an f-string's literal parts each on its own."""
    return [n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)]


def _fragments(texts: list[str]) -> frozenset[str]:
    """The literal pieces of a message: split where a value is put in, and at clause marks (a test
    asserts one clause, with the values of its case), each at least MIN_FRAGMENT characters."""
    pieces = set()
    for text in texts:
        for piece in re.split(r"\n|\{[^}]*\}|[,;:.] ", text):
            piece = piece.strip(" \n:;,.()'\"")
            if len(piece) >= MIN_FRAGMENT:
                pieces.add(piece)
    return frozenset(pieces)


class _Sites(ast.NodeVisitor):
    """Collects the raise sites of one module, with the text their messages are made of."""

    def __init__(self, path: Path, source: str, functions: dict[str, list[ast.AST]]) -> None:
        self.path = path
        self.lines = source.splitlines()
        self.functions = functions
        self.scope: list[ast.AST] = []
        self.sites: list[RaiseSite] = []

    def visit_Module(self, node: ast.Module) -> None:
        self.scope.append(node)
        self.generic_visit(node)

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self.scope.append(node)
        self.generic_visit(node)
        self.scope.pop()

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Raise(self, node: ast.Raise) -> None:
        if node.exc is None or ast.unparse(node.exc) in SUCCESS_EXITS:
            return
        called = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
        exception = ast.unparse(called).rsplit(".", 1)[-1]
        if exception.startswith("_") and exception[1:2].isupper():
            return  # a private exception class, raised to be caught in the module itself
        code = None
        if exception == "BrokerError" and isinstance(node.exc, ast.Call) and node.exc.args:
            code = ast.unparse(node.exc.args[0]).rsplit(".", 1)[-1]
        self.sites.append(
            RaiseSite(
                self.path,
                node.lineno,
                self.lines[node.lineno - 1].strip(),
                exception,
                _fragments(self._texts(node.exc, depth=2) + self._said_before(node)),
                code,
            )
        )

    def _said_before(self, node: ast.Raise) -> list[str]:
        """What the statements before ``node`` in its block print or log: an exit such as
        ``typer.Exit(1)`` carries no text, the message went out just before it."""
        fields = ("body", "orelse", "handlers", "finalbody")
        for block in ast.walk(self.scope[-1]):
            for statements in (getattr(block, name, None) for name in fields):
                if isinstance(statements, list) and node in statements:
                    # Only what is printed or logged: a loop or branch before an exit says nothing of it.
                    said = [
                        statement
                        for statement in statements[: statements.index(node)]
                        if isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Call)
                    ]
                    return [text for statement in said for text in self._texts(statement, depth=1)]
        return []

    def _texts(self, expression: ast.AST, depth: int) -> list[str]:
        """The string constants ``expression`` is made of: its own, those assigned to the names it
        uses in the enclosing function, and those of the helper functions it calls (any module of
        sparkafka: the message may be built elsewhere), ``depth`` calls deep."""
        texts = _constants(expression)
        if depth == 0:
            return texts
        for name in {n.id for n in ast.walk(expression) if isinstance(n, ast.Name)}:
            for value in self._assigned(name):
                texts += self._texts(value, depth - 1)
        for call in (n for n in ast.walk(expression) if isinstance(n, ast.Call)):
            for helper in self.functions.get(ast.unparse(call.func).rsplit(".", 1)[-1], []):
                texts += _constants(helper)
                for inner in (n for n in ast.walk(helper) if isinstance(n, ast.Call)):
                    if depth > 1:
                        for deeper in self.functions.get(ast.unparse(inner.func).rsplit(".", 1)[-1], []):
                            texts += _constants(deeper)
        return texts

    def _assigned(self, name: str) -> list[ast.AST]:
        """What is assigned to ``name`` in the function being visited."""
        values: list[ast.AST] = []
        for node in ast.walk(self.scope[-1]):
            if isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                if any(isinstance(t, ast.Name) and t.id == name for t in targets) and node.value is not None:
                    values.append(node.value)
        return values


def raise_sites(root: Path) -> list[RaiseSite]:
    """Every error path under ``root`` (see the module's docstring), by file and line."""
    modules = {path: path.read_text() for path in sorted(root.rglob("*.py"))}
    trees = {path: ast.parse(source, str(path)) for path, source in modules.items()}
    functions: dict[str, list[ast.AST]] = {}
    for tree in trees.values():
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                functions.setdefault(node.name, []).append(node)
    sites = []
    for path, tree in trees.items():
        collector = _Sites(path, modules[path], functions)
        collector.visit(tree)
        sites += collector.sites
    return sorted(sites, key=lambda s: (str(s.path), s.line))


def test_corpus(root: Path) -> str:
    """The string constants of every test module, docstrings left out (they describe, they do not
    assert), one per line, each also with its regular-expression escapes undone."""
    constants = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        documentation = {
            id(node.value)
            for node in ast.walk(tree)
            if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
        }
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                if id(node) in documentation:
                    continue
                constants.append(node.value)
                constants.append(re.sub(r"\\(.)", r"\1", node.value))
    return "\n".join(constants)


def asserted(sites: list[RaiseSite], corpus: str, code: str) -> set[RaiseSite]:
    """The sites whose failure a test identifies (see the module's docstring)."""
    per_class = Counter(site.exception for site in sites)
    # What a test asserts may be a shorter clause than a fragment, or a pattern with wildcards
    # between clauses: each literal run of at least MIN_ASSERTION characters counts too.
    assertions = {
        piece.strip()
        for line in corpus.splitlines()
        for piece in re.split(r"\.[*+]\??|\\[dsSwW][+*]?|[()|^$]", line)
        if len(piece.strip()) >= MIN_ASSERTION
    }
    found = set()
    for site in sites:
        by_text = any(fragment in corpus for fragment in site.fragments) or any(
            assertion in fragment for fragment in site.fragments for assertion in assertions
        )
        by_class = per_class[site.exception] <= SPECIFIC_CLASS_SITES and bool(
            re.search(rf"\b{re.escape(site.exception)}\b", code)
        )
        by_code = site.error_code is not None and bool(re.search(rf"\b{re.escape(site.error_code)}\b", code))
        if by_text or by_class or by_code:
            found.add(site)
    return found


# Imported at start-up by every Python process of the run (its directory goes first on PYTHONPATH,
# which Spark passes on to its Python processes). Spark ends the workers it keeps for reuse with
# SIGHUP or SIGTERM, whose default action kills a process before coverage.py saves what it measured
# (the driver-side commit of a streaming write runs in such a worker): with this, a process about to
# die of either signal saves first, then dies of it as it would have.
SAVE_ON_SIGNAL = """\
import os
import signal

if os.environ.get("COVERAGE_PROCESS_CONFIG") or os.environ.get("COVERAGE_PROCESS_START"):
    _install = signal.signal

    def _save_then_die(signum, frame):
        try:
            import coverage

            current = coverage.Coverage.current()
            if current is not None:
                current.stop()
                current.save()
        finally:
            _install(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)

    def _signal(signum, handler):
        if signum in (signal.SIGHUP, signal.SIGTERM) and handler == signal.SIG_DFL:
            handler = _save_then_die
        return _install(signum, handler)

    signal.signal = _signal
    for _signum in (signal.SIGHUP, signal.SIGTERM):
        if signal.getsignal(_signum) == signal.SIG_DFL:
            _install(_signum, _save_then_die)
"""


def executed_lines(pytest_args: list[str], work: Path) -> dict[str, set[int]]:
    """Run pytest under coverage, every Python subprocess measured; the lines run, per file."""
    from coverage import CoverageData

    rcfile = work / "coveragerc"
    rcfile.write_text(
        "[run]\n"
        f"source = {SOURCES}\n"
        "parallel = true\n"
        f"data_file = {work / '.coverage'}\n"
        # Spark forks its Python workers from a daemon and ends them with os._exit.
        "patch = subprocess, fork, _exit, execv\n"
    )
    command = [sys.executable, "-m", "coverage", "run", f"--rcfile={rcfile}", "-m", "pytest", *pytest_args]
    print("running:", " ".join(command), flush=True)
    hooks = work / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(SAVE_ON_SIGNAL)
    inherited = os.environ.get("PYTHONPATH")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(hooks), *([inherited] if inherited else [])])}
    tests = subprocess.run(command, cwd=REPOSITORY, check=False, env=env)
    if tests.returncode != 0:
        print("some tests failed: a raise only a failed test would have reached is counted as missed")
    combine = [sys.executable, "-m", "coverage", "combine", f"--rcfile={rcfile}", "--quiet"]
    subprocess.run(combine, cwd=REPOSITORY, check=True)
    data = CoverageData(basename=str(work / ".coverage"))
    data.read()
    return {str(Path(name).resolve()): set(data.lines(name) or ()) for name in data.measured_files()}


def _share(part: int, whole: int) -> float:
    return 100.0 * part / whole if whole else 100.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--list", action="store_true", help="list the sites no test asserts (or triggers)")
    parser.add_argument("--run", action="store_true", help="run the tests under coverage too (slow)")
    parser.add_argument("--target", type=float, default=90.0, help="percent of all sites to reach [90]")
    parser.add_argument("--sink-target", type=float, default=100.0, help="percent of connector/sink [100]")
    parser.add_argument("pytest_args", nargs="*", help="after --: pytest arguments for --run")
    args = parser.parse_args()
    sites = raise_sites(SOURCES)
    code = "\n".join(path.read_text() for path in sorted(TESTS.rglob("*.py")))
    good = asserted(sites, test_corpus(TESTS), code)
    if args.run:
        with tempfile.TemporaryDirectory(prefix="raise-coverage-") as scratch:
            ran = executed_lines(args.pytest_args or ["tests", *PYTEST_OPTIONS], Path(scratch))
        good = {site for site in good if site.line in ran.get(str(site.path.resolve()), set())}
    what = "triggered and asserted" if args.run else "asserted"
    packages = sorted({site.package for site in sites})
    print(f"error paths {what} by a test, per package:")
    for package in packages:
        total = sum(1 for site in sites if site.package == package)
        done = sum(1 for site in good if site.package == package)
        print(f"  {package:<22} {done:>4} of {total:<4} ({_share(done, total):5.1f} %)")
    overall = _share(len(good), len(sites))
    print(f"  {'all':<22} {len(good):>4} of {len(sites):<4} ({overall:5.1f} %)")
    if args.list:
        for site in sites:
            if site not in good:
                print(f"  not {what}: {site.path.relative_to(REPOSITORY)}:{site.line}: {site.text}")
    sink = [site for site in sites if site.package == "connector/sink"]
    sink_share = _share(sum(1 for site in sink if site in good), len(sink))
    return 0 if overall >= args.target and sink_share >= args.sink_target else 1


if __name__ == "__main__":
    sys.exit(main())
