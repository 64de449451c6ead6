"""TorchScript uploads checked against an operator allow-list, before and after loading.

`torch.jit.load` compiles the archive's source (`code/**.py`) and runs the `__setstate__` of its
modules and classes while it loads, so the check has two halves:

- `check_source(data)`, before loading: every source file of the archive is tokenised and refused
  when it names a denied operator (as `torch.x`, `ops.ns.x`, a method `.x`, a bare builtin such as
  `print`, or a `getattr` string), an operator namespace or a custom-class namespace outside the
  allow-lists; the archive's pickles are refused when they name a custom class outside them.
- `check_module(module)`, after loading: every method graph of the module, of each submodule and
  of every TorchScript object it holds (forward, the methods it calls, hooks, `__setstate__`) is
  inlined and walked, blocks of If/Loop nodes included; every node kind must lie in an allowed
  namespace (`aten`, `prim`, `quantized`, ...) and outside the deny set (`DENIED`).

The deny set comes from the operator schemas (`torch._C._jit_get_all_schemas()`): operators that
take a file name or path, a Storage, a Future or Await (threads), plus the ones named in
`_EXPLICIT`: file and printing operators, forks and RPC, the profiler, global seeds, indexing
without bounds checks, views with caller-chosen sizes, strides or offsets (`as_strided`,
`_reshape_alias`: a view past its buffer reads the worker's heap), sparse tensors built without
their invariant checks, and every operator with an argument that switches a check off
(`unsafe`, `check_invariants`). Strings are checked as the parser reads them (implicit
concatenation, `+` and f-strings of constants folded), not token by token. A refusal is an
InvalidModelError (400) naming the operator.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
import unicodedata
import zipfile
from collections.abc import Iterator
from functools import cache
from typing import Any

import torch

from models.declaration import InvalidModelError

# Operator namespaces exported models use: aten and prim (scripted and traced graphs), the
# quantized kernels (torch.ao quantization), prepacked / mkldnn ones (frozen, mobile-optimised).
ALLOWED_NAMESPACES = frozenset(
    {"aten", "prim", "quantized", "_quantized", "prepacked", "mkldnn_prepacked", "prims"}
)
# torch.classes.<ns>.<Class> objects a model may hold (quantized packed weights, RNN cells).
ALLOWED_CLASS_NAMESPACES = frozenset({"quantized", "rnn", "sparse", "mkldnn"})
FILES = "reads or writes host files"
THREADS = "starts threads or tasks outside the service's bounds"
_EXPLICIT: dict[str, str] = {
    "aten::from_file": FILES,
    "aten::save": FILES,
    "aten::_print": "prints to the server's output",
    "prim::Print": "prints to the server's output",
    "prim::fork": THREADS,
    "prim::forkClosure": THREADS,
    "prim::awaitable": THREADS,
    "prim::awaitable_nowait": THREADS,
    "prim::awaitable_wait": THREADS,
    "aten::wait": THREADS,
    "prim::rpc_async": "calls other processes (RPC)",
    "prim::rpc_sync": "calls other processes (RPC)",
    "prim::rpc_remote": "calls other processes (RPC)",
    "aten::dist_backward": "calls other processes (distributed autograd)",
    "prim::profile": "profiler internals",
    "prim::profile_ivalue": "profiler internals",
    "prim::AddStatValue": "profiler internals",
    "prim::TimePoint": "profiler internals",
    "prim::PythonOp": "runs Python code",
    "prim::CallFunction": "calls a function the check cannot see",
    "prim::StaticSubgraph": "runtime internals",
    "prim::StaticRuntimeCopyOuts": "runtime internals",
    "aten::manual_seed": "changes the process's random seed",
    "aten::seed": "changes the process's random seed",
    "aten::_cufft_set_plan_cache_max_size": "changes process-wide settings",
    "aten::set_": "points a tensor at other memory (Storage)",
    "aten::set": "points a tensor at other memory (Storage)",
    "aten::set_data": "points a tensor at other memory",
    "aten::record_stream": "runtime internals",
    "aten::_unsafe_index": "indexes without bounds checks",
    "aten::_unsafe_index_put": "indexes without bounds checks",
    "aten::_unsafe_masked_index": "indexes without bounds checks",
    "aten::_unsafe_masked_index_put_accumulate": "indexes without bounds checks",
    "aten::segment_reduce": "indexes without bounds checks (unsafe=True)",
    **dict.fromkeys(
        (
            "aten::as_strided", "aten::as_strided_", "aten::as_strided_copy",
            "aten::as_strided_scatter", "prims::as_strided", "prims::as_strided_scatter",
            "aten::_reshape_alias", "aten::_reshape_alias_copy", "aten::_unsafe_view",
            "aten::_nested_view_from_buffer", "aten::_nested_view_from_buffer_copy",
            "prims::collapse_view",
        ),
        "builds a view over memory with caller-chosen sizes, strides or offsets",
    ),
    **dict.fromkeys(
        (
            "aten::_sparse_coo_tensor_unsafe", "aten::_sparse_compressed_tensor_unsafe",
            "aten::_sparse_csr_tensor_unsafe", "aten::_sparse_csc_tensor_unsafe",
            "aten::_sparse_bsr_tensor_unsafe", "aten::_sparse_bsc_tensor_unsafe",
            "aten::_sparse_coo_tensor_with_dims_and_tensors",
            "aten::_sparse_compressed_tensor_with_dims", "aten::_coalesced_",
            "aten::sparse_resize", "aten::sparse_resize_", "aten::sparse_resize_and_clear",
            "aten::sparse_resize_and_clear_",
        ),
        "builds a sparse tensor without its invariant checks",
    ),
}  # fmt: skip
# An argument by these names switches a check off (index_put's unsafe, a sparse constructor's
# check_invariants): every operator that takes one is refused.
_UNCHECKED_ARGS = {
    "unsafe": "indexes without bounds checks (unsafe=True)",
    "check_invariants": "can build a sparse tensor without its invariant checks",
}
_PATH_ARGS = frozenset({"filename", "path", "file", "filepath", "dir", "directory", "f"})
# Names too common to refuse wherever they appear in source: refused as `torch.x`, `ops.ns.x`
# or a getattr string only (the graph check sees every other use).
_GENERIC = frozenset({"save", "seed", "set", "wait", "profile"})


@cache
def denied() -> dict[str, str]:
    """Qualified operator name -> why it is refused, from the schemas and `_EXPLICIT`."""
    out = dict(_EXPLICIT)
    for schema in torch._C._jit_get_all_schemas():
        name = schema.name
        if name.split("::")[0] not in ALLOWED_NAMESPACES or name in out:
            continue
        types = [str(a.type) for a in schema.arguments] + [str(r.type) for r in schema.returns]
        strings = {a.name for a in schema.arguments if str(a.type).startswith("str")}
        args = {a.name for a in schema.arguments}
        base = name.split("::")[1].lower()
        unchecked = [why for arg, why in _UNCHECKED_ARGS.items() if arg in args]
        if strings & _PATH_ARGS or "from_file" in base or base.endswith(("_load", "_save")):
            out[name] = FILES
        elif unchecked:
            out[name] = unchecked[0]
        elif any("Storage" in t for t in types):
            out[name] = "points a tensor at other memory (Storage)"
        elif any(t.startswith(("Future", "Await")) for t in types):
            out[name] = THREADS
    return out


@cache
def _denied_names() -> dict[str, str]:
    """Each denied operator's base name (as source spells it) -> its qualified name."""
    names: dict[str, str] = {}
    for op in denied():
        names.setdefault(op.split("::")[1], op)
    names.update({"print": "prim::Print", "_fork": "prim::fork", "_wait": "aten::wait"})
    for alias in ("_awaitable", "_awaitable_wait", "_awaitable_nowait"):
        names[alias] = "prim::" + alias.lstrip("_")
    return names


