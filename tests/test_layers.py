"""The import layers of ARCHITECTURE.md, checked on the source: no upward import, no circle.

Every module of monkey/ is parsed with `ast`; every import statement counts: top-level,
function-local (lazy) and type-only (under ``if TYPE_CHECKING:``: naming a class in an
annotation depends on it as much as calling it does). Modules loaded by name from a table
(the drivers' lazy table) are not seen; it points down.

Units: a folder of monkey/ (``store``, ``drivers``...) or a top-level module (``api``,
``rerun``...). (a) A unit imports only from units of a lower layer (``LAYERS``); (b) no circle
between units, nor between the modules of one folder, except the circles in ``ALLOWED``;
(c) no module is over 800 lines.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "monkey"

# unit -> (layer, why there): a unit may import units of a strictly lower layer (a higher
# number) and nothing above or beside it. Top first, as in ARCHITECTURE.md:
# shell, tui -> api -> core, tracking -> drivers, storage, snapshot -> store, config -> models.
LAYERS: dict[str, tuple[int, str]] = {
    "__main__": (0, "entry point: `python -m monkey` runs the shell"),
    "monkey": (0, "the package itself: the public API, loading Monkey etc. lazily on use"),
    "shell": (1, "the cmd2 REPL and one-shot commands"),
    "tui": (1, "the Textual dashboard"),
    "server": (1, "`monkey server`: the main node's HTTPS API, one more client of the facade"),
    "api": (3, "the Monkey facade, the one door for the UIs and scripts"),
    "remote": (4, "a main node's client: RemoteMonkey (what Monkey(remote=...) makes), its codec"),
    "contract": (5, "the API's contract: each facade method declared once, for every side"),
    "rerun": (5, "`monkey rerun`, clone, cat: a part of the facade Monkey delegates to"),
    "facade": (5, "sweeps, metrics, reports, exports: the parts Monkey delegates to"),
    "submit": (6, "the one submission path (run, sweep, rerun); it wakes the core"),
    "handles": (6, "the Job handle the facade returns; its wait keeps a core up"),
    "housekeeping": (6, "gc/rm/du/verify of blobs and run folders, for the facade's Disk part"),
    "host_cleanup": (6, "rm/gc/du on SSH hosts and buckets, for the facade's Disk part"),
    "core": (7, "the daemon: the only caller of drivers"),
    "tracking": (8, "metrics, sweeps, compare: the core ingests metrics and steps sweeps with it"),
    "drivers": (9, "one module per provider kind"),
    "jobspec": (9, "job.yml: read by the facade, its files stored as blobs"),
    "storage": (10, "where blobs and results live; the cloud drivers move blobs through it"),
    "images": (10, "OCI image references, their digests and registry logins (job.yml names one)"),
    "snapshot": (11, "code snapshots, datasets and git provenance, over the blob store"),
    "search": (11, "the full-text search index of jobs, over the store"),
    "store": (12, "the only place with SQL"),
    "config": (13, "MONKEY_HOME and providers.yml"),
    "environments": (13, "job environments (venv, conda...): their rules and set-up fields"),
    "logfiles": (13, "reading run logs by byte offset"),
    "version": (13, "the package version and the code digest"),
    "sizes": (13, "sizes of files and folders on disk, and what deleting one freed"),
    "specrecord": (13, "a job spec's shape: checked strictly when sent, read tolerantly"),
    "params": (7, "the parameters a command gives: a run's params, where rerun --set writes"),
    "delegation": (13, "how Monkey delegates to its parts, each loaded on first use"),
    "models": (14, "dataclasses and enums, no I/O"),
    "client_agent": (
        14,
        "the worker agent: stdlib only, imports nothing of monkey; "
        "the in-job API (monkey.log...) is its track module",
    ),
}

# Circles kept, each with its reason.
# A circle found is allowed when all its nodes are in one entry (units, or modules of one
# folder). The upward imports that make them are in ALLOWED_UPWARD.
ALLOWED: set[frozenset[str]] = {
    # the REPL is built on the one-shot command table (cli.PARSERS), and `monkey` with no
    # arguments starts it from cli.main, the console script's entry point, which installs made
    # before must keep finding (a `git pull` in an editable checkout does not rewrite it)
    frozenset({"shell.cli", "shell.repl"}),
}

ALLOWED_UPWARD: dict[tuple[str, str], str] = {}

# Imports across layers that stay by design, each with its reason.
EXCEPTIONS: dict[tuple[str, str], str] = {
    ("shell", "tui"): "`monkey dash` starts the dashboard (shell/dash_commands.py)",
    ("shell", "server"): "`monkey server` runs it (shell/server_commands.py)",
}

# `from monkey import __version__` loads nothing: the constant is defined before any import.
ROOT_CONSTANTS = {"__version__"}


def _modules() -> dict[str, Path]:
    """Dotted names relative to monkey ("store.db", "api"; "" for monkey itself) -> file."""
    out = {}
    for path in ROOT.rglob("*.py"):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _imported(
    node: ast.Import | ast.ImportFrom, name: str, is_package: bool, modules: dict[str, Path]
) -> Iterable[str]:
    """The modules of monkey (relative dotted names) an import statement of NAME loads."""
    if isinstance(node, ast.Import):
        targets = [a.name for a in node.names]
    else:
        base = node.module or ""
        if node.level:  # relative: from the package holding NAME
            package = ("monkey." + name if name else "monkey").split(".")
            if not is_package:
                package.pop()
            package = package[: len(package) - node.level + 1]
            base = ".".join(package + ([base] if base else []))
        targets = []
        for alias in node.names:
            full = f"{base}.{alias.name}"
            rel = full.removeprefix("monkey.") if full.startswith("monkey.") else None
            if rel is not None and rel in modules:
                targets.append(full)  # `from monkey.x import module`
            elif base == "monkey" and alias.name in ROOT_CONSTANTS:
                continue
            else:
                targets.append(base)
    for target in targets:
        if target != "monkey" and not target.startswith("monkey."):
            continue
        rel = target.removeprefix("monkey").removeprefix(".")
        while rel not in modules:  # `monkey.x.Name` imported as a module path
            rel = rel.rpartition(".")[0]
        yield rel


def import_graph() -> dict[str, set[str]]:
    """Module -> the modules of monkey it imports."""
    modules = _modules()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                graph[name].update(
                    t
                    for t in _imported(node, name, path.name == "__init__.py", modules)
                    if t != name
                )
    return graph


def unit(module: str) -> str:
    return module.split(".")[0] if module else "monkey"


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """Each import breaking LAYERS, as "module -> module (unit layer -> unit layer)"."""
    out = []
    for source, targets in sorted(graph.items()):
        for target in sorted(targets):
            a, b = unit(source), unit(target)
            if a == b or (a, b) in EXCEPTIONS or (a, b) in ALLOWED_UPWARD:
                continue
            if LAYERS[b][0] <= LAYERS[a][0]:
                out.append(
                    f"monkey.{source} imports monkey.{target} "
                    f"({a} is layer {LAYERS[a][0]}, {b} layer {LAYERS[b][0]})"
                )
    return out


def circles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """Strongly connected components of more than one node: between units, and between the
    modules of each folder."""
    units: dict[str, set[str]] = defaultdict(set)
    inside: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    for source, targets in graph.items():
        units[unit(source)]
        for target in targets:
            if unit(source) != unit(target):
                if (unit(source), unit(target)) not in EXCEPTIONS:
                    units[unit(source)].add(unit(target))
            elif "." in source and "." in target:  # two modules of one folder
                inside[unit(source)][source].add(target)
    found = _components(units)
    for folder in inside.values():
        found += _components(folder)
    return found


def _components(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """Tarjan's strongly connected components of size > 1."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[frozenset[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(frozenset(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_every_unit_has_a_layer() -> None:
    missing = sorted({unit(m) for m in _modules()} - set(LAYERS))
    assert not missing, f"give {missing} a layer (and a reason) in LAYERS"


