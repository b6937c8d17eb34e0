"""Text (ruff-like), JSON and SARIF 2.1.0 renderings of findings."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping

from .catalog import RULES
from .registry import Finding

_SARIF_LEVEL = {"error": "error", "warning": "warning", "info": "note"}


def render_text(findings: list[Finding], files: int,
                held_back: Mapping[str, int] | None = None) -> str:
    """`held_back`: findings per preview rule that the selection did not show."""
    out = [f"{f.path}:{f.line}:{f.col}: {f.code} {f.message}\n    fix: {f.fix}"
           for f in findings]
    by_sev = Counter(f.severity for f in findings)
    if findings:
        parts = ", ".join(f"{n} {s}" for s, n in sorted(by_sev.items()))
        out.append(f"Found {len(findings)} finding(s) in {files} file(s) ({parts}).")
    else:
        out.append(f"All checks passed ({files} file(s)).")
    if held_back:
        rules = ", ".join(f"{c} x{n}" for c, n in sorted(held_back.items()))
        out.append(f"{sum(held_back.values())} more from preview rules ({rules}), not yet "
                   "proven on unseen code: `--preview` shows them.")
    return "\n".join(out)


def render_json(findings: list[Finding]) -> str:
    return json.dumps([f.to_dict() for f in findings], indent=2)


def render_sarif(findings: list[Finding], version: str) -> str:
    used = sorted({f.code for f in findings} | set(RULES) - {"DDP000"})
    rules = [{"id": c, "name": RULES[c].name,
              "shortDescription": {"text": RULES[c].summary},
              "help": {"text": RULES[c].fix},
              "defaultConfiguration": {"level": _SARIF_LEVEL[RULES[c].severity]}}
             for c in used]
    results = [{"ruleId": f.code, "level": _SARIF_LEVEL[f.severity],
                "message": {"text": f"{f.message} (fix: {f.fix})"},
                "locations": [{"physicalLocation": {
                    "artifactLocation": {"uri": f.path.replace("\\", "/")},
                    "region": {"startLine": f.line, "startColumn": f.col}}}]}
               for f in findings]
    doc = {"$schema": "https://json.schemastore.org/sarif-2.1.0.json", "version": "2.1.0",
           "runs": [{"tool": {"driver": {"name": "ddpguard-lint", "version": version,
                                         "rules": rules}},
                     "results": results}]}
    return json.dumps(doc, indent=2)
