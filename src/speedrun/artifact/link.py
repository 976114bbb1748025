"""The export's linker: the run's core for one Plan at function level, as one readable module and the counted file.

A run's exported train_gpt.py carries what its driver reaches and nothing else. The linker reads the source of the
linked modules (speedrun/core/, the shared speedrun.progress, speedrun.tables and speedrun.errors, and
speedrun.driver), finds every top-level definition (def, class, assignment) and what each one names, and keeps
those reachable from the roots:

- the driver's ``main`` (``link``), or, while the run's shell is still packed as modules, every name that shell
  imports from the core (``prune``);
- every top-level statement that defines nothing (it runs at import);
- a registry ``NAME = choice("plan.path", {key: entry, ...})`` keeps only the entries whose key is the Plan's
  value at ``plan.path`` (a string, each item of a tuple, "on"/"off" for a truthy/falsy value); the rest, and
  what only they name, are left out of the file.

A class is kept whole. A reference is a name in the statement (``ast.Name``, anywhere in it, annotations
included), resolved to the module that defines it through ``from speedrun.core.x import name``, or a
``"speedrun.core.x:Name"`` string (a model named by its path). ``link`` refuses, naming file:line, what would make
one module wrong or larger: a ``@shell_only`` definition the driver reaches; ``vars``/``locals``/``globals``/
``exec``/``eval`` in kept code (one such call stops python-minifier renaming any local of the module); one
top-level name defined in two kept modules; an aliased, module-level-object or function-local speedrun import in a
linked module, or one of a speedrun module outside them.

``readable`` lays the kept code out as parameter-golf's records do (its ``train_gpt_human.py``): a header, the
external imports once, each module's kept statements copied from its source text with their comments under a
``# ---- speedrun/core/<m>.py ----`` line, the frozen settings ``PLAN``, and the ``__main__`` call. ``counted``
minifies that one module (renaming globals too: nothing imports it) for the self-extracting train_gpt.py.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import math
import re
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

CORE = "speedrun.core"
SHARED = ("speedrun.errors", "speedrun.progress", "speedrun.tables")
"""The shared modules the core may import, linked beside it."""
DRIVER = "speedrun.driver"
ROOT = (DRIVER, "main")
"""What an exported file runs: ``main(PLAN, __file__)``."""

REGISTRY = "choice"
SHELL_ONLY = "shell_only"
REFLECTION = frozenset({"vars", "locals", "globals", "exec", "eval"})
"""Calls that stop python-minifier renaming locals in the module they sit in (it cannot see what they read)."""
DROPPED = frozenset({"__all__"})
"""Top-level names never linked: a module's export list means nothing in one module."""

Symbol = tuple[str, str]
"""(dotted module, top-level name)."""


class LinkError(RuntimeError):
    """The core cannot be linked into one module as written; the message names file:line and what to change."""


@dataclass
class Module:
    """One linked module's source, parsed: its top-level statements, the names each defines, its imports."""

    name: str
    path: str
    """As packed: src/speedrun/core/x.py."""
    text: str
    tree: ast.Module = field(init=False)
    defs: dict[str, int] = field(init=False)
    """top-level name -> index of the statement in tree.body that defines it."""
    imports: dict[str, tuple[str, str | None]] = field(init=False)
    """Module-level imported name -> (module, name in it; None for a module itself)."""

    def __post_init__(self) -> None:
        self.tree = ast.parse(self.text, filename=self.path)
        self.defs, self.imports = {}, {}
        for i, node in enumerate(self.tree.body):
            for name in defined_names(node):
                self.defs[name] = i
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                self.imports.update(import_names(node, self.package))

    @property
    def package(self) -> str:
        return self.name if self.path.endswith("__init__.py") else self.name.rpartition(".")[0]

    def where(self, node: ast.AST) -> str:
        return f"{self.path}:{getattr(node, 'lineno', 0)}"


def module_name(path: str) -> str:
    """src/speedrun/core/x.py -> speedrun.core.x; .../__init__.py -> its package."""
    return path.removeprefix("src/").removesuffix(".py").removesuffix("/__init__").replace("/", ".")