def _refuse(op: str, where: str = "") -> InvalidModelError:
    reason = denied().get(op) or (
        "a custom operator"
        if "::" in op and op.split("::")[0] not in ALLOWED_NAMESPACES
        else "not allowed"
    )
    return InvalidModelError(f"TorchScript operator {op} is not allowed ({reason}){where}"[:500])


# --- before loading: the archive's source and pickles ---------------------------------------


def _sources(data: bytes) -> Iterator[tuple[str, bytes]]:
    try:
        zf = zipfile.ZipFile(io.BytesIO(data))
    except (zipfile.BadZipFile, ValueError, OSError) as exc:
        raise InvalidModelError(f"not a TorchScript archive (torch.jit.save): {exc}") from None
    with zf:
        for info in zf.infolist():
            if info.filename.endswith((".py", ".pkl")) and not info.is_dir():
                try:
                    yield info.filename, zf.read(info)
                except (zipfile.BadZipFile, ValueError, OSError, EOFError) as exc:
                    raise InvalidModelError(
                        f"TorchScript archive member {info.filename!r} is unreadable: {exc}"
                    ) from None


def check_source(data: bytes) -> None:
    """Refuse the archive before `torch.jit.load` when its source or pickles name an operator,
    operator namespace or custom class outside the allow-lists (module docstring)."""
    for name, raw in _sources(data):
        if name.endswith(".pkl"):
            _check_pickle(name, raw)
        else:
            _check_code(name, raw)


