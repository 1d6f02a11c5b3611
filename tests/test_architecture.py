"""The package's shape, read from its source: private members, private imports, import cycles, layers."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import compactstore

SOURCE = Path(compactstore.__file__).parent
#: The document that describes the layers to a reader; its table must be LAYERS.
ARCHITECTURE = Path(__file__).resolve().parent.parent / "docs" / "ARCHITECTURE.md"

#: The native accelerator: an extension module, with no ``.py`` source to parse.
NATIVE = "compactstore.native"
#: (importer, imported) pairs allowed to cross a private name: none.
ALLOWED_PRIVATE_IMPORTS: set[tuple[str, str]] = set()

#: Import cycles kept on purpose, each with its reason. The command's registration is not
#: one: cli/__init__ imports the subcommand modules and app, the subcommand modules import
#: app, and app imports neither the package nor a subcommand module.
ALLOWED_CYCLES: dict[frozenset[str], str] = {}

#: Each module's layer, bottom to top (docs/ARCHITECTURE.md, "Layers"); ``x.*`` is package x and all
#: below it. A module imports only from its own layer or lower ones. The public face (the
#: package's ``__init__`` and ``__main__``) stands above every layer: it may import any
#: module, and no module imports it.
LAYERS = {
    # 1. Values and pure functions: no I/O, no state.
    "errors": 1, "events": 1, "merkle": 1, "merkle_pure": 1, "native": 1, "_native": 1, "seal": 1, "content": 1,
    # 2. Facts: what a log says (structure), the one Facts interface, the read protocol.
    "structure": 2, "facts": 2, "view": 2,
    # 3. Rules: pure functions over Facts.
    "rules": 3,
    # 4. Builders: read through the view protocol, return events; never commit.
    "compaction": 4, "markers": 4, "resolver": 4, "restore": 4, "summarize": 4, "render": 4, "policy": 4,
    "retention": 4,
    # 5. Backends: rows and typed verbs; no hashing, no events.
    "backends.*": 5,
    # Storage outside the store: the heads a witness holds, and the checks against them.
    "witness": 5,
    # 6. Checkers over a backend's rows alone: the structural index and whole-store verification.
    "index": 6, "verify": 6, "migrate": 6,
    # 7. The store: the one write path, the verifying reader, the sealed heads, the caches.
    "store": 7, "log.*": 7,
    # 8. Uses of the store's public API.
    "copy": 8, "picture": 8, "demo": 8, "recall": 8,
    # 9. Edges.
    "adapters.*": 9, "cli.*": 9,
}  # fmt: skip
PUBLIC_FACE = {"", "__main__"}

#: The documented API of named tuples (``urlsplit(...)._replace``): public despite the underscore.
NAMEDTUPLE_API = {"_asdict", "_field_defaults", "_fields", "_make", "_replace"}


# --- AST utilities ------------------------------------------------------------------


@dataclass(frozen=True)
class Module:
    """A parsed module: dotted name, path for messages, and whether it is a package's ``__init__``."""

    name: str
    path: str
    is_package: bool
    tree: ast.Module


def parse(files: Mapping[str, str]) -> dict[str, Module]:
    """Return the modules of ``files`` (path such as ``pkg/sub/__init__.py`` to source) by dotted name."""
    out = {}
    for path, text in files.items():
        parts = path.removesuffix(".py").split("/")
        is_package = parts[-1] == "__init__"
        name = ".".join(parts[:-1] if is_package else parts)
        out[name] = Module(name, path, is_package, ast.parse(text, path))
    return out


def package() -> dict[str, Module]:
    """Return every module of the installed package."""
    files = sorted(SOURCE.rglob("*.py"))
    return parse({p.relative_to(SOURCE.parent).as_posix(): p.read_text(encoding="utf-8") for p in files})