def defined_names(node: ast.stmt) -> list[str]:
    """The names a top-level statement binds that the linker tracks (defs, classes, assignments)."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [node.name]
    targets: list[ast.expr] = []
    if isinstance(node, ast.Assign):
        targets = node.targets
    elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
        targets = [node.target]
    out = []
    for target in targets:
        for n in ast.walk(target):
            if isinstance(n, ast.Name):
                out.append(n.id)
    return out


def import_names(node: ast.Import | ast.ImportFrom, package: str) -> dict[str, tuple[str, str | None]]:
    """{bound name: (module, name in it or None)} of one import statement (relative ones resolved)."""
    out: dict[str, tuple[str, str | None]] = {}
    if isinstance(node, ast.Import):
        for a in node.names:
            out[a.asname or a.name.split(".")[0]] = (a.name if a.asname else a.name.split(".")[0], None)
        return out
    base = node.module or ""
    if node.level:
        parts = package.split(".")
        base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
    for a in node.names:
        out[a.asname or a.name] = (base, a.name)
    return out


def is_speedrun(module: str) -> bool:
    return module == "speedrun" or module.startswith("speedrun.")


PlanValues = Mapping[str, Any]
"""The frozen settings a file is linked for: the Plan as plan.json holds it (Plan.to_dict())."""


def plan_value(plan: PlanValues, path: str) -> Any:
    """plan.json's value at a dotted path; None where it has none."""
    value: Any = plan
    for part in path.split("."):
        value = value.get(part) if isinstance(value, Mapping) else None
        if value is None:
            return None
    return value


def chosen_keys(plan: PlanValues | None, path: str) -> set[str] | None:
    """The registry keys the Plan names at ``path``: its string, each item of a tuple, "on"/"off" for a bool or
    anything else truthy/falsy; None (keep every entry) when ``plan`` is None."""
    if plan is None:
        return None
    value = plan_value(plan, path)
    if isinstance(value, Enum):
        value = value.value
    if isinstance(value, (list, tuple)):
        return {str(v.value if isinstance(v, Enum) else v) for v in value}
    if isinstance(value, str):
        return {value}
    return {"on" if value else "off"}


def registry_of(node: ast.stmt) -> tuple[str, ast.Dict] | None:
    """(plan path, entries) when ``node`` is ``NAME = choice("path", {...})``."""
    value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
    if (
        isinstance(value, ast.Call)
        and isinstance(value.func, ast.Name)
        and value.func.id == REGISTRY
        and len(value.args) == 2
        and isinstance(value.args[0], ast.Constant)
        and isinstance(value.args[0].value, str)
        and isinstance(value.args[1], ast.Dict)
    ):
        return value.args[0].value, value.args[1]
    return None


def kept_entries(entries: ast.Dict, keys: set[str] | None) -> list[tuple[ast.expr, ast.expr]]:
    out = []
    for k, v in zip(entries.keys, entries.values, strict=True):
        if k is None:
            continue  # a ** splat cannot be chosen by key: the linker keeps registries literal
        key = k.value if isinstance(k, ast.Constant) else None
        if keys is None or (isinstance(key, str) and key in keys):
            out.append((k, v))
    return out


@dataclass
class Linked:
    """What the linker keeps: {module: kept statement indexes}, the modules in dependency order, and the Plan each
    registry was pruned for."""

    modules: dict[str, Module]
    kept: dict[str, set[int]]
    order: list[str]
    plan: PlanValues | None = None
    symbols: set[Symbol] = field(default_factory=set)


