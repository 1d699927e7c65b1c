"""Extraction rules for tools/engine_surface.py.

Every rule reads Python *source text* of a released vLLM / vLLM-Ascend tree and
inspects it with :mod:`ast`; nothing here imports the upstream packages. Each
public ``extract_*`` function names, in its docstring, the upstream file(s) it
reads. When a rule meets a construct it does not understand in a place where it
must understand everything (for example an ``add_argument`` option string that
is neither a literal nor a known generated form) it raises
:class:`ExtractionError` instead of silently dropping data, so that an upstream
change shows up as a failure rather than as a quietly shrunken surface.

Standard library only.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field

__all__ = [
    "ExtractionError",
    "ServeFlags",
    "SourceTree",
    "Workspace",
    "extract_additional_config",
    "extract_connector_modules",
    "extract_direct_env_reads",
    "extract_env_table",
    "extract_eplb_policies",
    "extract_expert_map_keys",
    "extract_json_options",
    "extract_kv_connectors",
    "extract_metrics",
    "extract_serve_flags",
]


class ExtractionError(RuntimeError):
    """An upstream construct that a rule has to understand but does not."""


# --------------------------------------------------------------------------- #
# Source access
# --------------------------------------------------------------------------- #


class SourceTree:
    """The ``.py`` files of one package snapshot, keyed by POSIX path.

    Paths are relative to the site-packages / repository root, e.g.
    ``vllm/engine/arg_utils.py`` or ``vllm_ascend/ascend_config.py``.
    ``label`` says where the text came from (wheel, git tag, test snippet).
    """

    def __init__(self, files: Mapping[str, str], label: str = "") -> None:
        self._files = dict(files)
        self.label = label
        self._ast: dict[str, ast.Module] = {}

    def paths(self, prefix: str = "") -> list[str]:
        """All stored paths under ``prefix``, sorted."""
        return sorted(p for p in self._files if p.startswith(prefix))

    def exists(self, path: str) -> bool:
        return path in self._files

    def text(self, path: str) -> str:
        return self._files[path]

    def module(self, path: str) -> ast.Module:
        """Parsed AST of ``path`` (cached)."""
        tree = self._ast.get(path)
        if tree is None:
            try:
                tree = ast.parse(self._files[path], filename=path)
            except SyntaxError as exc:  # pragma: no cover - upstream is valid
                raise ExtractionError(f"cannot parse {path}: {exc}") from exc
            self._ast[path] = tree
        return tree

    def grep(self, needle: str, prefix: str = "") -> list[str]:
        """Paths under ``prefix`` whose text contains ``needle`` (cheap pre-filter before AST)."""
        return [p for p in self.paths(prefix) if needle in self._files[p]]


def module_name(path: str) -> str:
    """``vllm/config/model.py`` -> ``vllm.config.model``; packages drop ``__init__``."""
    mod = path.removesuffix(".py")
    parts = mod.split("/")
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def module_path(tree: SourceTree, modname: str) -> str | None:
    """The file that defines module ``modname`` in ``tree``, or None."""
    base = modname.replace(".", "/")
    for candidate in (base + ".py", base + "/__init__.py"):
        if tree.exists(candidate):
            return candidate
    return None


class Workspace:
    """Several source trees searched together (vLLM plus vLLM-Ascend).

    Resolves a module name to the tree holding it, and a name used in a module
    to the class or function it refers to, following ``import`` statements.
    """

    def __init__(self, *trees: SourceTree) -> None:
        self.trees = trees
        self._imports: dict[str, dict[str, tuple[str, str | None]]] = {}

    def locate(self, modname: str) -> tuple[SourceTree, str] | None:
        for tree in self.trees:
            path = module_path(tree, modname)
            if path is not None:
                return tree, path
        return None

    def module(self, modname: str) -> ast.Module | None:
        found = self.locate(modname)
        return found[0].module(found[1]) if found else None

    def resolve(self, modname: str, name: str, _depth: int = 0) -> Definition | None:
        """The top-level class/function/assignment ``name`` seen from module ``modname``."""
        if _depth > 8:
            return None
        mod = self.module(modname)
        if mod is None:
            return None
        for node in mod.body:
            if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
                return Definition(modname, node)
        for node in mod.body:
            if name in _assigned_names(node):
                return Definition(modname, node)
        if modname not in self._imports:
            self._imports[modname] = import_map(mod, modname, self.is_package(modname))
        target = self._imports[modname].get(name)
        if target is None or target[1] is None:
            return None  # not imported here, or a plain ``import pkg`` (a module, not a definition)
        return self.resolve(target[0], target[1], _depth + 1)

    def is_package(self, modname: str) -> bool:
        found = self.locate(modname)
        return bool(found and found[1].endswith("/__init__.py"))

    def find_class_anywhere(self, name: str, prefer: str = "") -> Definition | None:
        """A top-level class ``name`` in any tree; paths under ``prefer`` win, then sorted order."""
        hits: list[tuple[int, str, ast.ClassDef]] = []
        for tree in self.trees:
            for path in tree.grep(f"class {name}"):
                for node in tree.module(path).body:
                    if isinstance(node, ast.ClassDef) and node.name == name:
                        hits.append((0 if path.startswith(prefer) and prefer else 1, path, node))
        if not hits:
            return None
        hits.sort(key=lambda h: (h[0], h[1]))
        return Definition(module_name(hits[0][1]), hits[0][2])


@dataclass(frozen=True)
class Definition:
    """A top-level AST node and the module defining it."""

    module: str
    node: ast.AST


def _assigned_names(node: ast.AST) -> set[str]:
    names: set[str] = set()
    targets: list[ast.AST] = []
    if isinstance(node, ast.Assign):
        targets = list(node.targets)
    elif isinstance(node, ast.AnnAssign):
        targets = [node.target]
    elif hasattr(ast, "TypeAlias") and isinstance(node, ast.TypeAlias):
        targets = [node.name]
    for t in targets:
        if isinstance(t, ast.Name):
            names.add(t.id)
    return names


def import_map(mod: ast.Module, modname: str, is_package: bool) -> dict[str, tuple[str, str | None]]:
    """Names bound by top-level imports: local name -> (module, attribute or None)."""
    result: dict[str, tuple[str, str | None]] = {}
    package = modname if is_package else modname.rpartition(".")[0]
    for node in ast.walk(mod):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    result[alias.asname] = (alias.name, None)
                else:
                    top = alias.name.split(".")[0]
                    result[top] = (top, None)
        elif isinstance(node, ast.ImportFrom):
            src = _absolute_module(node, package)
            for alias in node.names:
                result[alias.asname or alias.name] = (src, alias.name)
    return result


def _absolute_module(node: ast.ImportFrom, package: str) -> str:
    if not node.level:
        return node.module or ""
    parts = package.split(".") if package else []
    if node.level > 1:
        parts = parts[: len(parts) - (node.level - 1)]
    if node.module:
        parts.append(node.module)
    return ".".join(parts)


def imported_modules(mod: ast.Module, modname: str, is_package: bool) -> set[str]:
    """Every module name an import statement in ``mod`` could load (``from a import b`` gives a and a.b)."""
    out: set[str] = set()
    package = modname if is_package else modname.rpartition(".")[0]
    for node in ast.walk(mod):
        if isinstance(node, ast.Import):
            for alias in node.names:
                out.add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            src = _absolute_module(node, package)
            out.add(src)
            for alias in node.names:
                out.add(f"{src}.{alias.name}")
    return out


# --------------------------------------------------------------------------- #
# Small AST helpers
# --------------------------------------------------------------------------- #


def const_str(node: ast.AST | None) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    return None


def terminal_name(node: ast.AST) -> str | None:
    """``a.b.c`` -> ``c``; ``c`` -> ``c``; anything else -> None."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def dotted(node: ast.AST) -> str | None:
    """``os.environ`` -> ``"os.environ"`` for Name/Attribute chains."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = dotted(node.value)
        return f"{base}.{node.attr}" if base else None
    return None


def parent_map(root: ast.AST) -> dict[ast.AST, ast.AST]:
    parents: dict[ast.AST, ast.AST] = {}
    for node in ast.walk(root):
        for child in ast.iter_child_nodes(node):
            parents[child] = node
    return parents


def functions(mod: ast.Module) -> Iterator[tuple[ast.ClassDef | None, ast.FunctionDef | ast.AsyncFunctionDef]]:
    """(enclosing top-level class or None, function) for every def in the module, nested ones included."""
    for node in mod.body:
        if isinstance(node, ast.ClassDef):
            for sub in ast.walk(node):
                if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    yield node, sub
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for sub in ast.walk(node):
                if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    yield None, sub


def class_methods(cls: ast.ClassDef) -> dict[str, ast.FunctionDef | ast.AsyncFunctionDef]:
    return {n.name: n for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}


def is_staticmethod(func: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    return any(terminal_name(d) == "staticmethod" for d in func.decorator_list)


def positional_params(func: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    return [a.arg for a in func.args.posonlyargs + func.args.args]


def class_mro(ws: Workspace, defn: Definition, _seen: set[tuple[str, str]] | None = None) -> list[Definition]:
    """The class and its resolvable base classes (depth first, own class first)."""
    assert isinstance(defn.node, ast.ClassDef)
    seen = _seen if _seen is not None else set()
    key = (defn.module, defn.node.name)
    if key in seen:
        return []
    seen.add(key)
    out = [defn]
    for base in defn.node.bases:
        name = terminal_name(base)
        if not name or name in {"object", "ABC", "Generic", "Protocol"}:
            continue
        found = ws.resolve(defn.module, name)
        if found is None or not isinstance(found.node, ast.ClassDef):
            found = ws.find_class_anywhere(name, prefer=defn.module.split(".")[0] + "/")
        if found is not None and isinstance(found.node, ast.ClassDef):
            out.extend(class_mro(ws, found, seen))
    return out


def is_dataclass_def(node: ast.ClassDef) -> bool:
    """Decorated with ``@dataclass`` / ``@config`` / pydantic ``@dataclass`` (with or without arguments)."""
    for dec in node.decorator_list:
        target = dec.func if isinstance(dec, ast.Call) else dec
        if terminal_name(target) in {"dataclass", "config"}:
            return True
    return False


def _init_false(value: ast.expr | None) -> bool:
    """``field(..., init=False)`` / ``Field(init=False)``."""
    return (isinstance(value, ast.Call) and terminal_name(value.func) in {"field", "Field"}
            and any(k.arg == "init" and isinstance(k.value, ast.Constant) and k.value.value is False
                    for k in value.keywords))


def dataclass_fields(ws: Workspace, defn: Definition, init_only: bool = False) -> dict[str, tuple[Definition, ast.expr]]:
    """Dataclass fields of a class and its bases: name -> (defining class, annotation).

    Mirrors ``dataclasses.fields``: annotated class attributes, minus ``ClassVar`` and ``InitVar``;
    with ``init_only`` also minus ``field(init=False)``.
    """
    result: dict[str, tuple[Definition, ast.expr]] = {}
    for cls in reversed(class_mro(ws, defn)):
        assert isinstance(cls.node, ast.ClassDef)
        for stmt in cls.node.body:
            if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                if init_only and _init_false(stmt.value):
                    result.pop(stmt.target.id, None)
                    continue
                ann = stmt.annotation
                head = ann.value if isinstance(ann, ast.Subscript) else ann
                if isinstance(ann, ast.Constant) and isinstance(ann.value, str):
                    if re.match(r"\s*(typing\.)?(ClassVar|InitVar)\b", ann.value):
                        continue
                elif terminal_name(head) in {"ClassVar", "InitVar"}:
                    continue
                result[stmt.target.id] = (cls, ann)
    return result


# --------------------------------------------------------------------------- #
# 1. serve flags
# --------------------------------------------------------------------------- #


@dataclass
class ServeFlags:
    """What ``vllm serve`` accepts: long options, single-dash aliases, deprecated ones."""

    long: set[str] = field(default_factory=set)
    short: set[str] = field(default_factory=set)
    deprecated: set[str] = field(default_factory=set)

    def add(self, options: Iterable[str], boolean: bool, deprecated: bool) -> None:
        for opt in options:
            if opt.startswith("--"):
                names = [opt, "--no-" + opt[2:]] if boolean else [opt]
                self.long.update(names)
                if deprecated:
                    self.deprecated.update(names)
            elif opt.startswith("-"):
                self.short.add(opt)
                if deprecated:
                    self.deprecated.add(opt)


@dataclass(frozen=True)
class TypeHintSemantics:
    """How the release's ``get_type_hints``/``_compute_kwargs`` (vllm/engine/arg_utils.py) treat annotations."""

    pep604_unions: bool  # ``X | Y`` is flattened like ``Union[X, Y]``
    bool_str_none_is_optional_value: bool  # ``bool | str | None`` becomes nargs="?" instead of --no-x


