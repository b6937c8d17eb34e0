"""Findings and the rule table, for the callers that import them from here."""

from __future__ import annotations

from .catalog import RULES
from .registry import SEVERITIES, Finding, Rule

__all__ = ["RULES", "SEVERITIES", "Finding", "Rule"]