class Linker:
    def __init__(self, modules: Iterable[Module], plan: PlanValues | None = None, prune_registries: bool = True):
        self.modules = {m.name: m for m in modules}
        self.plan = plan if prune_registries else None

    # -- references ------------------------------------------------------------------------------------------------

    def resolve(self, module: str, name: str, local: Mapping[str, tuple[str, str | None]]) -> Symbol | None:
        """The linked definition ``name`` names in ``module`` (through local imports first), or None."""
        seen = set()
        mod = self.modules[module]
        if name in local:
            target = local[name]
        elif name in mod.defs:
            return (module, name)
        elif name in mod.imports:
            target = mod.imports[name]
        else:
            return None
        while True:
            tmod, attr = target
            if attr is None or tmod not in self.modules or (tmod, attr) in seen:
                return None
            seen.add((tmod, attr))
            m = self.modules[tmod]
            if attr in m.defs:
                return (tmod, attr)
            if attr in m.imports:  # a name a package re-exports
                target = m.imports[attr]
                continue
            return None

    def references(self, module: str, node: ast.AST, skip_entries: bool = True) -> set[Symbol]:
        """The linked definitions ``node`` (a top-level statement) names. A registry's entries are not walked
        here: ``entry_references`` adds the chosen ones."""
        mod = self.modules[module]
        local: dict[str, tuple[str, str | None]] = {}
        registry = registry_of(node) if isinstance(node, ast.stmt) and skip_entries else None
        skipped: set[int] = set()
        if registry is not None:
            skipped = {id(n) for n in ast.walk(registry[1])}
        for n in ast.walk(node):
            if isinstance(n, (ast.Import, ast.ImportFrom)) and n is not node:
                local.update(import_names(n, mod.package))
        out = set()
        for n in ast.walk(node):
            if id(n) in skipped:
                continue
            if isinstance(n, ast.Name):
                found = self.resolve(module, n.id, local)
            elif (
                isinstance(n, ast.Constant)
                and isinstance(n.value, str)
                and re.fullmatch(r"speedrun[\w.]*:\w+", n.value)
            ):
                target, _, attr = n.value.partition(":")
                found = (target, attr) if target in self.modules and attr in self.modules[target].defs else None
            elif isinstance(n, ast.ImportFrom) and n is not node:
                found = None  # resolved through ``local`` where its names are used
            else:
                continue
            if found is not None:
                out.add(found)
        if registry is not None:
            keys = chosen_keys(self.plan, registry[0])
            for k, v in kept_entries(registry[1], keys):
                out |= self.references(module, k, False) | self.references(module, v, False)
        return out

    # -- reachability ----------------------------------------------------------------------------------------------

    def link(self, roots: Iterable[Symbol]) -> Linked:
        todo = [r for r in roots if r[0] in self.modules and r[1] in self.modules[r[0]].defs]
        kept: dict[str, set[int]] = {name: set() for name in self.modules}
        for name, mod in self.modules.items():  # statements that define nothing run at import
            tracked = set(mod.defs.values())
            for i, node in enumerate(mod.tree.body):
                if i in tracked or isinstance(node, (ast.Import, ast.ImportFrom)) or is_type_checking(node):
                    continue
                kept[name].add(i)
                todo.extend(self.references(name, node))
        seen: set[Symbol] = set()
        while todo:
            sym = todo.pop()
            if sym in seen:
                continue
            seen.add(sym)
            module, name = sym
            index = self.modules[module].defs[name]
            kept[module].add(index)
            todo.extend(s for s in self.references(module, self.modules[module].tree.body[index]) if s not in seen)
        return Linked(self.modules, kept, self.order(kept), self.plan, seen)

    def order(self, kept: dict[str, set[int]]) -> list[str]:
        """The modules with kept code, each after the linked modules it imports at its top (else in name order)."""
        live = sorted(m for m, idx in kept.items() if idx)
        deps = {m: {t for t, _ in self.modules[m].imports.values() if t in kept and t != m and kept[t]} for m in live}
        out: list[str] = []
        visiting: set[str] = set()

        def visit(m: str) -> None:
            if m in out or m in visiting:
                return
            visiting.add(m)
            for d in sorted(deps[m]):
                visit(d)
            out.append(m)

        for m in live:
            visit(m)
        return out


def is_type_checking(node: ast.stmt) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.dump(node.test)


# -- refusals (one module) ---------------------------------------------------------------------------------------