def read_type_hint_semantics(arg_utils: ast.Module) -> TypeHintSemantics:
    """Read vllm/engine/arg_utils.py: does ``get_type_hints`` handle ``types.UnionType``, and does
    ``_compute_kwargs`` special-case ``{bool, str, None}``?"""
    pep604 = False
    special = False
    for node in arg_utils.body:
        if isinstance(node, ast.FunctionDef) and node.name == "get_type_hints":
            pep604 = any(isinstance(n, ast.Name) and n.id == "UnionType" for n in ast.walk(node))
        if isinstance(node, ast.FunctionDef) and node.name == "_compute_kwargs":
            for n in ast.walk(node):
                if isinstance(n, ast.Compare) and any(isinstance(c, ast.Set) for c in n.comparators):
                    members = {ast.unparse(e) for c in n.comparators if isinstance(c, ast.Set) for e in c.elts}
                    if {"bool", "str"} <= members:
                        special = True
    return TypeHintSemantics(pep604, special)


# Subscripted forms that evaluate to ``typing.Annotated[X, ...]``, which ``get_type_hints`` unwraps:
# pydantic's ``SkipValidation[X]`` and ``InstanceOf[X]`` (vllm/config/scheduler.py uses the former).
_ANNOTATED_WRAPPERS = {"Annotated", "SkipValidation", "InstanceOf"}

_BUILTIN_TYPE_NAMES = {"bool", "int", "float", "str", "bytes", "dict", "list", "set", "tuple", "None", "Any", "object"}


def annotation_members(
    ws: Workspace, modname: str, ann: ast.expr, sem: TypeHintSemantics, _depth: int = 0
) -> set[str]:
    """Flatten an annotation the way vLLM's ``get_type_hints`` does and name each member.

    ``Optional[bool]`` -> {"bool", "None"}; ``Annotated[int, ...]`` -> {"int"};
    ``Literal["a"]`` -> {"Literal"}; module-level type aliases are expanded.
    """
    if _depth > 6:
        return {ast.unparse(ann)}
    if isinstance(ann, ast.Constant):
        if ann.value is None:
            return {"None"}
        if isinstance(ann.value, str):
            try:
                parsed = ast.parse(ann.value, mode="eval").body
            except SyntaxError:
                return {ann.value}
            return annotation_members(ws, modname, parsed, sem, _depth + 1)
    if isinstance(ann, ast.BinOp) and isinstance(ann.op, ast.BitOr):
        if not sem.pep604_unions:
            return {ast.unparse(ann)}  # an opaque types.UnionType for this release's get_type_hints
        return annotation_members(ws, modname, ann.left, sem, _depth + 1) | annotation_members(
            ws, modname, ann.right, sem, _depth + 1
        )
    if isinstance(ann, ast.Subscript):
        head = terminal_name(ann.value)
        args = ann.slice.elts if isinstance(ann.slice, ast.Tuple) else [ann.slice]
        if head == "Union":
            out: set[str] = set()
            for a in args:
                out |= annotation_members(ws, modname, a, sem, _depth + 1)
            return out
        if head == "Optional":
            return annotation_members(ws, modname, args[0], sem, _depth + 1) | {"None"}
        if head in _ANNOTATED_WRAPPERS:
            return annotation_members(ws, modname, args[0], sem, _depth + 1)
        return {head or ast.unparse(ann.value)}
    name = terminal_name(ann)
    if name is None:
        return {ast.unparse(ann)}
    if name not in _BUILTIN_TYPE_NAMES:
        alias = ws.resolve(modname, name)
        if alias is not None and isinstance(alias.node, (ast.Assign, ast.AnnAssign)):
            value = alias.node.value
            if value is not None and not isinstance(value, ast.Call):
                return annotation_members(ws, alias.module, value, sem, _depth + 1)
        if alias is not None and hasattr(ast, "TypeAlias") and isinstance(alias.node, ast.TypeAlias):
            return annotation_members(ws, alias.module, alias.node.value, sem, _depth + 1)
    return {name}


def field_is_boolean_flag(ws: Workspace, cls: Definition, field_name: str, sem: TypeHintSemantics) -> bool:
    """Whether ``get_kwargs(cls)[field_name]`` carries ``action=argparse.BooleanOptionalAction``.

    Reads the field's annotation in the config class (vllm/config/*.py or the frontend args class):
    bool anywhere in the flattened union, unless a member is a dataclass (parsed as JSON) or the
    release special-cases ``bool | str | None``.
    """
    fields = dataclass_fields(ws, cls)
    if field_name not in fields:
        raise ExtractionError(f"{cls.module}.{getattr(cls.node, 'name', '?')} has no field {field_name!r}")
    owner, ann = fields[field_name]
    members = annotation_members(ws, owner.module, ann, sem)
    for m in members - _BUILTIN_TYPE_NAMES:
        found = ws.resolve(owner.module, m)
        if found is not None and isinstance(found.node, ast.ClassDef) and is_dataclass_def(found.node):
            return False
    if sem.bool_str_none_is_optional_value and members == {"bool", "str", "None"}:
        return False
    return "bool" in members


