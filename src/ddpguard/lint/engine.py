"""Run the rules over sources, files and folders; select/ignore and `# noqa`."""

from __future__ import annotations

import gc
import os
import re
import traceback
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path

from .analysis.context import ModuleInfo
from .analysis.crossfile import FileSet, Seed, walk_seeds
from .analysis.reachable import dead_lines
from .analysis.source import Unreadable, parse, read
from .analysis.walker import build
from .catalog import RULES
from .pyproject import Version, project_torch_floor
from .registry import SEVERITIES, Finding

_NOQA = re.compile(r"#\s*noqa(?::\s*(?P<codes>[A-Z]+[0-9]+(?:[,\s]+[A-Z]+[0-9]+)*))?", re.I)
# ruff's default exclusions: tool caches, environments, and Jupyter's autosaved copies
# (`.ipynb_checkpoints/main-checkpoint.py` would repeat every finding of `main.py`).
_SKIP_DIRS = {".git", "__pycache__", ".venv", "venv", "node_modules", ".tox", "build", "dist",
              ".ipynb_checkpoints", ".hg", ".svn", ".bzr", ".eggs", ".nox", ".direnv",
              ".mypy_cache", ".pytest_cache", ".ruff_cache", "site-packages", "__pypackages__",
              "buck-out", "_build"}


@dataclass(frozen=True)
class Selection:
    """Which codes run and at what severity. Codes may be prefixes (`DDP01`) or `ALL`.
    `preview` adds the default rules not yet proven on unseen code (`Rule.preview`); a code
    named in `select` or `extend_select` runs whatever its status."""

    select: tuple[str, ...] = ()
    ignore: tuple[str, ...] = ()
    extend_select: tuple[str, ...] = ()
    severity: dict[str, str] = field(default_factory=dict)
    preview: bool = False

    def __post_init__(self) -> None:
        for code in (*self.select, *self.ignore, *self.extend_select, *self.severity):
            if code != "ALL" and not any(c.startswith(code) for c in RULES):
                raise ValueError(f"unknown rule code {code!r}: known codes are "
                                 f"DDP001..{max(RULES)} (prefixes like DDP01 and ALL work too)")
        for code, sev in self.severity.items():
            if sev not in SEVERITIES:
                raise ValueError(f"severity {sev!r} for {code} is not one of {SEVERITIES}")

    def codes(self) -> list[str]:
        # asked once per file: the answer is kept on the (frozen) selection itself
        known: list[str] | None = self.__dict__.get("_codes")
        if known is None:
            known = self._codes()
            object.__setattr__(self, "_codes", known)
        return list(known)

    def _codes(self) -> list[str]:
        def match(code: str, pats: Iterable[str]) -> bool:
            return any(p == "ALL" or code.startswith(p) for p in pats)

        out = []
        for code, rule in RULES.items():
            on = match(code, self.select) if self.select else \
                rule.default and (self.preview or not rule.preview)
            on = (on or match(code, self.extend_select)) and not match(code, self.ignore)
            if on and code != "DDP000":
                out.append(code)
        return out

    def held_back(self) -> list[str]:
        """The preview rules that `preview=True` would add to this selection: the CLI runs
        them too, only to say how many findings they hold back."""
        if self.preview or self.select:
            return []
        on = set(self.codes())
        return [c for c in replace(self, preview=True).codes() if c not in on]


def lint_source(source: str, path: str = "<string>", selection: Selection | None = None,
                torch_floor: Version | None = None) -> list[Finding]:
    """Findings for one module's source, sorted by position; never imports or runs it.
    `torch_floor`: the oldest torch the project supports, when known (DDP010)."""
    info = analyse(source, path)
    if isinstance(info, Finding):
        return [info]
    info.torch_floor = torch_floor
    FileSet([info])
    found = check(info, source, selection)
    _release([info])
    return found


def analyse(source: str, path: str) -> ModuleInfo | Finding:
    try:
        tree = parse(source, path)
    except Unreadable as exc:
        return _ddp000(path, exc)
    try:
        return build(tree, path)
    except Exception as exc:  # noqa: BLE001  (the other files still get checked)
        return _internal_error(path, "the analysis", exc)


def _ddp000(path: str, exc: Unreadable) -> Finding:
    return Finding(path, exc.line, exc.col, "DDP000", "error", exc.why, RULES["DDP000"].fix)


def check(info: ModuleInfo, source: str, selection: Selection | None = None) -> list[Finding]:
    selection = selection or Selection()
    path = info.path
    lines: list[str] | None = None  # split only when a rule reports (suppression comments)
    found: dict[tuple[int, int, str], Finding] = {}
    for code in selection.codes():
        try:
            hits = list(RULES[code](info))
        except Exception as exc:  # noqa: BLE001  (one rule's bug must not cost the others)
            found.setdefault((1, 1, "DDP000"), _internal_error(path, code, exc))
            continue
        for node, hit_code, message, *sev in hits:
            line = getattr(node, "lineno", 1)
            col = getattr(node, "col_offset", 0) + 1
            if lines is None:
                lines = source.splitlines()
            if _suppressed(lines, line, hit_code):
                continue
            key = (line, col, hit_code)
            severity = selection.severity.get(hit_code) or (sev[0] if sev else
                                                             RULES[hit_code].severity)
            found.setdefault(key, Finding(path, line, col, hit_code, severity, message,
                                          RULES[hit_code].fix))
    dead = dead_lines(info, {k[0] for k in found}) if found else set()
    return [found[k] for k in sorted(found) if k[2] == "DDP000" or k[0] not in dead]