_CLASS_REF = re.compile(rb"classes\.([A-Za-z0-9_]+)")


def _check_pickle(name: str, raw: bytes) -> None:
    for match in _CLASS_REF.finditer(raw):
        ns = match.group(1).decode()
        if ns not in ALLOWED_CLASS_NAMESPACES:
            raise InvalidModelError(
                f"TorchScript archive {name} holds a torch.classes.{ns} object: custom classes "
                f"outside {sorted(ALLOWED_CLASS_NAMESPACES)} are not allowed"
            )


def _tokens(name: str, raw: bytes) -> list[tokenize.TokenInfo]:
    try:
        text = raw.decode("utf-8")
        return list(tokenize.generate_tokens(io.StringIO(text).readline))
    except (UnicodeDecodeError, tokenize.TokenError, SyntaxError, ValueError) as exc:
        raise InvalidModelError(f"TorchScript source {name} cannot be read: {exc}") from None


def _string_value(token: str) -> str:
    try:
        value = ast.literal_eval(token)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return token
    return value if isinstance(value, str) else token


def _constant_strings(name: str, raw: bytes) -> Iterator[tuple[str, int]]:
    """Every string the source spells as a constant, with its line: literals (implicit
    concatenation already joined by the parser), `+` of constants and f-strings of constants
    folded, so that `getattr(torch, "from_" "file")` is seen as "from_file"."""
    try:
        tree = ast.parse(raw.decode("utf-8"))
    except (UnicodeDecodeError, SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        raise InvalidModelError(f"TorchScript source {name} cannot be read: {exc}") from None

    def folded(node: ast.AST) -> str | None:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            left, right = folded(node.left), folded(node.right)
            return None if left is None or right is None else left + right
        if isinstance(node, ast.FormattedValue) and node.format_spec is None:
            return folded(node.value)
        if isinstance(node, ast.JoinedStr):
            parts = [folded(v) for v in node.values]
            return None if any(p is None for p in parts) else "".join(p or "" for p in parts)
        return None

    for node in ast.walk(tree):
        value = folded(node)
        if value is not None:
            yield unicodedata.normalize("NFKC", value), getattr(node, "lineno", 0)


def _check_code(name: str, raw: bytes) -> None:
    names = _denied_names()
    for value, line in _constant_strings(name, raw):  # getattr(torch, "from_" "file") compiles
        if value in names:
            raise _refuse(names[value], f" (source {name}, line {line})")
        if value in _namespaces_denied():
            raise _refuse(f"{value}::*", f" (source {name}, line {line})")
    toks = [t for t in _tokens(name, raw) if t.type not in (tokenize.NL, tokenize.COMMENT)]
    words = [unicodedata.normalize("NFKC", t.string) if t.type == tokenize.NAME else t.string
             for t in toks]  # fmt: skip
    for i, tok in enumerate(toks):
        where = f" (source {name}, line {tok.start[0]})"
        if tok.type == tokenize.STRING:  # getattr(torch, "from_file") compiles
            value = _string_value(tok.string)
            if value in names:
                raise _refuse(names[value], where)
            if value in _namespaces_denied():
                raise _refuse(f"{value}::*", where)
            continue
        if tok.type != tokenize.NAME:
            continue
        word = words[i]
        before = words[i - 1] if i else ""
        owner = words[i - 2] if i > 1 else ""
        op_call = before == "." and owner == "ops" and i + 2 < len(words) and words[i + 1] == "."
        if op_call and word not in ALLOWED_NAMESPACES:  # ops.myns.op: a custom operator
            raise _refuse(f"{word}::{words[i + 2]}", where)
        if before == "." and owner == "classes" and word not in ALLOWED_CLASS_NAMESPACES:
            raise InvalidModelError(
                f"TorchScript source {name} (line {tok.start[0]}) uses torch.classes.{word}: "
                f"custom classes outside {sorted(ALLOWED_CLASS_NAMESPACES)} are not allowed"
            )
        if word not in names:
            continue
        qualified = before == "." and (owner in ("torch", "aten", "prim") or owner in names)
        if word not in _GENERIC or qualified:
            raise _refuse(names[word], where)


@cache
def _namespaces_denied() -> frozenset[str]:
    spaces = {s.name.split("::")[0] for s in torch._C._jit_get_all_schemas()}
    return frozenset(spaces - ALLOWED_NAMESPACES)


# --- after loading: every graph ---------------------------------------------------------------


def _objects(module: torch.jit.ScriptModule) -> Iterator[tuple[str, Any]]:
    """(path, object) for the module, every submodule and every TorchScript object they hold
    (in attributes, lists, tuples and dicts)."""
    seen: set[int] = set()
    stack: list[tuple[str, Any]] = [("", module._c)]
    while stack:
        path, obj = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, list | tuple):
            stack.extend((f"{path}[{i}]", v) for i, v in enumerate(obj))
            continue
        if isinstance(obj, dict):
            stack.extend((f"{path}[{k!r}]", v) for k, v in obj.items())
            continue
        c_obj = getattr(obj, "_c", obj)
        if not isinstance(c_obj, torch._C.ScriptObject | torch._C.ScriptModule):
            continue
        _check_class(path, c_obj)
        yield path, c_obj
        if isinstance(c_obj, torch._C.ScriptModule):  # a class object's own objects are
            attrs = torch._C._jit_debug_module_iterators(c_obj)["named_attributes"]  # type: ignore[attr-defined]  # reached
            stack.extend((f"{path}.{n}".lstrip("."), v) for n, v in attrs)  # by inlining