@dataclass
class _KwargsRef:
    """A ``get_kwargs(SomeConfig)`` result, or one field of it."""

    cls: Definition
    field_name: str | None = None


class _ServeFlagWalker:
    """Follows the argparse set-up of ``vllm serve`` and records every option it adds."""

    def __init__(self, ws: Workspace, sem: TypeHintSemantics) -> None:
        self.ws = ws
        self.sem = sem
        self.flags = ServeFlags()
        self.visited: set[tuple[str, str, str]] = set()
        self.unresolved_calls: set[str] = set()

    # -- call following ---------------------------------------------------
    def walk(self, modname: str, func: ast.FunctionDef | ast.AsyncFunctionDef, cls_binding: Definition | None,
             owner: Definition | None) -> None:
        key = (modname, func.name, cls_binding.node.name if cls_binding else "")  # type: ignore[union-attr]
        if key in self.visited:
            return
        self.visited.add(key)
        env = self._kwargs_bindings(modname, func, cls_binding)
        overrides = self._kwargs_overrides(func)
        loops = self._loop_bindings(func)
        for node in ast.walk(func):
            if not isinstance(node, ast.Call):
                continue
            if isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument":
                self._add_argument(modname, node, env, overrides, loops)
            elif self._passes_parser(node):
                self._follow(modname, node, cls_binding, owner)

    @staticmethod
    def _passes_parser(call: ast.Call) -> bool:
        return any(isinstance(a, ast.Name) and a.id.endswith("parser") for a in call.args)

    def _follow(self, modname: str, call: ast.Call, cls_binding: Definition | None, owner: Definition | None) -> None:
        target = call.func
        if isinstance(target, ast.Name):
            found = self.ws.resolve(modname, target.id)
            if found is not None and isinstance(found.node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                self.walk(found.module, found.node, None, None)
                return
        elif isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name):
            base = target.value.id
            cls_def: Definition | None = None
            if base == "cls" and cls_binding is not None:
                cls_def = cls_binding
            elif base == "self" and owner is not None:
                cls_def = owner
            else:
                found = self.ws.resolve(modname, base)
                if found is not None and isinstance(found.node, ast.ClassDef):
                    cls_def = found
            if cls_def is not None:
                for c in class_mro(self.ws, cls_def):
                    method = class_methods(c.node).get(target.attr)  # type: ignore[arg-type]
                    if method is not None:
                        self.walk(c.module, method, cls_def, c)
                        return
        self.unresolved_calls.add(ast.unparse(call.func))

    # -- local bindings ---------------------------------------------------
    def _kwargs_bindings(self, modname: str, func: ast.AST, cls_binding: Definition | None) -> dict[str, _KwargsRef]:
        """``x = get_kwargs(Cls)`` and ``y = x["field"]`` assignments in the function."""
        env: dict[str, _KwargsRef] = {}
        for node in ast.walk(func):
            if not (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)):
                continue
            name, value = node.targets[0].id, node.value
            if isinstance(value, ast.Call) and terminal_name(value.func) == "get_kwargs" and value.args:
                arg = value.args[0]
                cls_def = None
                if isinstance(arg, ast.Name) and arg.id == "cls":
                    cls_def = cls_binding
                elif isinstance(arg, ast.Name):
                    found = self.ws.resolve(modname, arg.id)
                    if found is None:
                        found = self.ws.find_class_anywhere(arg.id, prefer="vllm/config/")
                    cls_def = found
                if cls_def is None or not isinstance(cls_def.node, ast.ClassDef):
                    raise ExtractionError(f"{modname}: cannot resolve get_kwargs({ast.unparse(arg)})")
                env[name] = _KwargsRef(cls_def)
        for node in ast.walk(func):
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                ref = self._kwargs_expr(node.value, env)
                if ref is not None and ref.field_name is not None:
                    env[node.targets[0].id] = ref
        return env

    @staticmethod
    def _kwargs_expr(expr: ast.AST, env: Mapping[str, _KwargsRef]) -> _KwargsRef | None:
        """Resolve ``k["f"]``, ``{**k["f"], ...}`` or a name bound to one of them."""
        if isinstance(expr, ast.Name):
            return env.get(expr.id)
        if isinstance(expr, ast.Subscript) and isinstance(expr.value, ast.Name):
            base = env.get(expr.value.id)
            key = const_str(expr.slice)
            if base is not None and base.field_name is None and key is not None:
                return _KwargsRef(base.cls, key)
        if isinstance(expr, ast.Dict):
            for k, v in zip(expr.keys, expr.values):
                if k is None:
                    ref = _ServeFlagWalker._kwargs_expr(v, env)
                    if ref is not None:
                        return ref
        return None

    @staticmethod
    def _kwargs_overrides(func: ast.AST) -> dict[tuple[str, str], ast.expr | None]:
        """``k["field"]["action"] = ...`` / ``k["field"]["flags"] = [...]`` / ``del k["field"]`` in a function."""
        out: dict[tuple[str, str], ast.expr | None] = {}
        for node in ast.walk(func):
            if isinstance(node, ast.Assign):
                for t in node.targets:
                    if (isinstance(t, ast.Subscript) and isinstance(t.value, ast.Subscript)
                            and const_str(t.slice) in {"action", "flags"}):
                        fname = const_str(t.value.slice)
                        if fname is not None:
                            out[(fname, const_str(t.slice) or "")] = node.value
            elif isinstance(node, ast.Delete):
                for t in node.targets:
                    if isinstance(t, ast.Subscript) and isinstance(t.value, ast.Name) and const_str(t.slice):
                        out[(const_str(t.slice) or "", "del")] = None
        return out

    @staticmethod
    def _loop_bindings(func: ast.AST) -> dict[ast.AST, tuple[ast.For, list[dict[str, ast.expr]]]]:
        """For every node inside a ``for`` loop: the loop and, for literal iterables, each iteration's values."""
        result: dict[ast.AST, tuple[ast.For, list[dict[str, ast.expr]]]] = {}
        for loop in ast.walk(func):
            if not isinstance(loop, ast.For):
                continue
            rows: list[dict[str, ast.expr]] = []
            if isinstance(loop.iter, (ast.List, ast.Tuple)):
                for elt in loop.iter.elts:
                    if isinstance(loop.target, ast.Name):
                        rows.append({loop.target.id: elt})
                    elif isinstance(loop.target, ast.Tuple) and isinstance(elt, (ast.Tuple, ast.List)):
                        rows.append({t.id: v for t, v in zip(loop.target.elts, elt.elts) if isinstance(t, ast.Name)})
            for inner in ast.walk(loop):
                result.setdefault(inner, (loop, rows))
        return result

    # -- add_argument ------------------------------------------------------
    def _add_argument(self, modname: str, call: ast.Call, env: Mapping[str, _KwargsRef],
                      overrides: Mapping[tuple[str, str], ast.expr | None],
                      loops: Mapping[ast.AST, tuple[ast.For, list[dict[str, ast.expr]]]]) -> None:
        where = f"{modname}:{call.lineno}"
        action = next((k.value for k in call.keywords if k.arg == "action"), None)
        deprecated = any(k.arg == "deprecated" and isinstance(k.value, ast.Constant) and k.value.value is True
                         for k in call.keywords)
        spread = [k.value for k in call.keywords if k.arg is None]

        # Generated form: for key, value in kw.items(): add_argument(*extra, f"--{key.replace('_', '-')}", **value)
        if any(isinstance(a, ast.JoinedStr) for a in call.args):
            self._add_generated(where, call, env, loops)
            return

        options: list[list[str]] = [[]]
        for arg in call.args:
            text = const_str(arg)
            if text is not None:
                for row in options:
                    row.append(text)
                continue
            if isinstance(arg, ast.Name) and call in loops:
                _, rows = loops[call]
                values = [const_str(r.get(arg.id)) for r in rows]
                if rows and all(v is not None for v in values):
                    options = [row + [v] for row in options for v in values]  # type: ignore[list-item]
                    continue
            raise ExtractionError(f"{where}: unsupported add_argument option {ast.unparse(arg)!r}")

        if action is not None:
            boolean = ast.unparse(action).endswith("BooleanOptionalAction")
        else:
            boolean = False
            for s in spread:
                ref = self._kwargs_expr(s, env)
                if ref is None or ref.field_name is None:
                    raise ExtractionError(f"{where}: cannot resolve **{ast.unparse(s)}")
                if isinstance(s, ast.Dict) and any(const_str(k) == "action" for k in s.keys if k is not None):
                    continue
                act = overrides.get((ref.field_name, "action"))
                if act is not None:
                    boolean = ast.unparse(act).endswith("BooleanOptionalAction")
                else:
                    boolean = field_is_boolean_flag(self.ws, ref.cls, ref.field_name, self.sem)
        for row in options:
            if row and not row[0].startswith("-"):
                continue  # positional argument (model_tag)
            self.flags.add(row, boolean, deprecated)

    def _add_generated(self, where: str, call: ast.Call, env: Mapping[str, _KwargsRef],
                       loops: Mapping[ast.AST, tuple[ast.For, list[dict[str, ast.expr]]]]) -> None:
        """Options generated from every field of a ``get_kwargs(cls)`` dict (FrontendArgs.add_cli_args)."""
        if call not in loops:
            raise ExtractionError(f"{where}: f-string option outside a loop")
        loop, _ = loops[call]
        it = loop.iter
        if not (isinstance(it, ast.Call) and isinstance(it.func, ast.Attribute) and it.func.attr == "items"
                and isinstance(it.func.value, ast.Name) and it.func.value.id in env
                and isinstance(loop.target, ast.Tuple) and len(loop.target.elts) == 2):
            raise ExtractionError(f"{where}: unsupported generated add_argument loop")
        key_var = loop.target.elts[0]
        joined = next(a for a in call.args if isinstance(a, ast.JoinedStr))
        pattern = ast.unparse(joined)
        expected = {f"f\"--{{{key_var.id}.replace('_', '-')}}\"",  # type: ignore[attr-defined]
                    f"f'--{{{key_var.id}.replace(\"_\", \"-\")}}'"}  # type: ignore[attr-defined]
        if pattern not in expected:
            raise ExtractionError(f"{where}: unsupported generated option pattern {pattern}")
        ref = env[it.func.value.id]
        cls = ref.cls
        fields = dataclass_fields(self.ws, cls)
        overrides: dict[tuple[str, str], ast.expr | None] = {}
        for c in class_mro(self.ws, cls):
            for method in class_methods(c.node).values():  # type: ignore[arg-type]
                for k, v in self._kwargs_overrides(method).items():
                    overrides.setdefault(k, v)
        for fname in sorted(fields):
            if (fname, "del") in overrides:
                continue
            options = ["--" + fname.replace("_", "-")]
            extra = overrides.get((fname, "flags"))
            if isinstance(extra, (ast.List, ast.Tuple)):
                options = [s for s in (const_str(e) for e in extra.elts) if s] + options
            act = overrides.get((fname, "action"))
            if act is not None:
                boolean = ast.unparse(act).endswith("BooleanOptionalAction")
            else:
                boolean = field_is_boolean_flag(self.ws, cls, fname, self.sem)
            self.flags.add(options, boolean, False)