def refusals(linked: Linked) -> list[str]:
    """Why ``linked`` cannot be one module: each problem as 'file:line: what; the fix'."""
    out = []
    owner: dict[str, str] = {}
    for name in linked.order:
        mod = linked.modules[name]
        checked = [n for n in mod.tree.body if not is_type_checking(n)]  # TYPE_CHECKING imports never run
        for node in (n for top in checked for n in ast.walk(top)):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                out.extend(import_refusal(mod, node, linked.modules))
        for i in sorted(linked.kept[name]):
            node = mod.tree.body[i]
            for n in ast.walk(node):
                if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in REFLECTION:
                    out.append(
                        f"{mod.where(n)}: {n.func.id}() in linked code stops the minifier renaming the module's "
                        f"locals; name what it reads explicitly"
                    )
            decorators = getattr(node, "decorator_list", [])
            if any(isinstance(d, ast.Name) and d.id == SHELL_ONLY for d in decorators):
                out.append(
                    f"{mod.where(node)}: {defined_names(node)[0]} is @shell_only but the exported driver reaches it; "
                    "call it from python -m run only, or drop the mark"
                )
            for defined in defined_names(node):
                if defined in DROPPED:
                    continue
                here = mod.where(node)
                if defined in owner and not owner[defined].startswith(mod.path + ":"):
                    out.append(
                        f"{here}: {defined} is also defined at {owner[defined]}; one module holds both, rename one"
                    )
                owner.setdefault(defined, here)
    return out


def import_refusal(mod: Module, node: ast.Import | ast.ImportFrom, modules: Mapping[str, Module]) -> list[str]:
    names = import_names(node, mod.package)
    top = any(node is n for n in mod.tree.body)
    out = []
    for bound, (target, attr) in names.items():
        if not is_speedrun(target):
            continue
        what = f"{target}.{attr}" if attr else target
        if target not in modules:
            out.append(
                f"{mod.where(node)}: imports {what}, outside the linked modules; the core imports only itself, "
                f"{', '.join(SHARED)}"
            )
        elif attr is None or f"{target}.{attr}" in modules:
            out.append(f"{mod.where(node)}: imports the module {what}; import the names it uses (from {what} import x)")
        elif bound != attr:
            out.append(f"{mod.where(node)}: imports {what} as {bound}; one module has one name for it, drop the alias")
        elif not top:
            out.append(f"{mod.where(node)}: imports {what} inside a function; import it at the module's top")
    return out


# -- emitting ------------------------------------------------------------------------------------------------------


def statement_lines(mod: Module, index: int) -> tuple[int, int]:
    """(first, last) 1-based source lines of a top-level statement: its decorators and the comment lines directly
    above it included."""
    node = mod.tree.body[index]
    first = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))])
    lines = mod.text.splitlines()
    previous_end = mod.tree.body[index - 1].end_lineno or 0 if index else 0
    while first - 1 > previous_end and lines[first - 2].lstrip().startswith("#"):
        first -= 1
    return first, node.end_lineno or node.lineno


def statement_text(linked: Linked, name: str, index: int) -> str:
    """A kept statement's source, comments included; a registry with only its chosen entries."""
    mod = linked.modules[name]
    first, last = statement_lines(mod, index)
    lines = mod.text.splitlines()
    text = "\n".join(lines[first - 1 : last])
    node = mod.tree.body[index]
    registry = registry_of(node)
    if registry is None or linked.plan is None:
        return text
    path, entries = registry
    keys = chosen_keys(linked.plan, path)
    kept = kept_entries(entries, keys)
    if len(kept) == len(entries.keys):
        return text
    body = ", ".join(f"{ast.get_source_segment(mod.text, k)}: {ast.get_source_segment(mod.text, v)}" for k, v in kept)
    # the statement's lines up to the registry's dict, the chosen entries, then what follows the dict
    head = "\n".join(lines[first - 1 : entries.lineno - 1] + [lines[entries.lineno - 1][: entries.col_offset]])
    end_line = lines[(entries.end_lineno or entries.lineno) - 1]
    tail = "\n".join([end_line[entries.end_col_offset :]] + lines[entries.end_lineno or entries.lineno : last])
    return f"{head}{{{body}}}{tail}"


