"""The house rules a reader can check: folders of one part each, imports pointing down, modules of
one idea, no import cycles.

* ``pipeline/`` is folders only (``LAYERS``), installed as ``runwire`` with ``workers/`` as
  ``runwire.workers``; a module imports only from its own folder and the folders below it, and the
  root package ``runwire`` loads only the core when imported (its other names load lazily), so an
  ``__init__`` can't pull a part above it into every import.

* A module under ``pipeline/`` or ``workers/`` stays under ~400 lines
  (``MAX_LINES``), or says why not in its docstring, in a paragraph starting
  ``Longer than ~400 lines`` (or ``Just over ~400 lines``).
* No import cycle. Two checks, because each misses what the other sees: every
  module is imported on its own (what a user's first import does — a cycle of
  top-level imports fails there), and the static import graph, imports inside
  functions and ``TYPE_CHECKING`` blocks included, has no cycle (an import
  moved into a function hides a cycle from the first check without removing
  it). Plugin tables of ``"module:Class"`` strings load backends by URL scheme
  on purpose; they are not imports.
* An event type's name is written once, as its Struct's tag: the protocols read it
  (``TextDelta.type_name``) rather than spell it.
* bench/ (which no test runs) imports only names ``runwire`` has.
"""

from __future__ import annotations

import ast
import io
import re
import subprocess
import sys
import textwrap
import tokenize
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("pipeline", "workers")
MAX_LINES = 420
"""~400: a module a few lines over is not worth a split or a paragraph."""
REASON = re.compile(r"^(Longer than|Just over) ~400 lines")
PENDING_SPLITS: dict[str, str] = {}
"""Modules known to hold two ideas, each with the split it wants. The list only shrinks:
a module on it that is no longer too long fails the test until it is taken off."""


def sources() -> Iterator[Path]:
    for package in PACKAGES:
        yield from sorted((ROOT / package).rglob("*.py"))


IMPORT_NAMES = {"pipeline": ("runwire",), "workers": ("runwire", "workers")}
"""Each folder's import name: both install under ``runwire`` (pyproject's package-dir)."""


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join([*IMPORT_NAMES[parts[0]], *parts[1:]])


MODULES = {module_name(path): path for path in sources()}


# ---- length -------------------------------------------------------------------------------


def too_long() -> dict[str, int]:
    """Modules over the limit whose docstring does not say why (relative path → lines)."""
    found = {}
    for path in MODULES.values():
        text = path.read_text()
        lines = text.count("\n")
        docstring = ast.get_docstring(ast.parse(text)) or ""
        if lines > MAX_LINES and not any(REASON.match(line.strip()) for line in docstring.splitlines()):
            found[str(path.relative_to(ROOT))] = lines
    return found


def test_long_modules_say_why() -> None:
    unexplained = {path: lines for path, lines in too_long().items() if path not in PENDING_SPLITS}
    assert not unexplained, (
        "split these by idea, or say why one idea needs more than ~400 lines in the module docstring, "
        "in a paragraph starting 'Longer than ~400 lines' (CONTRIBUTING.md):\n"
        + "\n".join(f"{path}: {lines} lines" for path, lines in unexplained.items())
    )


def test_pending_splits_are_still_pending() -> None:
    done = set(PENDING_SPLITS) - set(too_long())
    assert not done, f"split or explained now: take them off PENDING_SPLITS: {sorted(done)}"


# ---- imports, one module at a time ------------------------------------------------------------

_IMPORT_EACH = textwrap.dedent(
    """
    import importlib, sys, traceback
    failures = []
    for name in sys.argv[1:]:
        for loaded in [m for m in sys.modules if m.split(".")[0] in {packages!r}]:
            del sys.modules[loaded]
        try:
            importlib.import_module(name)
        except BaseException:
            failures.append(name + ":\\n" + traceback.format_exc(limit=-3))
    print("\\n".join(failures))
    sys.exit(1 if failures else 0)
    """
)


@pytest.mark.timeout(300)
def test_every_module_imports_on_its_own() -> None:
    """Each module imported first, with no module of ours loaded before it."""
    script = _IMPORT_EACH.format(packages={"runwire"})
    done = subprocess.run(
        [sys.executable, "-c", script, *MODULES], cwd=ROOT, capture_output=True, text=True, timeout=300,
        check=False,
    )
    assert done.returncode == 0, f"modules that fail when imported first:\n{done.stdout}{done.stderr[-3000:]}"


# ---- imports, the static graph ------------------------------------------------------------------