def extract_serve_flags(vllm: SourceTree, vllm_ascend: SourceTree | None = None) -> ServeFlags:
    """Every option ``vllm serve`` accepts.

    Starts at ``subparser_init`` in vllm/entrypoints/cli/serve.py and follows each call that is
    handed the parser: ``make_arg_parser`` (vllm/entrypoints/openai/cli_args.py: ``--headless``,
    ``--api-server-count``, ``FrontendArgs.add_cli_args``) and ``AsyncEngineArgs.add_cli_args`` /
    ``EngineArgs.add_cli_args`` (vllm/engine/arg_utils.py). ``add_argument("--x", **kw["field"])``
    gets ``--no-x`` when the config field's annotation makes ``get_kwargs`` choose
    ``argparse.BooleanOptionalAction``; explicit ``action=`` wins. The platform hook
    ``current_platform.pre_register_and_update(parser)`` is read from vllm_ascend/platform.py.
    """
    ws = Workspace(*(t for t in (vllm, vllm_ascend) if t is not None))
    arg_utils = vllm.module("vllm/engine/arg_utils.py")
    walker = _ServeFlagWalker(ws, read_type_hint_semantics(arg_utils))
    serve_path = "vllm/entrypoints/cli/serve.py"
    started = False
    for owner, func in functions(vllm.module(serve_path)):
        if func.name == "subparser_init":
            owner_def = Definition(module_name(serve_path), owner) if owner else None
            walker.walk(module_name(serve_path), func, owner_def, owner_def)
            started = True
    if not started:
        raise ExtractionError(f"{serve_path}: no subparser_init found")
    if vllm_ascend is not None:
        for path in vllm_ascend.grep("def pre_register_and_update", "vllm_ascend/"):
            for owner, func in functions(vllm_ascend.module(path)):
                if func.name == "pre_register_and_update":
                    owner_def = Definition(module_name(path), owner) if owner else None
                    walker.walk(module_name(path), func, owner_def, owner_def)
    if not walker.flags.long:
        raise ExtractionError("no serve flags found")
    return walker.flags


# --------------------------------------------------------------------------- #
# 2. environment variables
# --------------------------------------------------------------------------- #


def _env_table_name(mod: ast.Module) -> str | None:
    """The dict the module-level ``__getattr__`` indexes (``environment_variables[name]()``)."""
    for node in mod.body:
        if isinstance(node, ast.FunctionDef) and node.name == "__getattr__":
            for sub in ast.walk(node):
                if isinstance(sub, ast.Subscript) and isinstance(sub.value, ast.Name):
                    return sub.value.id
    return None


def extract_env_table(tree: SourceTree, path: str) -> list[str]:
    """Keys of the environment-variable table in ``path`` (vllm/envs.py or vllm_ascend/envs.py).

    The table is the module-level dict the module ``__getattr__`` looks names up in
    (``environment_variables`` in vLLM, ``env_variables`` in vLLM-Ascend); later
    ``table["X"] = ...`` and ``table.update({...})`` statements are included.
    """
    mod = tree.module(path)
    table = _env_table_name(mod)
    if table is None:
        raise ExtractionError(f"{path}: no __getattr__ table lookup found")
    keys: set[str] = set()
    for node in mod.body:
        value = None
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == table for t in node.targets) or isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == table:
            value = node.value
        if isinstance(value, ast.Dict):
            for k in value.keys:
                s = const_str(k)
                if s is None:
                    raise ExtractionError(f"{path}:{node.lineno}: non-literal key in {table}")
                keys.add(s)
    for node in ast.walk(mod):
        if isinstance(node, ast.Assign):
            for t in node.targets:
                if isinstance(t, ast.Subscript) and isinstance(t.value, ast.Name) and t.value.id == table:
                    if const_str(t.slice):
                        keys.add(const_str(t.slice))  # type: ignore[arg-type]
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "update"
                and isinstance(node.func.value, ast.Name) and node.func.value.id == table):
            for a in node.args:
                if isinstance(a, ast.Dict):
                    keys.update(s for s in (const_str(k) for k in a.keys) if s)
    if not keys:
        raise ExtractionError(f"{path}: empty environment table {table}")
    return sorted(keys)


def _os_environ_aliases(mod: ast.Module) -> tuple[set[str], set[str]]:
    """Dotted spellings of ``os.environ`` and ``os.getenv`` in a module (handles ``from os import environ``)."""
    environ = {"os.environ"}
    getenv = {"os.getenv"}
    for node in ast.walk(mod):
        if isinstance(node, ast.ImportFrom) and node.module == "os" and not node.level:
            for alias in node.names:
                if alias.name == "environ":
                    environ.add(alias.asname or "environ")
                if alias.name == "getenv":
                    getenv.add(alias.asname or "getenv")
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "os" and alias.asname:
                    environ.add(f"{alias.asname}.environ")
                    getenv.add(f"{alias.asname}.getenv")
    return environ, getenv


def env_reads_in_module(mod: ast.Module) -> set[str]:
    """Names read with ``os.getenv("X")``, ``os.environ.get("X")``, ``os.environ["X"]``, ``"X" in os.environ``."""
    environ, getenv = _os_environ_aliases(mod)
    names: set[str] = set()
    for node in ast.walk(mod):
        if isinstance(node, ast.Call) and node.args:
            fn = dotted(node.func)
            first = const_str(node.args[0])
            if first is None:
                continue
            if fn in getenv or isinstance(node.func, ast.Attribute) and node.func.attr == "get" and dotted(node.func.value) in environ:
                names.add(first)
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
            if dotted(node.value) in environ and const_str(node.slice):
                names.add(const_str(node.slice))  # type: ignore[arg-type]
        elif isinstance(node, ast.Compare) and len(node.ops) == 1 and isinstance(node.ops[0], (ast.In, ast.NotIn)):
            if dotted(node.comparators[0]) in environ and const_str(node.left):
                names.add(const_str(node.left))  # type: ignore[arg-type]
    return names


def env_writes_in_module(mod: ast.Module) -> set[str]:
    """Names assigned with ``os.environ["X"] = ...`` or ``os.environ.setdefault("X", ...)``."""
    environ, _ = _os_environ_aliases(mod)
    names: set[str] = set()
    for node in ast.walk(mod):
        if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Store):
            if dotted(node.value) in environ and const_str(node.slice):
                names.add(const_str(node.slice))  # type: ignore[arg-type]
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "setdefault"
              and dotted(node.func.value) in environ and node.args and const_str(node.args[0])):
            names.add(const_str(node.args[0]))  # type: ignore[arg-type]
    return names


