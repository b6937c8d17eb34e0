"""Calls that raise whenever they run, read from the call alone: an API that current releases
of the library removed (pandas' `DataFrame.append`, numpy's `np.float`, torchvision's
`save_image(range=...)`), or a call of the file's own function with arguments its signature
cannot take. DDP049 asks this of the calls that only some ranks make."""

from __future__ import annotations

import ast
import os
import re

from .context import CallRec, Func, ModuleInfo
from .crossfile import imported_function

# Attributes that current releases no longer have (AttributeError on the read), with the
# release that removed them. tests/lint/test_ddp049_rank_only_raise.py checks the numpy ones
# against the installed numpy.
REMOVED_ATTRS = {
    **{f"numpy.{n}": "numpy 1.24" for n in (
        "float", "int", "object", "str", "unicode", "complex")},
    "numpy.asscalar": "numpy 1.23",
    **{f"numpy.{n}": "numpy 2.0" for n in (
        "float_", "complex_", "cfloat", "NaN", "Inf", "NINF", "PINF", "Infinity", "infty",
        "string_", "unicode_", "product", "cumproduct", "alltrue", "sometrue", "round_")},
    **{f"PIL.Image.{n}": "Pillow 10" for n in ("ANTIALIAS", "LINEAR", "CUBIC")},
    **{f"scipy.misc.{n}": "scipy 1.3" for n in (
        "imread", "imsave", "imresize", "imrotate", "imfilter", "toimage", "fromimage",
        "bytescale")},
}
# Keywords current releases reject (TypeError), per callee.
_REMOVED_KEYWORDS = {
    "torchvision.utils.save_image": ("range", "torchvision 0.15"),
    "torchvision.utils.make_grid": ("range", "torchvision 0.15"),
}
_KEYWORD_CALLEES = frozenset(q.rsplit(".", 1)[-1] for q in _REMOVED_KEYWORDS)
_PACKAGES = frozenset(q.split(".", 1)[0] for q in REMOVED_ATTRS)
# What makes a pandas DataFrame (whose `append` pandas 2.0 removed).
_FRAMES = frozenset(("DataFrame", "read_csv", "read_json", "read_excel", "read_pickle",
                     "read_parquet", "read_table", "concat", "from_dict", "from_records"))


def heads(info: ModuleInfo) -> frozenset[str]:
    """The names this file binds to a package whose removed attributes REMOVED_ATTRS lists
    (`np`, `Image`, `scipy`): only attributes read through them are looked up."""
    return frozenset(k for k, v in info.aliases.items()
                     if v.split(".", 1)[0] in _PACKAGES or v in _PACKAGES)


def raise_reason(info: ModuleInfo, rec: CallRec, roots: frozenset[str]) -> str:
    """Why this call raises wherever it runs ("" when it may not). `roots`: heads(info)."""
    call = rec.node
    last = rec.last
    if last in _KEYWORD_CALLEES and call.keywords:
        qual = rec.qual or info.qualify(call.func) or ""
        kw = _REMOVED_KEYWORDS.get(qual)
        if kw is not None and any(k.arg == kw[0] for k in call.keywords):
            return (f"`{last}()` lost its `{kw[0]}=` keyword in {kw[1]} (TypeError)")
    if roots:
        for node in (call.func, *call.args, *(k.value for k in call.keywords)):
            if type(node) is ast.Starred:
                node = node.value
            if type(node) is not ast.Attribute:
                continue
            root = node.value
            while type(root) is ast.Attribute:
                root = root.value
            if type(root) is ast.Name and root.id in roots:
                name = info.qualify(node) or ""
                if name in REMOVED_ATTRS:
                    return (f"`{ast.unparse(node)}` was removed in {REMOVED_ATTRS[name]} "
                            "(AttributeError)")
    if last == "save" and (rec.qual or info.qualify(call.func)) == "torch.save":
        folder = _missing_folder(info, call.args[1] if len(call.args) > 1 else next(
            (k.value for k in call.keywords if k.arg == "f"), None))
        return (f"`torch.save` writes into `{folder}/`, which nothing in the program creates "
                "and the checkout does not hold (FileNotFoundError)") if folder else ""
    if last == "open" and type(call.func) is ast.Name and call.args and _writes(call):
        # a log or result file opened for writing (corpus41a tuning's `logs/...txt`)
        folder = _missing_folder(info, call.args[0])
        return (f"`open()` writes into `{folder}/`, which nothing in the program creates "
                "and the checkout does not hold (FileNotFoundError)") if folder else ""
    if last == "append":
        f = call.func
        if isinstance(f, ast.Attribute) and _frame(info, f.value):
            return ("`DataFrame.append` was removed in pandas 2.0 (AttributeError); "
                    "use `pd.concat`")
        return ""
    if last in info.funcs or last in info.aliases:
        return _arity(info, rec)
    return ""


