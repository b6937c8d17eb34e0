"""DDP019: an exit in an `except` handler under a rank test says where it sits (it leaves only
when that rank's error is caught there), and an exit outside any handler says nothing of one."""

from __future__ import annotations

from pathlib import Path

from helpers import lint_paths

FIXTURE = Path(__file__).parent / "fixtures" / "DDP019_exit_in_handler.py"


def test_the_message_names_the_handler_the_exit_sits_in() -> None:
    found = [f for f in lint_paths([FIXTURE]) if f.code == "DDP019"]
    assert len(found) == 2   # the handler's own `break`, and one under its own test
    assert all("(break, in the `except KeyError:` handler, when that error is caught there)"
               in f.message for f in found)


def test_an_exit_outside_a_handler_names_none(tmp_path: Path) -> None:
    src = FIXTURE.read_text().replace(
        '                try:\n                    improved = results["acc"] > self.best\n'
        '                except KeyError:\n                    print("the monitored metric is '
        'missing: training stops")\n                    break  # expect: DDP019\n',
        '                improved = results["acc"] > self.best\n                if not '
        'improved:\n                    break\n', 1)
    p = tmp_path / "plain.py"
    p.write_text(src)
    line = next(k for k, s in enumerate(src.splitlines(), 1) if "if not improved:" in s) + 1
    found = [f for f in lint_paths([p]) if f.code == "DDP019" and f.line == line]
    assert len(found) == 1
    assert "handler" not in found[0].message
    assert "(break)" in found[0].message