def extract_env_writes(tree: SourceTree, package: str) -> list[str]:
    """Environment variables the ``package`` sets for itself / its children (informational)."""
    names: set[str] = set()
    for path in tree.grep("environ", package + "/"):
        names |= env_writes_in_module(tree.module(path))
    return sorted(names)


def extract_direct_env_reads(tree: SourceTree, package: str, table_path: str = "",
                             table_keys: Iterable[str] = ()) -> list[str]:
    """Environment variables the ``package`` (every .py under vllm_ascend/) reads directly through
    ``os.getenv`` / ``os.environ``. Inside ``table_path`` (vllm_ascend/envs.py) the table's own
    getters are not counted: there only names that are not table keys are kept."""
    keys = set(table_keys)
    names: set[str] = set()
    for path in tree.paths(package + "/"):
        text = tree.text(path)
        if "environ" not in text and "getenv" not in text:
            continue
        found = env_reads_in_module(tree.module(path))
        names |= found - keys if path == table_path else found
    return sorted(names)


# --------------------------------------------------------------------------- #
# 3. additional_config
# --------------------------------------------------------------------------- #


def is_additional_config(node: ast.AST) -> bool:
    """A Name or attribute whose name ends in ``additional_config``."""
    name = terminal_name(node)
    return bool(name and name.endswith("additional_config"))


_DICT_READERS = {"get", "pop", "setdefault"}


def dict_key_read(node: ast.AST) -> tuple[ast.AST, str] | None:
    """(container, key) for ``c.get("k", ...)``, ``c["k"]`` (load) or ``"k" in c``."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _DICT_READERS:
        if node.args and const_str(node.args[0]) is not None:
            return node.func.value, const_str(node.args[0])  # type: ignore[return-value]
    if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) and const_str(node.slice) is not None:
        return node.value, const_str(node.slice)  # type: ignore[return-value]
    if isinstance(node, ast.Compare) and len(node.ops) == 1 and isinstance(node.ops[0], (ast.In, ast.NotIn)):
        if const_str(node.left) is not None:
            return node.comparators[0], const_str(node.left)  # type: ignore[return-value]
    return None


@dataclass(frozen=True)
class _KeyHelper:
    """A function ``f(cfg, key, ...)`` that reads ``cfg[key]`` (e.g. AscendConfig._get_config_value)."""

    name: str
    cfg_index: int
    key_index: int


def find_key_helpers(mod: ast.Module) -> list[_KeyHelper]:
    """Functions in ``mod`` that read a dict parameter with another parameter as key.

    Indexes are as seen by a caller: for a method (not static) the ``self``/``cls`` parameter is skipped.
    """
    helpers: list[_KeyHelper] = []
    for owner, func in functions(mod):
        params = positional_params(func)
        offset = 1 if owner is not None and not is_staticmethod(func) and params and params[0] in {"self", "cls"} else 0
        for node in ast.walk(func):
            cont = key = None
            if isinstance(node, ast.Compare) and len(node.ops) == 1 and isinstance(node.ops[0], (ast.In, ast.NotIn)):
                key, cont = node.left, node.comparators[0]
            elif isinstance(node, ast.Subscript):
                key, cont = node.slice, node.value
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get" and node.args:
                key, cont = node.args[0], node.func.value
            if isinstance(key, ast.Name) and isinstance(cont, ast.Name) and key.id in params and cont.id in params:
                helpers.append(_KeyHelper(func.name, params.index(cont.id) - offset, params.index(key.id) - offset))
                break
    return helpers


@dataclass
class AdditionalConfig:
    """Keys read from ``--additional-config``: "" for top level, one entry per section."""

    keys: dict[str, set[str]] = field(default_factory=lambda: {"": set()})
    section_classes: dict[str, set[str]] = field(default_factory=dict)
    open_sections: dict[str, str] = field(default_factory=dict)

    def add(self, section: str, key: str) -> None:
        self.keys.setdefault(section, set()).add(key)


def _section_of(node: ast.AST) -> str | None:
    """``additional_config.get("s", ...)`` / ``additional_config["s"]`` (also ``... or {}``) -> "s"."""
    if isinstance(node, ast.BoolOp):
        for v in node.values:
            s = _section_of(v)
            if s is not None:
                return s
        return None
    read = dict_key_read(node)
    if read is not None and is_additional_config(read[0]) and not isinstance(node, ast.Compare):
        return read[1]
    return None


def _scope_key(node: ast.AST) -> str | None:
    """A name for a local (``x``) or an instance attribute (``self.x``)."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
        return "self." + node.attr
    return None


def keys_read_by_config_class(ws: Workspace, cls: Definition, arg_index: int | None,
                              result: AdditionalConfig, section: str) -> None:
    """Keys a config class reads from the section dict passed to it.

    ``arg_index`` is the positional index of the dict in the constructor call, or None for
    ``Cls(**section)``. Recognised: ``param.get("k")`` / ``param["k"]`` / ``"k" in param`` in
    ``__init__``; keys of a class-level ``_defaults``-like dict; for ``**section`` the named
    ``__init__`` parameters, ``kwargs.get("k")`` and dataclass fields; a ``for k, v in
    param.items(): setattr(self, k, v)`` copy marks the section open (see caller).
    """
    node = cls.node
    assert isinstance(node, ast.ClassDef)
    result.section_classes.setdefault(section, set()).add(node.name)
    for stmt in node.body:
        if isinstance(stmt, (ast.Assign, ast.AnnAssign)) and isinstance(stmt.value, ast.Dict):
            if any("default" in n.lower() for n in _assigned_names(stmt)):
                for k in stmt.value.keys:
                    if const_str(k):
                        result.add(section, const_str(k))  # type: ignore[arg-type]
    init = class_methods(node).get("__init__")
    if init is None:
        if arg_index is None and is_dataclass_def(node):
            for fname in dataclass_fields(ws, cls):
                result.add(section, fname)
        return
    params = positional_params(init)[1:]
    kwonly = [a.arg for a in init.args.kwonlyargs]
    if arg_index is None:
        for p in params + kwonly:
            result.add(section, p)
        watched = {init.args.kwarg.arg} if init.args.kwarg else set()
    else:
        if arg_index >= len(params):
            return
        watched = {params[arg_index]}
    for sub in ast.walk(init):
        read = dict_key_read(sub)
        if read is not None and isinstance(read[0], ast.Name) and read[0].id in watched:
            result.add(section, read[1])
        if (isinstance(sub, ast.For) and isinstance(sub.iter, ast.Call) and isinstance(sub.iter.func, ast.Attribute)
                and sub.iter.func.attr == "items" and isinstance(sub.iter.func.value, ast.Name)
                and sub.iter.func.value.id in watched
                and any(isinstance(c, ast.Call) and terminal_name(c.func) == "setattr" for c in ast.walk(sub))):
            _open_section(ws, cls, result, section)


def _open_section(ws: Workspace, cls: Definition, result: AdditionalConfig, section: str) -> None:
    """A section copied wholesale onto the config object: its keys are the fields of the dataclass
    of the same name that is later built from it (0.11: vllm_ascend/core/schedule_config.py
    AscendSchedulerConfig, a subclass of vLLM's SchedulerConfig)."""
    name = cls.node.name  # type: ignore[attr-defined]
    target = None
    for tree in ws.trees:
        for path in tree.grep(f"class {name}"):
            for n in tree.module(path).body:
                if isinstance(n, ast.ClassDef) and n.name == name and n is not cls.node and is_dataclass_def(n):
                    target = Definition(module_name(path), n)
    if target is None:
        result.open_sections[section] = f"any key (copied onto {cls.module}.{name})"
        return
    for fname in dataclass_fields(ws, target, init_only=True):
        result.add(section, fname)
    result.open_sections[section] = (
        f"copied onto {cls.module}.{name}; keys are the fields of dataclass {target.module}.{name} and its bases")


def extract_additional_config(vllm_ascend: SourceTree, vllm: SourceTree | None = None) -> AdditionalConfig:
    """Keys read from ``--additional-config`` anywhere under vllm_ascend/.

    Top level: ``<x>additional_config.get("k")`` / ``[...]`` / ``"k" in``, and helper calls such as
    ``self._get_config_value(additional_config, "k", ...)`` (vllm_ascend/ascend_config.py).
    Sections: a variable or ``self.attr`` bound to ``additional_config.get("s", default)`` and then
    read with string keys, passed to a config class (``EplbConfig(eplb_config)``,
    ``AscendCompilationConfig(**cfg)``; see :func:`keys_read_by_config_class`), or chained
    (``additional_config.get("s", {}).get("k")``); keys of a literal dict default count too.
    """
    ws = Workspace(*(t for t in (vllm_ascend, vllm) if t is not None))
    result = AdditionalConfig()
    for path in vllm_ascend.grep("additional_config", "vllm_ascend/"):
        mod = vllm_ascend.module(path)
        modname = module_name(path)
        helpers = find_key_helpers(mod)
        for node in ast.walk(mod):
            read = dict_key_read(node)
            if read is not None and is_additional_config(read[0]):
                result.add("", read[1])
            if isinstance(node, ast.Call):
                name = terminal_name(node.func)
                for h in helpers:
                    if name == h.name and max(h.cfg_index, h.key_index) < len(node.args):
                        if is_additional_config(node.args[h.cfg_index]) and const_str(node.args[h.key_index]):
                            result.add("", const_str(node.args[h.key_index]))  # type: ignore[arg-type]
            # chained: additional_config.get("s", {}).get("k") / additional_config["s"]["k"]
            if read is not None and not isinstance(node, ast.Compare):
                section = _section_of(read[0])
                if section is not None:
                    result.add(section, read[1])
        _sections_in_module(ws, vllm_ascend, modname, mod, result)
    for section in list(result.keys):
        if section:
            result.keys[""].add(section)
    return result