def external_imports(linked: Linked) -> list[str]:
    """The kept modules' top-level imports of anything but speedrun, each once, in first-seen order; two that bind
    one name to different objects (``import numpy as np`` and ``import jax.numpy as np``) are refused."""
    seen: dict[str, str] = {}
    out = []
    problems = []
    for name in linked.order:
        mod = linked.modules[name]
        for node in mod.tree.body:
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            if isinstance(node, ast.ImportFrom) and node.module == "__future__":
                continue
            for bound, (target, attr) in import_names(node, mod.package).items():
                if is_speedrun(target):
                    continue
                what = f"{target}.{attr}" if attr else target  # the object bound: from torch import nn is torch.nn
                if isinstance(node, ast.Import):
                    alias = next(a for a in node.names if (a.asname or a.name.split(".")[0]) == bound)
                    text = f"import {alias.name}" + (f" as {alias.asname}" if alias.asname else "")
                else:
                    text = f"from {target} import {attr}" + (f" as {bound}" if bound != attr else "")
                if bound in seen:
                    if seen[bound] != what:
                        problems.append(f"{mod.where(node)}: {text!r} binds {bound} to {what}, elsewhere {seen[bound]}")
                    continue
                seen[bound] = what
                out.append(text)
    if problems:
        raise LinkError("; ".join(problems))
    return out


def import_block(lines: Iterable[str]) -> str:
    """external_imports' lines as one block, as a formatter lays them out: the standard library first, then the
    rest, each module's ``from`` imports merged into one line."""
    plain: set[str] = set()
    names: dict[str, set[str]] = {}
    for line in lines:
        if line.startswith("from "):
            module, _, name = line.removeprefix("from ").partition(" import ")
            names.setdefault(module, set()).add(name)
        else:
            plain.add(line)
    groups: list[list[str]] = [[], []]
    for line in plain:
        groups[_top(line.split()[1]) not in sys.stdlib_module_names].append(line)
    for module, imported in names.items():
        groups[_top(module) not in sys.stdlib_module_names].append(
            f"from {module} import {', '.join(sorted(imported))}"
        )
    key = lambda line: (line.split()[1], line.startswith("from "))  # noqa: E731 - one sort key, used twice
    return "\n\n".join("\n".join(sorted(group, key=key)) for group in groups if group)


def _top(module: str) -> str:
    return module.split(".")[0]


HEADER = """# {title}
# The run's code, linked for its settings (PLAN, at the end) from speedrun {version}: each part under a
# "# ---- <module> ----" line, as written there, comments kept. train_gpt.py is this file minified and compressed
# (the file whose bytes are counted); both run the same:
#   python {name}
#   DATA_PATH=<shards dir> TOKENIZER_PATH=<tokenizer .model> SEED=1 torchrun --standalone --nproc_per_node=8 {name}
"""


def sections(linked: Linked) -> dict[str, str]:
    """{module path (speedrun/core/x.py): its kept statements as written, comments kept}, in the linked order;
    imports are left out (the one module imports what they need once, external_imports)."""
    out = {}
    for module in linked.order:
        mod = linked.modules[module]
        texts = []
        for i in sorted(linked.kept[module]):
            node = mod.tree.body[i]
            if isinstance(node, (ast.Import, ast.ImportFrom)) or is_type_checking(node):
                continue
            if set(defined_names(node)) & DROPPED:
                continue
            texts.append(statement_text(linked, module, i))
        if texts:
            out[mod.path.removeprefix("src/")] = "\n\n\n".join(texts) + "\n"
    return out


def readable(linked: Linked, settings: Any, name: str = "train_gpt_human.py", version: str = "") -> str:
    """The linked code as one module a reviewer reads top to bottom (module docstring: records' layout), ending
    in ``PLAN = <settings as the constructor calls that build them>`` and the ``__main__`` call."""
    problems = refusals(linked)
    if problems:
        raise LinkError("the core cannot be linked into one module:\n" + "\n".join(problems))
    parts = [HEADER.format(title=name, version=version, name=name), "from __future__ import annotations\n"]
    parts.append(import_block(external_imports(linked)) + "\n")
    parts.extend(f"# ---- {path} ----\n\n{text}" for path, text in sections(linked).items())
    parts.append(tail(settings))
    return "\n\n".join(parts)


def tail(settings: Any) -> str:
    """The frozen settings and the call that runs them: the end of every linked file."""
    return f'PLAN = {settings_source(settings)}\n\n\nif __name__ == "__main__":\n    main(PLAN, __file__)\n'


WIDTH = 116
"""Line length of the settings' source (the project's formatting width)."""


