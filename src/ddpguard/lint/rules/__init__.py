"""One module per rule, named after it (`ddp005_collective_divergence.py`): its metadata in
`@rule(...)`, its user-facing explanation in the module docstring, its code. Rules read
lint/analysis/ and never each other."""

from __future__ import annotations

import importlib
import pkgutil

# In code order (their names sort so): the engine runs them, and docs/lint.md lists them, in
# this order. A rule is a module `ddpNNN_<name>.py` here; nothing else registers it.
MODULES = [importlib.import_module(f"{__name__}.{m.name}")
           for m in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name)
           if m.name.startswith("ddp")]
ALL = [m.RULE for m in MODULES]