def found(hits: Iterable[tuple[Module, ast.expr | ast.stmt, str]]) -> list[str]:
    """Return ``path:line: what`` for each hit, in file and line order."""
    ordered = sorted(hits, key=lambda h: (h[0].path, h[1].lineno, h[1].col_offset, h[2]))
    return [f"{mod.path}:{node.lineno}: {what}" for mod, node, what in ordered]


def is_private(name: str) -> bool:
    """Return whether ``name`` has a leading underscore and is not a dunder."""
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def is_self(node: ast.expr) -> bool:
    """Return whether ``node`` is ``self`` or ``cls``."""
    return isinstance(node, ast.Name) and node.id in ("self", "cls")


def is_super(node: ast.expr) -> bool:
    """Return whether ``node`` is a call of ``super``."""
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "super"


def self_attributes(tree: ast.AST) -> set[str]:
    """Return the names assigned as attributes of ``self`` or ``cls`` anywhere in ``tree``."""
    stores = (n for n in ast.walk(tree) if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store))
    return {n.attr for n in stores if is_self(n.value)}


def scope_names(body: list[ast.stmt]) -> set[str]:
    """Return the names bound by the statements of one module or class body (``__slots__`` entries included)."""
    names = set()
    for stmt in body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(stmt.name)
            continue
        for n in ast.walk(stmt):
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
                names.add(n.id)
        if isinstance(stmt, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__slots__" for t in stmt.targets):
            names |= {c.value for c in ast.walk(stmt.value) if isinstance(c, ast.Constant) and isinstance(c.value, str)}
    return names


def defined_names(tree: ast.Module) -> set[str]:
    """Return the names a module defines: its functions, classes, module and class names, and attributes of self."""
    names = self_attributes(tree) | scope_names(tree.body)
    for n in ast.walk(tree):
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(n.name)
        if isinstance(n, ast.ClassDef):
            names |= scope_names(n.body)
    return names


def absolute(mod: Module, node: ast.ImportFrom) -> str:
    """Return the module a ``from ... import`` statement of ``mod`` reads from, relative levels resolved."""
    if not node.level:
        return node.module or ""
    parts = mod.name.split(".") if mod.is_package else mod.name.split(".")[:-1]
    parts = parts[: len(parts) - (node.level - 1)]
    return ".".join(parts + ([node.module] if node.module else []))


def imported_names(mod: Module) -> Iterator[tuple[ast.stmt, str]]:
    """Yield each import statement of ``mod`` (at any depth) with each dotted name it imports."""
    for node in ast.walk(mod.tree):
        if isinstance(node, ast.Import):
            yield from ((node, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = absolute(mod, node)
            yield from ((node, f"{base}.{alias.name}") for alias in node.names if alias.name != "*")


def import_graph(modules: Mapping[str, Module]) -> dict[str, set[str]]:
    """Return each module's imports of modules of its own package, at any depth.

    ``from p import x`` is an import of module ``p.x`` when that module exists, else of ``p``.
    """
    known = set(modules) | {NATIVE}
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for mod in modules.values():
        top = mod.name.split(".")[0]
        for node, dotted in imported_names(mod):
            target = dotted if dotted in known or isinstance(node, ast.Import) else dotted.rpartition(".")[0]
            if target == top or target.startswith(top + "."):
                graph[mod.name].add(target)
    return graph


def cycles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """Return the strongly connected components of ``graph`` that hold a cycle, each sorted (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component: list[str] = []
            while not component or component[-1] != v:
                component.append(stack.pop())
            if len(component) > 1 or v in graph.get(v, ()):
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out)


# --- detectors ----------------------------------------------------------------------


def class_privates(mod: Module, classes: set[str]) -> set[str]:
    """Return the private names the classes ``classes`` of ``mod`` define: methods, class names, self attributes."""
    names: set[str] = set()
    for cls in (n for n in mod.tree.body if isinstance(n, ast.ClassDef) and n.name in classes):
        names |= scope_names(cls.body) | self_attributes(cls)
    return {n for n in names if is_private(n)}


def reaches_into(modules: Mapping[str, Module], owner: str, classes: set[str]) -> list[str]:
    """Return where a module other than ``owner`` reads a private member of ``owner``'s ``classes``."""
    private = class_privates(modules[owner], classes)
    return found(
        (mod, n, ast.unparse(n))
        for mod in modules.values()
        if mod.name != owner
        for n in ast.walk(mod.tree)
        if isinstance(n, ast.Attribute) and n.attr in private and not is_self(n.value)
    )


def foreign_privates(modules: Mapping[str, Module]) -> list[str]:
    """Return where a module reads ``<expr>._name`` of an object other than its own (self, cls, super())."""
    own = {name: defined_names(mod.tree) | NAMEDTUPLE_API for name, mod in modules.items()}
    return found(
        (mod, n, ast.unparse(n))
        for mod in modules.values()
        for n in ast.walk(mod.tree)
        if isinstance(n, ast.Attribute) and is_private(n.attr) and n.attr not in own[mod.name]
        and not is_self(n.value) and not is_super(n.value)
    )  # fmt: skip


def private_imports(modules: Mapping[str, Module]) -> list[str]:
    """Return where a module imports a private name or a private module."""
    hits = []
    for mod in modules.values():
        for node, dotted in imported_names(mod):
            rest = dotted
            for importer, allowed in ALLOWED_PRIVATE_IMPORTS:
                if mod.name == importer and (dotted + ".").startswith(allowed + "."):
                    rest = dotted[len(allowed) :]
            if any(is_private(part) for part in rest.split(".")):
                hits.append((mod, node, f"imports {dotted}"))
    return found(hits)


def layer_of(name: str, layers: Mapping[str, int]) -> int | None:
    """Return the layer of ``name`` (relative to the package) in ``layers``, or None if not listed."""
    if name in layers:
        return layers[name]
    for key, layer in layers.items():
        if key.endswith(".*") and (name == key[:-2] or name.startswith(key[:-1])):
            return layer
    return None


def layer_violations(modules: Mapping[str, Module], layers: Mapping[str, int], face: set[str]) -> list[str]:
    """Return each module missing from ``layers`` and each import of a module from a higher layer."""
    graph = import_graph(modules)
    out = []
    for name in sorted(graph):
        rel = name.partition(".")[2]
        if rel in face:
            continue
        mine = layer_of(rel, layers)
        if mine is None:
            out.append(f"{name}: not in the layer table; add it to LAYERS")
            continue
        for target in sorted(graph[name]):
            theirs = layer_of(target.partition(".")[2], layers)
            if target.partition(".")[2] in face:
                out.append(f"{name} (layer {mine}) imports {target}, the public face")
            elif theirs is not None and theirs > mine:
                out.append(f"{name} (layer {mine}) imports {target} (layer {theirs})")
    return out


# --- the package --------------------------------------------------------------------


def listing(offenders: Sequence[object]) -> str:
    """Return one offender a line, for a failure message."""
    return "\n" + "\n".join(map(str, offenders))


def test_no_module_reaches_a_private_member_of_session_or_store() -> None:
    """No module but store.py reads a private method or attribute of Session or Store."""
    offenders = reaches_into(package(), "compactstore.store", {"Session", "Store"})
    assert offenders == [], listing(offenders)


def test_no_module_reaches_a_private_attribute_of_another_modules_object() -> None:
    """Every ``<expr>._name`` outside self, cls and super() names something its own module defines."""
    offenders = foreign_privates(package())
    assert offenders == [], listing(offenders)


def test_no_private_name_is_imported_across_modules() -> None:
    """No module imports a private name or module, but merkle.py its native accelerator."""
    offenders = private_imports(package())
    assert offenders == [], listing(offenders)


def test_the_import_graph_has_no_cycle() -> None:
    """The package's imports, deferred and type-only ones included, form no cycle but the allowed ones."""
    offenders = [c for c in cycles(import_graph(package())) if frozenset(c) not in ALLOWED_CYCLES]
    assert offenders == [], listing(offenders)


def test_no_module_imports_one_of_a_higher_layer() -> None:
    """Every module is in the layer table and imports only from its own layer or lower ones."""
    offenders = layer_violations(package(), LAYERS, PUBLIC_FACE)
    assert offenders == [], listing(offenders)


def documented_layers(text: str) -> dict[str, int]:
    """Return each module of the Markdown layer table in ``text`` (rows ``| N. name | `m`, ... | ... |``) with its layer."""
    out: dict[str, int] = {}
    for layer, modules in re.findall(r"^\| (\d+)\. [^|]+\| ([^|]+) \|", text, re.M):
        for module in re.findall(r"`([^`]+)`", modules):
            out[module] = int(layer)
    return out


def test_the_architecture_document_lists_every_module_at_its_layer() -> None:
    """docs/ARCHITECTURE.md's layer table names exactly the modules of LAYERS, each at the same layer."""
    documented = documented_layers(ARCHITECTURE.read_text(encoding="utf-8"))
    missing = {m: n for m, n in LAYERS.items() if documented.get(m) != n}
    extra = {m: n for m, n in documented.items() if m not in LAYERS}
    assert (missing, extra) == ({}, {}), f"in LAYERS, not so in the document: {missing}; only in the document: {extra}"


def test_documented_layers_reads_each_row_and_only_the_table() -> None:
    """The table's rows give their backticked modules; prose and the header give none."""
    text = "| layer | modules | owns |\n| --- | --- | --- |\n| 1. values | `a`, `b.*` | `not` this |\n" \
           "| 2. more | `c` | x |\n\nThe `d` module, 3. prose.\n"
    assert documented_layers(text) == {"a": 1, "b.*": 1, "c": 2}


# --- the detectors on synthetic packages ---------------------------------------------

STORE = """
class Store:
    def _seal(self): ...
class Session:
    _cache = None
    def __init__(self):
        self._sid, self.name = 1, "s"
    def _commit(self): ...
    def append(self):
        return self._commit()
"""


def test_reaches_into_finds_private_members_read_from_other_modules() -> None:
    """``session._commit`` or ``self.session._sid`` elsewhere is reported; self and public uses are not."""
    bad = "def f(session, store):\n    session._commit()\n    store._seal()\n    return self.session._sid\n"
    bad += "class B:\n    def _commit(self): ...\n"  # a private name of its own does not excuse the reads above
    good = "class A:\n    def _commit(self):\n        return self._commit(), self.session.append(), self.__init__\n"
    mods = parse({"p/store.py": STORE, "p/bad.py": bad, "p/good.py": good})
    assert reaches_into(mods, "p.store", {"Session", "Store"}) == [
        "p/bad.py:2: session._commit", "p/bad.py:3: store._seal", "p/bad.py:4: self.session._sid"
    ]  # fmt: skip
    assert class_privates(mods["p.store"], {"Session", "Store"}) == {"_seal", "_cache", "_sid", "_commit"}


def test_foreign_privates_allows_a_modules_own_private_names_only() -> None:
    """``other._x`` passes when the module defines ``_x``; an undefined one, even on a module, is reported."""
    own = (
        "class F:\n    __slots__ = ('_n',)\n    def _m(self): ...\n    def copy(self, o):\n"
        "        o._n = self._n\n        super()._z()\n        return o._m(), u._replace(), o.__dict__\n"
    )
    foreign = "from . import merkle\nx = merkle._hasher('b')\ny = obj.session._commit\n"
    mods = parse({"p/own.py": own, "p/foreign.py": foreign})
    assert foreign_privates(mods) == ["p/foreign.py:2: merkle._hasher", "p/foreign.py:3: obj.session._commit"]


def test_private_imports_finds_every_form_and_allows_none_across_modules() -> None:
    """Private names and modules imported in any form are reported, merkle's included; a private alias is not."""
    bad = (
        "from .x import _y\nfrom p.x import z, _w\nimport p._x\nfrom . import _x\n"
        "def f():\n    from ._x import a\n"
    )
    good = "from . import index as _index\nfrom .x import __version__\n"
    mods = parse({"p/__init__.py": "", "p/bad.py": bad, "p/good.py": good})
    assert private_imports(mods) == [
        "p/bad.py:1: imports p.x._y", "p/bad.py:2: imports p.x._w", "p/bad.py:3: imports p._x",
        "p/bad.py:4: imports p._x", "p/bad.py:6: imports p._x.a",
    ]  # fmt: skip
    native = "from . import _native\nfrom ._native import leaf\nimport compactstore._native\n"
    mods = parse({"compactstore/merkle.py": native, "compactstore/store.py": native})
    assert [line.split(":")[0] for line in private_imports(mods)] == ["compactstore/merkle.py"] * 3 + ["compactstore/store.py"] * 3


def test_import_graph_resolves_relative_package_and_deferred_imports() -> None:
    """Relative imports resolve to modules, ``from p import m`` to module m, names to their module."""
    files = {
        "p/__init__.py": "from .b import B\n",
        "p/a.py": "from . import b\nfrom .sub import Row\nfrom .sub.leaf import X\nimport os\n",
        "p/b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .sub import leaf\n",
        "p/sub/__init__.py": "from .. import a as _a\n",
        "p/sub/leaf.py": "def f():\n    from ..b import B\n",
    }
    assert import_graph(parse(files)) == {
        "p": {"p.b"}, "p.a": {"p.b", "p.sub", "p.sub.leaf"}, "p.b": {"p.sub.leaf"}, "p.sub": {"p.a"},
        "p.sub.leaf": {"p.b"},
    }  # fmt: skip


def test_cycles_reports_each_cycle_and_nothing_in_an_acyclic_graph() -> None:
    """Tarjan finds self-imports, two-cycles (one deferred) and longer ones, and none in a DAG or a registration."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"e"}, "e": {"d", "a"}, "f": {"f"}, "g": {"a"}}
    assert cycles(graph) == [["a", "b", "c"], ["d", "e"], ["f"]]
    assert cycles({"a": {"b", "c"}, "b": {"c"}, "c": set()}) == []
    deferred = {"p/a.py": "from . import b\n", "p/b.py": "def f():\n    from .a import g\n"}
    assert cycles(import_graph(parse(deferred))) == [["p.a", "p.b"]]
    registration = {  # subcommands register on app's group; __init__ imports them and app
        "c/__init__.py": "from . import sub\nfrom .app import main\n",
        "c/app.py": "",
        "c/sub.py": "from .app import main\n",
    }
    assert cycles(import_graph(parse(registration))) == []


def test_layer_violations_finds_upward_imports_unknown_modules_and_the_public_face() -> None:
    """An import from a higher layer, a module missing from the table and an import of ``__init__`` fail."""
    layers = {"low": 1, "high": 2, "edge.*": 3}
    files = {
        "p/__init__.py": "from .high import H\nfrom .edge import E\n",
        "p/low.py": "def f():\n    from .high import H\n",
        "p/high.py": "from . import low\n",
        "p/edge/__init__.py": "from .cmd import run\nfrom .. import high\n",
        "p/edge/cmd.py": "from p import low\nimport p\n",
        "p/new.py": "",
    }
    assert layer_violations(parse(files), layers, {""}) == [
        "p.edge.cmd (layer 3) imports p, the public face",
        "p.low (layer 1) imports p.high (layer 2)",
        "p.new: not in the layer table; add it to LAYERS",
    ]
    clean = {"p/__init__.py": "from .edge import E\n", "p/low.py": "", "p/high.py": "from . import low\n",
             "p/edge/__init__.py": "from .. import high, low\n"}  # fmt: skip
    assert layer_violations(parse(clean), layers, {""}) == []