def test_no_module_imports_upward() -> None:
    assert upward_imports(import_graph()) == []


def test_nothing_imports_the_user_interfaces() -> None:
    graph = import_graph()
    found = [
        f"monkey.{s} imports monkey.{t}"
        for s, ts in sorted(graph.items())
        for t in sorted(ts)
        if unit(t) in ("shell", "tui")
        and unit(s) not in ("__main__", unit(t))
        and (unit(s), unit(t)) not in EXCEPTIONS
    ]
    assert found == []


def test_the_agent_imports_nothing_of_monkey() -> None:
    graph = import_graph()
    found = [
        f"monkey.{s} imports monkey.{t}"
        for s, ts in sorted(graph.items())
        for t in sorted(ts)
        if unit(s) == "client_agent" and unit(t) != "client_agent"
    ]
    assert found == []


def test_no_import_circle() -> None:
    found = [sorted(c) for c in circles(import_graph()) if not any(c <= a for a in ALLOWED)]
    assert found == []


def test_the_allowed_circles_still_exist() -> None:
    """An entry of ALLOWED or ALLOWED_UPWARD that is cut is removed, so that it cannot come
    back unseen."""
    graph = import_graph()
    found = circles(graph)
    gone = [sorted(a) for a in ALLOWED if not any(c <= a for c in found)]
    gone += [
        f"{a} -> {b}"
        for a, b in ALLOWED_UPWARD
        if not any(unit(s) == a and unit(d) == b for s, ds in graph.items() for d in ds)
    ]
    assert gone == []


def test_the_checks_see_an_upward_import_and_a_circle() -> None:
    graph = import_graph()
    graph["store.db"].add("api")  # a lazy import anywhere in store/db.py
    assert any(
        line.startswith("monkey.store.db imports monkey.api") for line in upward_imports(graph)
    )
    assert any({"api", "store"} <= c for c in circles(graph))
    graph = import_graph()
    graph["store.dashboard"].add("store.db")
    assert any({"store.dashboard", "store.db"} <= c for c in circles(graph))


MODULE_LINES_MAX = 800  # a module past this holds more than one idea: split it at a seam


def test_no_module_is_over_800_lines() -> None:
    """Small modules with names that say what they hold (issue 26)."""
    long = {
        str(path.relative_to(ROOT.parent)): n
        for path in sorted(ROOT.rglob("*.py"))
        if (n := len(path.read_text(encoding="utf-8").splitlines())) > MODULE_LINES_MAX
    }
    assert long == {}, f"split these modules at a seam: {long}"