def _sections_in_module(ws: Workspace, tree: SourceTree, modname: str, mod: ast.Module,
                        result: AdditionalConfig) -> None:
    """Section bindings in one module; locals are scoped to their function, ``self.x`` to the class."""
    scopes = [n for n in mod.body if isinstance(n, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))]
    for bind_scope in scopes:
        funcs = [f for f in ast.walk(bind_scope) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))]
        for func in funcs:
            bindings: dict[str, str] = {}
            for node in ast.walk(func):
                targets: list[ast.AST] = []
                value = None
                if isinstance(node, ast.Assign):
                    targets, value = list(node.targets), node.value
                elif isinstance(node, ast.AnnAssign) and node.value is not None:
                    targets, value = [node.target], node.value
                if value is None:
                    continue
                section = _section_of(value)
                if section is None:
                    continue
                _literal_default_keys(value, section, result)
                for t in targets:
                    key = _scope_key(t)
                    if key is not None:
                        bindings[key] = section
            if not bindings:
                continue
            local = {k: v for k, v in bindings.items() if not k.startswith("self.")}
            attrs = {k: v for k, v in bindings.items() if k.startswith("self.")}
            _section_uses(ws, modname, func, local, result)
            if attrs and isinstance(bind_scope, ast.ClassDef):
                _section_uses(ws, modname, bind_scope, attrs, result)


def _literal_default_keys(value: ast.AST, section: str, result: AdditionalConfig) -> None:
    """``additional_config.get("s", {"a": 1})``: the default's keys are keys of section s."""
    if isinstance(value, ast.Call) and len(value.args) > 1 and isinstance(value.args[1], ast.Dict):
        result.keys.setdefault(section, set())
        for k in value.args[1].keys:
            if const_str(k):
                result.add(section, const_str(k))  # type: ignore[arg-type]


def _section_uses(ws: Workspace, modname: str, scope: ast.AST, bindings: Mapping[str, str],
                  result: AdditionalConfig) -> None:
    """Reads and constructor calls on section-bound names inside ``scope``."""
    for node in ast.walk(scope):
        read = dict_key_read(node)
        if read is not None:
            key = _scope_key(read[0])
            if key in bindings:
                result.add(bindings[key], read[1])
        if not isinstance(node, ast.Call):
            continue
        cls_name = terminal_name(node.func)
        if not cls_name or not cls_name[:1].isupper():
            continue
        for i, arg in enumerate(node.args):
            key = _scope_key(arg)
            if key in bindings:
                _class_keys(ws, modname, cls_name, i, bindings[key], result)
        for kw in node.keywords:
            key = _scope_key(kw.value)
            if kw.arg is None and key in bindings:
                _class_keys(ws, modname, cls_name, None, bindings[key], result)


def _class_keys(ws: Workspace, modname: str, cls_name: str, index: int | None, section: str,
                result: AdditionalConfig) -> None:
    found = ws.resolve(modname, cls_name)
    if found is None or not isinstance(found.node, ast.ClassDef):
        found = ws.find_class_anywhere(cls_name, prefer="vllm_ascend/")
    if found is None or not isinstance(found.node, ast.ClassDef):
        raise ExtractionError(f"{modname}: section {section!r} passed to unknown class {cls_name}")
    keys_read_by_config_class(ws, found, index, result, section)


# --------------------------------------------------------------------------- #
# 4. KV connectors
# --------------------------------------------------------------------------- #


@dataclass(frozen=True)
class Connector:
    name: str
    module: str
    cls: str
    origin: str  # "vllm" | "vllm_ascend"
    path: str  # file holding the register_connector call


def _import_guard(call: ast.AST, parents: Mapping[ast.AST, ast.AST]) -> list[str]:
    """Modules a ``try: import m ... except ImportError: ... else: <call>`` guard requires."""
    needed: list[str] = []
    child, cur = call, parents.get(call)
    while cur is not None:
        if isinstance(cur, ast.Try) and child in cur.orelse:
            for stmt in cur.body:
                if isinstance(stmt, ast.Import):
                    needed += [a.name for a in stmt.names]
                elif isinstance(stmt, ast.ImportFrom) and stmt.module and not stmt.level:
                    needed.append(stmt.module)
        child, cur = cur, parents.get(cur)
    return needed


def register_connector_calls(tree: SourceTree, package: str, workspace: Workspace | None = None) -> list[Connector]:
    """``KVConnectorFactory.register_connector("Name", "module.path", "Class")`` calls under ``package``/
    (vllm: vllm/distributed/kv_transfer/kv_connector/factory.py; vllm_ascend: its register_connector()).

    A call in the ``else:`` of ``try: import m / except ImportError`` is kept only when module ``m``
    exists in ``workspace`` (0.23 overrides SimpleCPUOffloadConnector only if vllm.v1.simple_kv_offload exists).
    """
    out: list[Connector] = []
    for path in tree.grep("register_connector", package + "/"):
        mod = tree.module(path)
        parents = parent_map(mod)
        for node in ast.walk(mod):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "register_connector"
                    and terminal_name(node.func.value) == "KVConnectorFactory"):
                continue  # (ECConnectorFactory in vllm/distributed/ec_transfer is a different registry)
            args = [const_str(a) for a in node.args]
            kw = {k.arg: const_str(k.value) for k in node.keywords if k.arg}
            name = args[0] if len(args) > 0 else kw.get("name")
            mod = args[1] if len(args) > 1 else kw.get("module_path")
            cls = args[2] if len(args) > 2 else kw.get("class_name")
            if name and mod and cls:
                guard = _import_guard(node, parents)
                if workspace is not None and any(workspace.locate(m) is None for m in guard):
                    continue
                out.append(Connector(name, mod, cls, package, path))
            elif node.args or node.keywords:
                raise ExtractionError(f"{path}:{node.lineno}: non-literal register_connector call")
    return out


def extract_kv_connectors(vllm: SourceTree, vllm_ascend: SourceTree) -> dict[str, Connector]:
    """The effective KV connector registry once the vllm_ascend plugin has run.

    vLLM registers its connectors at import of vllm/distributed/kv_transfer/kv_connector/factory.py;
    vLLM-Ascend's ``register_connector()`` general plugin (vllm_ascend/distributed/.../__init__.py)
    runs later and, where it re-registers a name (after popping it), replaces vLLM's entry.
    """
    ws = Workspace(vllm, vllm_ascend)
    registry: dict[str, Connector] = {}
    for c in register_connector_calls(vllm, "vllm", ws):
        if c.name in registry:
            raise ExtractionError(f"{c.path}: connector {c.name} registered twice in vllm")
        registry[c.name] = c
    for c in register_connector_calls(vllm_ascend, "vllm_ascend", ws):
        registry[c.name] = c
    return registry


def extract_connector_modules(vllm: SourceTree, vllm_ascend: SourceTree,
                              registered: Iterable[Connector]) -> tuple[list[str], list[str]]:
    """(importable connector modules, registered modules with no file).

    A connector module is a file under vllm/distributed/ or vllm_ascend/distributed/ that defines a
    subclass (transitively, by base-class name) of ``KVConnectorBase_V1`` / ``KVConnectorBase``
    (vllm/distributed/kv_transfer/kv_connector/v1/base.py), or a module named in a
    register_connector call that exists in the tree.
    """
    classes: list[tuple[str, str, set[str]]] = []  # (module, class, base names)
    for tree, prefix in ((vllm, "vllm/distributed/"), (vllm_ascend, "vllm_ascend/distributed/")):
        for path in tree.paths(prefix):
            for node in tree.module(path).body:
                if isinstance(node, ast.ClassDef):
                    bases = {terminal_name(b) for b in node.bases} - {None}
                    classes.append((module_name(path), node.name, bases))  # type: ignore[arg-type]
    connector_names = {"KVConnectorBase_V1", "KVConnectorBase"}
    changed = True
    while changed:
        changed = False
        for _, cname, bases in classes:
            if cname not in connector_names and bases & connector_names:
                connector_names.add(cname)
                changed = True
    modules = {m for m, cname, bases in classes if bases & connector_names}
    missing: set[str] = set()
    for c in registered:
        tree = vllm if c.origin == "vllm" else vllm_ascend
        if module_path(tree, c.module) is not None:
            modules.add(c.module)
        else:
            missing.add(c.module)
    modules.discard("vllm.distributed.kv_transfer.kv_connector.v1.base")
    return sorted(modules), sorted(missing)