def _frame(info: ModuleInfo, holder: ast.expr) -> bool:
    """Every value the file binds to `holder` is a pandas DataFrame (or its own `append`)."""
    if "pandas" not in info.aliases.values():
        return False
    values = info.values_of(holder)
    if not values:
        return False
    spelled = ast.dump(holder)
    for v in values:
        if not isinstance(v, ast.Call):
            return False
        q = info.qualify(v.func) or ""
        own = (isinstance(v.func, ast.Attribute) and v.func.attr == "append"
               and ast.dump(v.func.value) == spelled)
        if not own and not (q.startswith("pandas.") and q.rsplit(".", 1)[-1] in _FRAMES):
            return False
    return True


def _arity(info: ModuleInfo, rec: CallRec) -> str:
    """A call of the file's one definition of a plain function (or of a method of the caller's
    own class, through `self`) that its signature cannot bind."""
    call = rec.node
    if any(isinstance(a, ast.Starred) for a in call.args) or any(
            k.arg is None for k in call.keywords):
        return ""
    f = call.func
    if isinstance(f, ast.Name):
        name, method = f.id, False
    elif isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) \
            and f.value.id == "self":
        name, method = f.attr, True
    else:
        return ""
    if name in info.assigns or f"self.{name}" in info.assigns or _local(rec.func, name):
        return ""
    if name in info.aliases:
        hit = _imported(info, rec) if not method else None
        if hit is None:
            return ""
        m, fn = hit
        return _unbindable(fn, call, False, f"{os.path.basename(m.path)}:{fn.lineno}")
    owner = info.func_class.get(rec.func) if method and rec.func is not None else None
    if method and (owner is None or _subclassed(info, owner)):
        return ""
    fns = [fn for fn in info.funcs.get(name, [])
           if info.func_class.get(fn) == owner and id(fn) not in info.parents]
    if len(fns) != 1 or fns[0].decorator_list:
        return ""
    fn = fns[0]
    return _unbindable(fn, call, method, f"line {fn.lineno}")


def _imported(info: ModuleInfo, rec: CallRec) -> tuple[ModuleInfo, Func] | None:
    """The one plain module-level function of another file given that `from m import f`
    names (utils/checkpoint.py's `save_ckpt`)."""
    hit = imported_function(info, rec)
    if hit is None:
        return None
    m, fn = hit
    if fn.decorator_list or id(fn) in m.parents or fn.name in m.assigns \
            or fn.name in m.aliases:
        return None
    return m, fn


def _local(func: Func | None, name: str) -> bool:
    """`name` is a parameter of the calling function (a callback handed in)."""
    if func is None:
        return False
    a = func.args
    return any(p.arg == name for p in (*a.posonlyargs, *a.args, *a.kwonlyargs)) or any(
        p is not None and p.arg == name for p in (a.vararg, a.kwarg))


def _subclassed(info: ModuleInfo, cls: str) -> bool:
    return any(isinstance(b, ast.Name) and b.id == cls or isinstance(b, ast.Attribute)
               and b.attr == cls for c in info.classes.values() for b in c.bases)


def _unbindable(fn: Func, call: ast.Call, skip_first: bool, where: str) -> str:
    a = fn.args
    positional = [p.arg for p in (*a.posonlyargs, *a.args)]
    if skip_first:
        if not positional:
            return ""
        positional = positional[1:]
    n_defaults = len(a.defaults)
    required = positional[:len(positional) - n_defaults] if n_defaults else positional
    given = len(call.args)
    if given > len(positional) and a.vararg is None:
        return (f"`{fn.name}()` ({where}) takes {len(positional)} positional "
                f"argument{'s' if len(positional) != 1 else ''} but this call gives {given} "
                "(TypeError)")
    by_keyword = [p.arg for p in a.args]
    if skip_first and not a.posonlyargs:
        by_keyword = by_keyword[1:]
    names = {*by_keyword, *(p.arg for p in a.kwonlyargs)}
    filled = set(positional[:given])
    for k in call.keywords:
        if k.arg in filled:
            return (f"`{fn.name}()` ({where}) gets `{k.arg}` both by position and by "
                    "keyword (TypeError)")
        if k.arg not in names and a.kwarg is None:
            return (f"`{fn.name}()` ({where}) has no parameter `{k.arg}` "
                    "(TypeError)")
        filled.add(k.arg or "")
    missing = [p for p in required if p not in filled]
    missing += [p.arg for p, d in zip(a.kwonlyargs, a.kw_defaults, strict=True)
                if d is None and p.arg not in filled]
    if missing:
        return (f"`{fn.name}()` ({where}) requires `{'`, `'.join(missing)}`, which "
                "this call does not pass (TypeError)")
    return ""