def _internal_error(path: str, code: str, exc: Exception) -> Finding:
    """A bug of ours, not of the file: say so, say where, and let the other rules and files
    run (one crash used to end the whole command)."""
    tb = traceback.extract_tb(exc.__traceback__)
    where = f" at {Path(tb[-1].filename).name}:{tb[-1].lineno}" if tb else ""
    return Finding(path, 1, 1, "DDP000", "error",
                   f"internal error of ddpguard lint in {code} ({type(exc).__name__}: {exc}"
                   f"{where}); this file's other rules and the other files were checked",
                   f"please report it with this file; meanwhile `--ignore {code}` skips the rule")


def _suppressed(lines: list[str], line: int, code: str) -> bool:
    if not 0 < line <= len(lines) or "noqa" not in lines[line - 1].lower():
        return False
    m = _NOQA.search(lines[line - 1])
    if m is None:
        return False
    codes = m.group("codes")
    return codes is None or code in re.split(r"[,\s]+", codes.upper())


def lint_file(path: str | Path, selection: Selection | None = None) -> list[Finding]:
    return lint_group([Path(path)], selection)


def lint_group(files: list[Path], selection: Selection | None = None,
               root: str | None = None) -> list[Finding]:
    """Lint `files` together: calls from one into another use the callee's summary.
    The cyclic garbage collector is paused meanwhile: the trees and summaries of every file
    stay alive until the end, and its full passes over them cost more than the analysis."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        return _lint_group(files, selection, root)
    finally:
        if enabled:
            gc.enable()


def _lint_group(files: list[Path], selection: Selection | None,
                root: str | None) -> list[Finding]:
    out: list[Finding] = []
    infos: list[tuple[ModuleInfo, str]] = []
    floors: dict[Path, Version | None] = {}
    # Only DDP010 asks which torch the project supports: no pyproject is read for the others.
    floored = "DDP010" in (selection or Selection()).codes()
    for p in files:
        try:
            source = read(p)
        except Unreadable as exc:
            out.append(_ddp000(str(p), exc))
            continue
        info = analyse(source, str(p))
        if isinstance(info, Finding):
            out.append(info)
            continue
        if floored and p.parent not in floors:
            floors[p.parent] = project_torch_floor(p)
        info.torch_floor = floors.get(p.parent)
        infos.append((info, source))
    # A file that calls another's own rank predicate, or assigns the expression passed as
    # `init_process_group(rank=...)`, is walked again knowing it, so that its tests of it
    # split the ranks (rare: names like `is_main_process` or `rank` need no second walk).
    for k, seed in _seeds(infos).items():
        info, source = infos[k]
        again = build(info.tree, info.path, seed)
        again.torch_floor = info.torch_floor
        infos[k] = (again, source)
    FileSet([i for i, _ in infos], root)
    for info, source in infos:
        out.extend(check(info, source, selection))
    _release([i for i, _ in infos])
    order = {str(p): k for k, p in enumerate(files)}
    return sorted(out, key=lambda f: (order.get(f.path, 0), f.line, f.col, f.code))


def _seeds(infos: list[tuple[ModuleInfo, str]]) -> dict[int, Seed]:
    by_id = walk_seeds([i for i, _ in infos])
    return {k: by_id[id(i)] for k, (i, _) in enumerate(infos) if id(i) in by_id}


def _release(infos: list[ModuleInfo]) -> None:
    """Break the summaries' reference cycles (info -> project -> info, info -> memoised
    builders -> info) once the findings are out, so that reference counting frees the trees
    at once instead of leaving them to the cyclic collector's next full pass."""
    for info in infos:
        info.file_set = None
        info._memo.clear()


def discover(paths: Iterable[str | Path]) -> list[Path]:
    """Python files under `paths` (files as given, folders recursively, sorted)."""
    out: list[Path] = []
    for raw in paths:
        p = Path(raw)
        if p.is_dir():
            for root, dirs, files in os.walk(p):
                # `{{cookiecutter.name}}/` folders hold templates, not modules
                dirs[:] = sorted(d for d in dirs if d not in _SKIP_DIRS and "{{" not in d)
                out.extend(Path(root) / f for f in sorted(files)
                           if f.endswith(".py") and "{{" not in f)
        elif p.exists():
            out.append(p)
        else:
            raise FileNotFoundError(f"no such file or folder: {p}")
    return out


def lint_paths(paths: Iterable[str | Path], selection: Selection | None = None,
               jobs: int = 1) -> list[Finding]:
    """With jobs > 1 the files are split by folder (a folder's files stay together, so
    calls between neighbours still resolve); with one job every file sees every other."""
    paths = list(paths)
    files = discover(paths)
    named = [os.path.abspath(p if Path(p).is_dir() else Path(p).parent) for p in paths]
    root = os.path.commonpath(named) if named else None
    if jobs > 1 and len(files) > 1:
        from concurrent.futures import ProcessPoolExecutor

        groups: dict[Path, list[Path]] = {}
        for p in files:
            groups.setdefault(p.parent, []).append(p)
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            chunks = pool.map(lint_group, list(groups.values()),
                              [selection] * len(groups), [root] * len(groups))
            return [f for chunk in chunks for f in chunk]
    return lint_group(files, selection, root)