def settings_source(value: Any, indent: int = 0) -> str:
    """Python source that builds ``value``: a dataclass as the call of its class with the fields that differ from
    their defaults, one per line when the call is long; tuples, lists and dicts of them likewise; floats exactly
    (repr round-trips), an infinity or NaN as ``float("inf")``."""
    pad = " " * (indent + 4)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        items = [
            f"{f.name}={settings_source(getattr(value, f.name), indent + 4)}"
            for f in dataclasses.fields(value)
            if f.init and not _is_default(f, getattr(value, f.name))
        ]
        head, close = f"{type(value).__name__}(", ")"
    elif isinstance(value, (tuple, list)):
        items = [settings_source(v, indent + 4) for v in value]
        head, close = ("(", ",)" if len(items) == 1 else ")") if isinstance(value, tuple) else ("[", "]")
    elif isinstance(value, dict):
        items = [f"{k!r}: {settings_source(v, indent + 4)}" for k, v in value.items()]
        head, close = "{", "}"
    elif isinstance(value, Enum):
        return repr(value.value)
    elif isinstance(value, float) and not math.isfinite(value):
        return f'float("{value}")'
    else:
        return repr(value)
    one = head + ", ".join(items) + close
    if indent + len(one) <= WIDTH and "\n" not in one:
        return one
    return head + "\n" + "".join(f"{pad}{item},\n" for item in items) + " " * indent + close.lstrip(",")


def _is_default(f: dataclasses.Field, value: Any) -> bool:
    if f.default is not dataclasses.MISSING:
        default = f.default
    elif f.default_factory is not dataclasses.MISSING:
        default = f.default_factory()
    else:
        return False
    return type(value) is type(default) and value == default


def settings_types(value: Any) -> set[tuple[str, str]]:
    """(module, class name) of every dataclass in ``value``'s settings tree: the linker's roots for PLAN."""
    out: set[tuple[str, str]] = set()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out.add((type(value).__module__, type(value).__qualname__))
        for f in dataclasses.fields(value):
            out |= settings_types(getattr(value, f.name))
    elif isinstance(value, (tuple, list)):
        for v in value:
            out |= settings_types(v)
    elif isinstance(value, dict):
        for v in value.values():
            out |= settings_types(v)
    return out


MINIFY: dict[str, Any] = {"rename_globals": True}
"""python-minifier options on top of speedrun.artifact.minify.OPTIONS for the one module: nothing imports it, so its
top-level names may be shortened too (-1.8% counted on the record's script)."""


def counted(text: str) -> str:
    """The one module minified (the payload of the counted train_gpt.py); it must still compile."""
    from speedrun.artifact.minify import minify  # cached on disk; it checks that its output compiles

    return minify(text, "train_gpt_human.py", MINIFY)


# -- reading the tree ----------------------------------------------------------------------------------------------


@functools.cache
def _parsed(path: str, text: str) -> Module:
    return Module(module_name(path), path, text)


def modules_of(files: Mapping[str, str], names: Iterable[str] | None = None) -> list[Module]:
    """Parsed modules of ``files`` ({repo path: text}) whose module name is in ``names`` (or under speedrun.core and
    the shared ones when None); parses are cached by text."""
    out = []
    for path, text in files.items():
        if not path.endswith(".py"):
            continue
        name = module_name(path)
        wanted = name in names if names is not None else (name == CORE or name.startswith(CORE + ".") or name in SHARED)
        if wanted:
            out.append(_parsed(path, text))
    return out


def link(files: Mapping[str, str], plan: PlanValues, roots: Iterable[Symbol] = ()) -> Linked:
    """The driver's ``main`` (and ``roots``: the classes of the frozen settings) linked for ``plan`` over ``files``
    ({repo path: text}: speedrun/core/, the shared modules, speedrun/driver.py), refused (LinkError) when it cannot
    be one module."""
    modules = modules_of(files, None) + modules_of(files, [DRIVER])
    if not any(m.name == DRIVER for m in modules):
        raise LinkError(f"no {DRIVER} among the files to link: it is the exported file's entry point")
    linked = Linker(modules, plan).link([ROOT, *roots])
    problems = refusals(linked)
    if problems:
        raise LinkError("the core cannot be linked into one module:\n" + "\n".join(problems))
    return linked


__all__ = [
    "LinkError",
    "Linked",
    "Linker",
    "Module",
    "counted",
    "link",
    "modules_of",
    "readable",
    "refusals",
    "sections",
    "settings_source",
    "settings_types",
]