_MAKES = frozenset(("makedirs", "mkdir", "mkdirs", "mkpath", "make_dirs", "create_dir",
                    "ensure_dir", "mkdir_p", "mkdir_or_exist", "copytree"))


def _writes(call: ast.Call) -> bool:
    """`open(path, "w")` (or "a", "x", with any flags): a mode written out that creates."""
    mode = call.args[1] if len(call.args) > 1 else next(
        (k.value for k in call.keywords if k.arg == "mode"), None)
    return type(mode) is ast.Constant and isinstance(mode.value, str) and any(
        c in mode.value for c in "wax")


def _missing_folder(info: ModuleInfo, path: ast.expr | None) -> str:
    """The folder, written out in `path` (`torch.save(obj, "results/mod/m.pth")`), that no
    call of the program creates (nothing that makes folders at all in this file and the files
    it imports, or only others, spelled out) and the checkout does not hold beside the script
    or above it: "" where any of that is unsure."""
    folder = _literal_folder(path) if path is not None else None
    if not folder or folder.startswith(("/", "~", "$", ".")) or "\\" in folder:
        return ""
    key = ("unmade", folder)
    hit = info._memo.get(key)
    if hit is not None:
        return hit  # type: ignore[return-value]
    info._memo[key] = folder = _unmade(info, folder)
    return folder


def _unmade(info: ModuleInfo, folder: str) -> str:
    """`folder` when neither the disk nor the program's folder-making calls account for it
    (the disk first: a checkout that holds it settles it)."""
    here = os.path.dirname(os.path.abspath(info.path))
    for _ in range(4):
        if os.path.isdir(os.path.join(here, folder)) or _shell_makes(here, folder):
            return ""
        here = os.path.dirname(here)
    files = [info, *(getattr(info.file_set, "imported", lambda _m: [])(info) or [])]
    for m in files:
        for rec in m.calls_named(*_MAKES):
            made = [_literal_folder(a, whole=True) for a in rec.node.args[:1]]
            if not made or made[0] is None or _covers(made[0], folder):
                return ""
    return folder


def _shell_makes(here: str, folder: str) -> bool:
    """A launch script or README beside the code makes the folder (`mkdir -p logs`) before
    the run."""
    try:
        names = [n for n in os.listdir(here) if n.endswith(".sh") or n.lower().startswith(
            "readme")]
    except OSError:
        return False
    for name in names:
        try:
            with open(os.path.join(here, name), encoding="utf-8", errors="replace") as f:
                text = f.read(200_000)
        except OSError:
            continue
        if any("mkdir" in line and folder.split("/")[0] in line for line in text.splitlines()):
            return True
    return False


def _covers(made: str, folder: str) -> bool:
    made = made.rstrip("/")
    return made == folder or made.startswith(folder + "/") or folder.startswith(made + "/")


def _literal_folder(node: ast.expr, whole: bool = False) -> str | None:
    """The folder part of a path written out in the code (`"Weights/m_%d.pth" % i`,
    `f"results/mod/m_{epoch}.pth"`, `os.path.join("ckpt", name)`); with `whole`, the whole
    path. None where a part of it is not written out."""
    text = _template(node)
    if text is None:
        return None
    if whole:
        return None if "\0" in text else text
    if "/" not in text:
        return None
    folder = text.rsplit("/", 1)[0]
    return None if "\0" in folder or "%" in folder or not folder else folder


def _template(node: ast.expr) -> str | None:
    """The path with each part the code computes as a NUL."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) and isinstance(v.value, str)
                       else "\0" for v in node.values)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
            node.func.attr == "format" and isinstance(node.func.value, ast.Constant) and \
            isinstance(node.func.value.value, str):
        # `"logs/run_{}.txt".format(k)`: each field is computed
        return re.sub(r"\{[^{}]*\}", "\0", node.func.value.value)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod):
        left = _template(node.left)
        return None if left is None else left
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
            and node.func.attr == "join" and not node.keywords and node.args:
        parts = [_template(a) if isinstance(a, ast.Constant) else "\0" for a in node.args]
        if any(p is None for p in parts):
            return None
        return "/".join(p for p in parts if p is not None)
    return None
