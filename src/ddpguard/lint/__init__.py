"""Static DDP pitfall checks (`ddpguard lint`). Reads scripts with `ast` only: never imports
torch or the script, and imports nothing from ddpguard outside this package."""

from .catalog import RULES
from .engine import Selection, discover, lint_file, lint_paths, lint_source
from .registry import Finding, Rule

__all__ = ["RULES", "Finding", "Rule", "Selection", "discover", "lint_file", "lint_paths",
           "lint_source"]