# --------------------------------------------------------------------------- #
# 5. expert map and EPLB policies
# --------------------------------------------------------------------------- #


def _json_loaded_names(func: ast.AST) -> set[str]:
    names = set()
    for node in ast.walk(func):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and dotted(node.value.func) in {"json.load", "json.loads"}:
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return names


def _root_name(node: ast.AST) -> str | None:
    while isinstance(node, (ast.Subscript, ast.Attribute, ast.Call)):
        node = node.value if not isinstance(node, ast.Call) else node.func
    return node.id if isinstance(node, ast.Name) else None


def _opens(func: ast.AST, suffix: str) -> bool:
    """Whether the function ``open()``s a path held in a name/attribute ending in ``suffix``."""
    for node in ast.walk(func):
        if isinstance(node, ast.Call) and terminal_name(node.func) == "open" and node.args:
            name = terminal_name(node.args[0])
            if name and name.endswith(suffix):
                return True
    return False


def json_keys_read(func: ast.AST) -> set[str]:
    """String keys read from the result of ``json.load`` in ``func``, following loop variables and
    assignments derived from it (``for layer in data["layer_list"]: layer["device_list"]``)."""
    tainted = _json_loaded_names(func)
    keys: set[str] = set()
    changed = True
    while changed:
        changed = False
        for node in ast.walk(func):
            if isinstance(node, ast.For) and isinstance(node.target, ast.Name) and _root_name(node.iter) in tainted:
                if node.target.id not in tainted:
                    tainted.add(node.target.id)
                    changed = True
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Subscript) and _root_name(node.value) in tainted:
                for t in node.targets:
                    if isinstance(t, ast.Name) and t.id not in tainted:
                        tainted.add(t.id)
                        changed = True
    for node in ast.walk(func):
        read = dict_key_read(node)
        if read is not None and _root_name(read[0]) in tainted:
            keys.add(read[1])
    return keys


def json_keys_written(func: ast.AST) -> set[str]:
    """String keys of dict literals and subscripts in a function that ``json.dump``s its result."""
    keys: set[str] = set()
    for node in ast.walk(func):
        if isinstance(node, ast.Dict):
            keys.update(s for s in (const_str(k) for k in node.keys) if s)
        elif isinstance(node, ast.Subscript) and const_str(node.slice):
            keys.add(const_str(node.slice))  # type: ignore[arg-type]
    return keys


@dataclass
class ExpertMapKeys:
    read: set[str] = field(default_factory=set)
    written: set[str] = field(default_factory=set)
    readers: set[str] = field(default_factory=set)
    writers: set[str] = field(default_factory=set)


def extract_expert_map_keys(vllm_ascend: SourceTree) -> ExpertMapKeys:
    """JSON keys of the expert map file.

    Readers: functions under vllm_ascend/ that ``open()`` an ``...expert_map_path`` and
    ``json.load`` it (0.23: vllm_ascend/eplb/core/eplb_utils.py ``expert_file_to_tensor``; 0.11:
    vllm_ascend/ops/expert_load_balancer.py and vllm_ascend/eplb/adaptor/vllm_adaptor.py).
    Writers: functions that ``open()`` an ``...expert_map_record_path`` and ``json.dump``
    (vllm_ascend/eplb/adaptor/vllm_adaptor.py ``_export_tensor_to_file``).
    """
    out = ExpertMapKeys()
    for path in vllm_ascend.grep("json", "vllm_ascend/"):
        mod = vllm_ascend.module(path)
        for owner, func in functions(mod):
            where = f"{module_name(path)}.{owner.name + '.' if owner else ''}{func.name}"
            calls = {dotted(n.func) for n in ast.walk(func) if isinstance(n, ast.Call)}
            if calls & {"json.load", "json.loads"} and _opens(func, "expert_map_path"):
                keys = json_keys_read(func)
                if keys:
                    out.read |= keys
                    out.readers.add(where)
            if "json.dump" in calls and _opens(func, "expert_map_record_path"):
                out.written |= json_keys_written(func)
                out.writers.add(where)
    return out


def extract_eplb_policies(vllm_ascend: SourceTree) -> dict[int, str]:
    """``{policy_type: class name}`` from the int-keyed dict in ``PolicyFactory.generate_policy``
    (vllm_ascend/eplb/core/policy/policy_factory.py); empty when the release has no factory."""
    policies: dict[int, str] = {}
    for path in vllm_ascend.grep("def generate_policy", "vllm_ascend/"):
        for _, func in functions(vllm_ascend.module(path)):
            if func.name != "generate_policy":
                continue
            for node in ast.walk(func):
                if isinstance(node, ast.Dict) and node.keys and all(
                        isinstance(k, ast.Constant) and isinstance(k.value, int) for k in node.keys):
                    for k, v in zip(node.keys, node.values):
                        name = terminal_name(v)
                        if name:
                            policies[k.value] = name  # type: ignore[union-attr]
    return policies


# --------------------------------------------------------------------------- #
# 6. Prometheus metrics
# --------------------------------------------------------------------------- #

_METRIC_TYPES = {"gauge": "gauge", "counter": "counter", "histogram": "histogram", "summary": "summary"}


def metric_type_of(func: ast.AST) -> str | None:
    """``Gauge`` / ``prometheus_client.Counter`` / ``self._histogram_cls`` -> gauge|counter|histogram."""
    name = terminal_name(func)
    if not name:
        return None
    low = name.lower().strip("_")
    for suffix in ("_cls", "cls"):
        if low.endswith(suffix):
            low = low[: -len(suffix)].rstrip("_")
    return _METRIC_TYPES.get(low)


def base_metric_name(name: str, mtype: str) -> str:
    """prometheus_client drops a ``_total`` suffix from Counter names (and re-adds it on exposition)."""
    if mtype == "counter" and name.endswith("_total"):
        return name[: -len("_total")]
    return name


@dataclass
class Metric:
    name: str
    type: str
    module: str
    hidden: bool


def metrics_in_module(mod: ast.Module, modname: str, prefix: str = "vllm:") -> list[Metric]:
    """Metric constructions in a module: ``Gauge(name="vllm:x")``, ``self._counter_cls(name=...)``, or a
    name held in a local variable assigned string literals. ``hidden`` marks constructions guarded by
    ``if ...show_hidden_metrics`` (registered only with --show-hidden-metrics-for-version)."""
    parents = parent_map(mod)
    found: list[Metric] = []
    for node in ast.walk(mod):
        if not isinstance(node, ast.Call):
            continue
        mtype = metric_type_of(node.func)
        if mtype is None:
            continue
        name_node = next((k.value for k in node.keywords if k.arg == "name"), node.args[0] if node.args else None)
        if name_node is None:
            continue
        names: list[str] = []
        if const_str(name_node) is not None:
            names = [const_str(name_node)]  # type: ignore[list-item]
        elif isinstance(name_node, ast.Name):
            scope = node
            while scope in parents and not isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)):
                scope = parents[scope]
            for sub in ast.walk(scope):
                if isinstance(sub, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name_node.id for t in sub.targets):
                    if const_str(sub.value) is not None:
                        names.append(const_str(sub.value))  # type: ignore[arg-type]
        hidden = False
        cur: ast.AST = node
        while cur in parents:
            cur = parents[cur]
            if isinstance(cur, ast.If) and "show_hidden_metrics" in ast.unparse(cur.test):
                hidden = True
        for n in names:
            if n.startswith(prefix):
                found.append(Metric(base_metric_name(n, mtype), mtype, modname, hidden))
    return found


def is_module_referenced(tree: SourceTree, package: str, modname: str) -> bool:
    """Whether any other module of ``package`` imports ``modname`` (absolute or relative import,
    at any depth) or names it in a string literal (lazy loading, e.g. a connector registry).

    Files are pre-filtered by text (they must mention the module's last name component) before
    their AST is inspected.
    """
    leaf = modname.rpartition(".")[2]
    word = re.compile(rf"\b{re.escape(leaf)}\b")
    for path in tree.paths(package + "/"):
        other = module_name(path)
        if other == modname:
            continue
        text = tree.text(path)
        if leaf not in text or not word.search(text):
            continue
        mod = tree.module(path)
        if modname in imported_modules(mod, other, path.endswith("__init__.py")):
            return True
        if modname in text and any(const_str(n) == modname for n in ast.walk(mod)):
            return True
    return False