def imports_of(name: str, path: Path) -> set[str]:
    """Modules of ours that ``name`` imports anywhere in its source."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            # ``from pkg import sub`` imports the submodule when there is one.
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base
                       for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in MODULES:  # ``import a.b.c`` names a.b.c itself
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * len(graph)))
    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_cycle_even_through_imports_inside_functions() -> None:
    graph = {name: imports_of(name, path) for name, path in MODULES.items()}
    found = cycles(graph)
    described = [" ↔ ".join(c) + "\n    " + "\n    ".join(
        f"{a} imports {', '.join(sorted(graph[a] & set(c)))}" for a in c) for c in found]
    assert not found, "import cycles (move what both sides need into a module below them):\n" + "\n".join(described)


def test_the_cycle_check_finds_a_cycle_hidden_in_a_function() -> None:
    graph = {"a": {"b"}, "b": set(), "c": {"a"}}
    assert cycles(graph) == []
    graph["b"] = {"c"}  # e.g. ``def f(): from c import x`` in b
    assert cycles(graph) == [["a", "b", "c"]]


# ---- folders and layers ---------------------------------------------------------------------------

LAYERS = {"core": 0, "protocols": 1, "bus": 1, "store": 1, "processing": 2, "webhooks": 2, "sdk": 3, "jobs": 4,
          "integrations": 5, "edge": 5,
          "workers": 6}
"""The folders of ``runwire``, bottom to top: a module imports from its own folder and lower layers."""


def folder_of(name: str) -> str:
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else ""


def test_the_library_is_its_folders_and_nothing_loose() -> None:
    loose = sorted(p.name for p in (ROOT / "pipeline").glob("*.py") if p.name != "__init__.py")
    folders = sorted(p.name for p in (ROOT / "pipeline").iterdir() if (p / "__init__.py").exists())
    assert not loose, f"modules at pipeline/'s top level belong in one of its folders: {loose}"
    assert folders == sorted(set(LAYERS) - {"workers"})


def test_imports_point_down() -> None:
    upward = []
    for name, path in MODULES.items():
        here = folder_of(name)
        if not here:
            continue
        for target in imports_of(name, path):
            there = folder_of(target)
            if there and there != here and LAYERS[there] >= LAYERS[here]:
                upward.append(f"{name} imports {target}")
    assert not upward, "imports that point up or sideways (move what both need below them):\n" + "\n".join(upward)


def test_the_root_package_loads_only_the_core() -> None:
    """``import runwire`` (and so every import of any part) runs only core modules."""
    tree = ast.parse((ROOT / "pipeline" / "__init__.py").read_text())
    eager = [node for node in tree.body if isinstance(node, ast.Import | ast.ImportFrom)]
    named = [node.module or "" for node in eager if isinstance(node, ast.ImportFrom) and node.level]
    assert named and all(module.split(".")[0] == "core" for module in named)
    done = subprocess.run([sys.executable, "-c", "import runwire, sys; print(sorted(m for m in sys.modules"
                           " if m.startswith('runwire.')))"], capture_output=True, text=True, check=True)
    assert all(folder_of(m) == "core" for m in eval(done.stdout))


def test_pyproject_installs_every_folder_under_runwire() -> None:
    import tomllib

    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    packages = sorted(name for name, path in MODULES.items() if path.name == "__init__.py")
    data = ["runwire.edge.static"]  # the page: files, no modules
    assert setuptools["package-dir"] == {"runwire": "pipeline", "runwire.workers": "workers"}
    assert sorted(setuptools["packages"]) == sorted([*packages, *data])


# ---- one name per event type ---------------------------------------------------------------


def test_an_event_types_name_is_written_once_as_its_structs_tag() -> None:
    """The protocols and the envelope read a canonical type's name from its class
    (``TextDelta.type_name``, the Struct's tag) rather than spelling it again, so a type's
    tables can't drift from its definition."""
    from runwire.core.envelope import EVENT_CLASSES

    spelled = []
    for path in [*sorted((ROOT / "pipeline" / "protocols").glob("*.py")), ROOT / "pipeline/core/envelope.py"]:
        for token in tokenize.generate_tokens(io.StringIO(path.read_text()).readline):
            if token.type == tokenize.STRING and token.string.strip("\"'") in EVENT_CLASSES:
                spelled.append(f"{path.relative_to(ROOT)}:{token.start[0]}: {token.string}")
    assert not spelled, "use the class's type_name:\n" + "\n".join(spelled)


# ---- bench/ ---------------------------------------------------------------------------------


def test_the_benchmarks_import_names_that_exist() -> None:
    """bench/ is not run by the tests, so a rename in ``runwire`` would break it unnoticed:
    every ``from runwire… import name`` in bench/ names a module or an attribute that exists."""
    import importlib
    import importlib.util

    missing = []
    for path in sorted((ROOT / "bench").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "runwire":
                module = importlib.import_module(node.module or "")
                for alias in node.names:
                    name = f"{node.module}.{alias.name}"
                    if not hasattr(module, alias.name) and importlib.util.find_spec(name) is None:
                        missing.append(f"bench/{path.name}:{node.lineno}: {name}")
    assert not missing, "\n".join(missing)


# ---- one folder per backend -------------------------------------------------------------------

BACKEND_PARTS = {
    "bus": ("bus", ("base", "ports", "keys", "options", "requests", "ingest_entries", "confirming")),
    "store": ("log", ("base", "ports", "jsonl", "outbox", "outbox_schema", "producers", "retention", "runmeta")),
}
"""Each folder of backends: the module holding a backend's class, and the modules shared by every
backend (the rest are folders, one per backend)."""


@pytest.mark.parametrize("part", sorted(BACKEND_PARTS))
def test_each_backend_is_a_folder_with_the_same_roles(part: str) -> None:
    """``bus/<backend>/``: ``bus.py`` holds the backend's class (``store/<backend>/``:
    ``log.py``), ``__init__.py`` exports it, and
    nothing backend-specific lies loose beside the shared modules; a backend imports no other
    backend (what two share moves down, beside ``base``)."""
    home, (main, shared) = ROOT / "pipeline" / part, BACKEND_PARTS[part]
    loose = sorted(p.stem for p in home.glob("*.py") if p.stem != "__init__")
    assert loose == sorted(shared), f"backend modules belong in {part}/<backend>/"
    backends = sorted(p.name for p in home.iterdir() if (p / "__init__.py").exists())
    assert backends
    sideways = []
    for backend in backends:
        assert (home / backend / f"{main}.py").exists(), f"{part}/{backend}/ has no {main}.py"
        exported = ast.parse((home / backend / "__init__.py").read_text())
        assert any(isinstance(node, ast.ImportFrom) and node.module == main for node in exported.body)
        prefix = f"runwire.{part}.{backend}"
        for name, path in MODULES.items():
            if name == prefix or name.startswith(prefix + "."):
                sideways += [f"{name} imports {target}" for target in imports_of(name, path)
                             if target.startswith(f"runwire.{part}.") and target.split(".")[2] in backends
                             and target.split(".")[2] != backend]
    assert not sideways, "\n".join(sideways)


# ---- the edge's wings -------------------------------------------------------------------------

EDGE_FLOORS = {"settings": 0, "metrics": 0, "proto": 0, "fanout": 1, "service": 2,
               "http": 3, "grpc": 3, "durable": 3, "chat": 3, "a2a": 3}
"""The edge's folders (and ground-floor modules), bottom to top: fan-out, the service layer every
entrance shares, then one wing per entrance."""
COMPOSITION_ROOT = "runwire.edge.http.app"
"""The one module that mounts other wings (the HTTP-based ones: Durable Streams, chat, A2A) on
one app; no other wing imports another."""


def test_the_edges_wings_stand_on_the_service_layer() -> None:
    """A module of the edge imports from its own folder and the floors below it; a wing (an
    entrance) never from another wing, save the app mounting the HTTP-based ones."""
    edge = sorted(p.name.removesuffix(".py") for p in (ROOT / "pipeline" / "edge").iterdir()
                  if p.suffix == ".py" and p.name != "__init__.py" or (p / "__init__.py").exists())
    assert edge == sorted(EDGE_FLOORS), "a new edge folder or module needs its floor in EDGE_FLOORS"
    wrong = []
    for name, path in MODULES.items():
        parts = name.split(".")
        if parts[:2] != ["runwire", "edge"] or len(parts) < 3:
            continue
        here = parts[2]
        for target in imports_of(name, path):
            there = target.split(".")
            if there[:2] != ["runwire", "edge"] or len(there) < 3 or there[2] == here:
                continue
            up = EDGE_FLOORS[there[2]] > EDGE_FLOORS[here]
            sideways = EDGE_FLOORS[there[2]] == EDGE_FLOORS[here] == 3 and name != COMPOSITION_ROOT
            if up or sideways:
                wrong.append(f"{name} imports {target}")
    assert not wrong, "edge imports that point up or between wings:\n" + "\n".join(wrong)


# ---- ports ----------------------------------------------------------------------------------

WHOLE = {
    "Bus": ("bus", {"runwire.edge.http.app", "runwire.edge.service.context",
                    "runwire.edge.service.busgate", "runwire.sdk.publisher"}),
    "ReplayLog": ("store", {"runwire.edge.http.app", "runwire.edge.service.context", "runwire.jobs.export"}),
}
"""Each wide type, its folder, and the modules (besides ``workers/``, which open buses and logs)
that hold the whole of it: what opens one or hands it on (the edge's app and context, the gate
wrapping the bus, the publisher owning its connection, the span exporter opening a log of its
own)."""


@pytest.mark.parametrize("wide", sorted(WHOLE))
def test_callers_depend_on_the_ports_they_use(wide: str) -> None:
    """Outside its folder, a module names the ports it uses (``bus/ports.py``: ``IngestLog``,
    ``DeliveryStreams``, ``ControlChannel``; ``store/ports.py``: ``EventLog``, ``RunCatalogue``,
    ``RunHistory``, ``Ownership``, ``DurableState``, ``SpanCursor``), not the whole ``Bus`` or
    ``ReplayLog``: only :data:`WHOLE`'s modules and ``workers/`` do."""
    folder, holders = WHOLE[wide]
    found = []
    for name, path in MODULES.items():
        if name.startswith((f"runwire.{folder}", "runwire.workers")) or name in holders:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and any(alias.name == wide for alias in node.names):
                module = node.module or ""
                if module == folder or module.startswith((f"{folder}.", f"runwire.{folder}")):
                    found.append(f"{name} imports {wide}")
    assert not found, "depend on the ports:\n" + "\n".join(found)