def _check_class(path: str, obj: Any) -> None:
    try:
        qualified = obj._type().qualified_name()
    except Exception:
        return
    parts = qualified.split(".")
    if "classes" in parts[:3]:
        ns = parts[parts.index("classes") + 1] if len(parts) > parts.index("classes") + 1 else ""
        if ns not in ALLOWED_CLASS_NAMESPACES:
            raise InvalidModelError(
                f"TorchScript attribute {path or '(module)'} is a torch.classes.{ns} object: "
                f"custom classes outside {sorted(ALLOWED_CLASS_NAMESPACES)} are not allowed"
            )


def _methods(obj: Any) -> Iterator[tuple[str, Any]]:
    try:
        names = list(obj._method_names())
    except Exception:
        names = []
    for name in names:
        yield name, obj._get_method(name)
    if isinstance(obj, torch._C.ScriptModule):
        hooks = (*obj._get_forward_pre_hooks(), *obj._get_forward_hooks())  # type: ignore[attr-defined]
        for hook in hooks:
            yield f"hook {hook.name}", hook


def _nodes(block: Any) -> Iterator[Any]:
    for node in block.nodes():
        yield node
        for sub in node.blocks():
            yield from _nodes(sub)
        if node.hasAttribute("Subgraph"):
            yield from _nodes(node.g("Subgraph"))


def _kinds(method: Any) -> Iterator[tuple[str, Any]]:
    try:
        graph = method.graph.copy()
    except Exception:  # a custom C++ class's method: a builtin, schema-checked by namespace
        return
    torch._C._jit_pass_inline(graph)
    for node in _nodes(graph):
        yield node.kind(), node


def check_module(module: torch.jit.ScriptModule) -> None:
    """Walk every method graph of the loaded module (module docstring): InvalidModelError
    naming the first operator outside the allow-list."""
    # every sparse tensor this process builds is checked (an allowed constructor with an index
    # out of range would otherwise write past its buffer); process-wide, on for good
    torch.sparse.check_sparse_tensor_invariants.enable()
    deny = denied()
    for path, obj in _objects(module):
        for method_name, method in _methods(obj):
            for kind, node in _kinds(method):
                ns = kind.split("::")[0]
                where = f" (in {(path + '.') if path else ''}{method_name})"
                if ns not in ALLOWED_NAMESPACES or kind in deny:
                    raise _refuse(kind, where)
                for value in (*node.inputs(), *node.outputs()):
                    _check_value_type(value, where)


def _check_value_type(value: Any, where: str) -> None:
    text = str(value.type())
    if "torch.classes." in text:
        ns = text.split("torch.classes.", 1)[1].split(".", 1)[0]
        if ns not in ALLOWED_CLASS_NAMESPACES:
            raise InvalidModelError(
                f"TorchScript uses torch.classes.{ns}{where}: custom classes outside "
                f"{sorted(ALLOWED_CLASS_NAMESPACES)} are not allowed"
            )