def extract_metrics(tree: SourceTree, package: str) -> tuple[dict[str, Metric], list[str]]:
    """Prometheus metrics (``vllm:`` names) constructed anywhere under ``package``/.

    For vLLM this is chiefly vllm/v1/metrics/loggers.py, vllm/v1/spec_decode/metrics.py,
    vllm/v1/metrics/perf.py and the KV connector stats modules. Modules that no other module
    imports or names (dead code such as 0.11's V0 vllm/engine/metrics.py) are skipped and returned.
    """
    candidates = [p for p in tree.grep('"vllm:', package + "/") + tree.grep("'vllm:", package + "/")]
    candidates = sorted(set(candidates))
    metrics: dict[str, Metric] = {}
    skipped: list[str] = []
    for path in candidates:
        modname = module_name(path)
        found = metrics_in_module(tree.module(path), modname)
        if not found:
            continue
        if not is_module_referenced(tree, package, modname):
            skipped.append(modname)
            continue
        for m in found:
            prev = metrics.get(m.name)
            if prev is not None and prev.type != m.type:
                raise ExtractionError(f"metric {m.name} is a {prev.type} in {prev.module} and a {m.type} in {modname}")
            if prev is None or (prev.hidden and not m.hidden):
                metrics[m.name] = m
    return metrics, sorted(skipped)


# --------------------------------------------------------------------------- #
# 7. JSON-valued serve options (--kv-transfer-config, --speculative-config, --compilation-config)
# --------------------------------------------------------------------------- #

#: ``vllm serve`` options whose JSON value vLLM builds a config dataclass from (``@config`` pydantic dataclasses
#: forbid unknown keys), and the class each is parsed into.
JSON_OPTION_CLASSES: dict[str, tuple[str, str]] = {
    "--kv-transfer-config": ("vllm.config.kv_transfer", "KVTransferConfig"),
    "--speculative-config": ("vllm.config.speculative", "SpeculativeConfig"),
    "--compilation-config": ("vllm.config.compilation", "CompilationConfig"),
}


@dataclass
class JsonOptions:
    """What the JSON-valued options accept: keys per option, and the values of the enumerated fields."""

    fields: dict[str, list[str]] = field(default_factory=dict)
    cudagraph_modes: list[str] = field(default_factory=list)
    speculative_methods: list[str] = field(default_factory=list)
    #: method -> the method ``SpeculativeConfig.__post_init__`` replaces it by (deprecated spellings).
    speculative_method_rewrites: dict[str, str] = field(default_factory=dict)


def _class_def(ws: Workspace, modname: str, name: str) -> Definition:
    defn = ws.resolve(modname, name)
    if defn is None or not isinstance(defn.node, ast.ClassDef):
        raise ExtractionError(f"class {name} not found in {modname}")
    return defn


def literal_strings(ws: Workspace, modname: str, node: ast.expr, _depth: int = 0) -> set[str]:
    """String values of a ``Literal[...]`` annotation, following module-level aliases and nested Literals.

    ``X | None`` / ``Optional[X]`` contribute the values of ``X``. Raises :class:`ExtractionError` on a member
    that is neither a string, ``None``, nor an alias of one of those.
    """
    if _depth > 8:
        raise ExtractionError(f"alias chain too deep in {modname}: {ast.unparse(node)}")
    if isinstance(node, ast.Constant):
        if node.value is None:
            return set()
        if isinstance(node.value, str):
            return {node.value}
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return literal_strings(ws, modname, node.left, _depth + 1) | literal_strings(ws, modname, node.right, _depth + 1)
    if isinstance(node, ast.Subscript) and terminal_name(node.value) in {"Literal", "Optional", "Union"}:
        args = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        out: set[str] = set()
        for arg in args:
            out |= literal_strings(ws, modname, arg, _depth + 1)
        return out
    name = terminal_name(node)
    if name == "None":
        return set()
    if name is not None:
        alias = ws.resolve(modname, name)
        if alias is not None and isinstance(alias.node, (ast.Assign, ast.AnnAssign)) and alias.node.value is not None:
            return literal_strings(ws, alias.module, alias.node.value, _depth + 1)
    raise ExtractionError(f"not a Literal of strings in {modname}: {ast.unparse(node)}")


def enum_members(defn: Definition) -> list[str]:
    """Member names of an ``enum.Enum`` class (class-level assignments to upper-case names)."""
    assert isinstance(defn.node, ast.ClassDef)
    names = [t.id for stmt in defn.node.body if isinstance(stmt, ast.Assign)
             for t in stmt.targets if isinstance(t, ast.Name) and t.id.isupper()]
    if not names:
        raise ExtractionError(f"enum {defn.node.name} in {defn.module} has no members")
    return names


def _method_rewrites(ws: Workspace, modname: str, func: ast.AST) -> dict[str, str]:
    """``if self.method in <Alias | get_args(Alias)> [and self.method != "c"]: ... self.method = "c"``."""
    out: dict[str, str] = {}
    for node in ast.walk(func):
        if not isinstance(node, ast.If):
            continue
        targets = [s.value.value for s in node.body if isinstance(s, ast.Assign) and len(s.targets) == 1
                   and dotted(s.targets[0]) == "self.method" and isinstance(s.value, ast.Constant)
                   and isinstance(s.value.value, str)]
        if not targets:
            continue
        tests = node.test.values if isinstance(node.test, ast.BoolOp) else [node.test]
        for test in tests:
            if not (isinstance(test, ast.Compare) and dotted(test.left) == "self.method"
                    and isinstance(test.ops[0], ast.In)):
                continue
            group = test.comparators[0]
            if isinstance(group, ast.Call) and terminal_name(group.func) == "get_args" and group.args:
                group = group.args[0]
            if isinstance(group, ast.Tuple):
                members = {e.value for e in group.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)}
            else:
                alias = ws.resolve(modname, terminal_name(group) or "")
                if alias is None or not isinstance(alias.node, (ast.Assign, ast.AnnAssign)):
                    continue
                value = alias.node.value
                members = ({e.value for e in value.elts if isinstance(e, ast.Constant)}
                           if isinstance(value, ast.Tuple) else literal_strings(ws, alias.module, value))
            for member in members - {targets[0]}:
                out[member] = targets[0]
    return out


def _patched_post_init(vllm_ascend: SourceTree | None, ws: Workspace) -> tuple[str, ast.AST] | None:
    """A vllm_ascend function assigned over ``SpeculativeConfig.__post_init__`` (the patch replaces vLLM's)."""
    if vllm_ascend is None:
        return None
    for path in vllm_ascend.grep("SpeculativeConfig.__post_init__", "vllm_ascend/"):
        mod = vllm_ascend.module(path)
        for node in mod.body:
            if (isinstance(node, ast.Assign) and len(node.targets) == 1
                    and dotted(node.targets[0]) == "SpeculativeConfig.__post_init__"):
                name = terminal_name(node.value)
                for fn in mod.body:
                    if isinstance(fn, ast.FunctionDef) and fn.name == name:
                        return module_name(path), fn
    return None


def extract_json_options(vllm: SourceTree, vllm_ascend: SourceTree | None = None) -> JsonOptions:
    """Keys and enumerated values of the JSON-valued options.

    Reads vllm/config/kv_transfer.py ``KVTransferConfig``, vllm/config/speculative.py ``SpeculativeConfig``
    (the ``method`` annotation's Literal values; the method spellings ``__post_init__`` rewrites, taken from
    the vllm_ascend function assigned over ``SpeculativeConfig.__post_init__`` when the plugin patches it,
    vllm_ascend/patch/platform/patch_config.py in 0.11) and vllm/config/compilation.py
    ``CompilationConfig`` / ``CUDAGraphMode``. Keys are the dataclass init fields.
    """
    ws = Workspace(vllm, *([vllm_ascend] if vllm_ascend is not None else []))
    result = JsonOptions()
    for flag, (modname, cls_name) in JSON_OPTION_CLASSES.items():
        defn = _class_def(ws, modname, cls_name)
        names = sorted(n for n in dataclass_fields(ws, defn, init_only=True) if not n.startswith("_"))
        if not names:
            raise ExtractionError(f"{cls_name} in {modname} has no dataclass fields")
        result.fields[flag] = names
    spec = _class_def(ws, "vllm.config.speculative", "SpeculativeConfig")
    fields = dataclass_fields(ws, spec)
    if "method" not in fields:
        raise ExtractionError("SpeculativeConfig has no field 'method'")
    owner, ann = fields["method"]
    result.speculative_methods = sorted(literal_strings(ws, owner.module, ann))
    patched = _patched_post_init(vllm_ascend, ws)
    if patched is not None:
        result.speculative_method_rewrites = dict(sorted(_method_rewrites(ws, patched[0], patched[1]).items()))
    else:
        post_init = class_methods(spec.node).get("__post_init__")  # type: ignore[arg-type]
        if post_init is not None:
            result.speculative_method_rewrites = dict(sorted(_method_rewrites(ws, spec.module, post_init).items()))
    result.cudagraph_modes = enum_members(_class_def(ws, "vllm.config.compilation", "CUDAGraphMode"))
    return result
