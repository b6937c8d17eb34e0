"""`ddpguard lint` end to end: output formats, exit codes, pyproject settings, bad files."""

from __future__ import annotations

import json
from pathlib import Path

from helpers import LINT_FIXTURES as CORPUS
from helpers import run_cli

WRONG = str(CORPUS / "seeds_004_train_ddp_wrong.py")


# A rank-0 forward through the wrapper where no buffer is visible: DDP037, a preview rule.
PREVIEW_ONLY = """\
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def main(net, x):
    dist.init_process_group("gloo")
    model = DDP(net)
    if dist.get_rank() == 0:
        model(x)
"""


def test_text_output_and_exit_one(tmp_path: Path) -> None:
    r = run_cli("lint", "--no-config", WRONG)
    assert r.returncode == 1, r.stderr
    assert f"{WRONG}:28:" in r.stdout and " DDP002 " in r.stdout
    assert f"{WRONG}:32:5: DDP001 " in r.stdout   # on by default since the fourteenth round
    assert "fix: call sampler.set_epoch(epoch)" in r.stdout
    assert "preview rules" not in r.stdout
    # a preview rule: counted, not shown, and no part of the exit code
    both = tmp_path / "both.py"
    both.write_text(Path(WRONG).read_text() + "\n\n" + PREVIEW_ONLY)
    r = run_cli("lint", "--no-config", "--select", "DDP002,DDP037", str(both))
    assert " DDP002 " in r.stdout and " DDP037 " in r.stdout  # named: shown
    r = run_cli("lint", "--no-config", "--ignore", "DDP001", str(both))
    assert " DDP037 " not in r.stdout and " DDP002 " in r.stdout
    assert "1 more from preview rules (DDP037 x1)" in r.stdout and "--preview" in r.stdout
    r = run_cli("lint", "--no-config", "--preview", "--ignore", "DDP001", str(both))
    assert r.returncode == 1 and " DDP037 " in r.stdout
    assert "preview rules" not in r.stdout


def test_preview_findings_alone_do_not_fail_the_run(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(PREVIEW_ONLY)
    r = run_cli("lint", "--no-config", str(script))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "All checks passed" in r.stdout and "(DDP037 x1)" in r.stdout
    assert run_cli("lint", "--no-config", "--preview", str(script)).returncode == 1
    (tmp_path / "pyproject.toml").write_text("[tool.ddpguard.lint]\npreview = true\n")
    r = run_cli("lint", str(script))
    assert r.returncode == 1 and " DDP037 " in r.stdout
    (tmp_path / "pyproject.toml").write_text('[tool.ddpguard.lint]\npreview = "yes"\n')
    r = run_cli("lint", str(script))
    assert r.returncode == 2 and "preview must be true or false, got 'yes'" in r.stderr


def test_clean_exit_zero() -> None:
    r = run_cli("lint", "--no-config", str(CORPUS / "seeds_good_class_trainer.py"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "All checks passed" in r.stdout


def test_json_and_sarif(tmp_path: Path) -> None:
    r = run_cli("lint", "--no-config", "--format", "json", "--select", "DDP002", WRONG)
    rows = json.loads(r.stdout)
    assert [(x["code"], x["line"], x["severity"]) for x in rows] == [("DDP002", 28, "error")]
    assert set(rows[0]) == {"path", "line", "col", "code", "severity", "message", "fix"}
    r = run_cli("lint", "--no-config", "--format", "sarif", "--ignore", "DDP001", WRONG)
    assert {x["ruleId"] for x in json.loads(r.stdout)["runs"][0]["results"]} == {"DDP002"}
    r = run_cli("lint", "--no-config", "--format", "sarif", WRONG)
    doc = json.loads(r.stdout)
    results = doc["runs"][0]["results"]
    assert doc["version"] == "2.1.0"
    assert {x["ruleId"] for x in results} == {"DDP001", "DDP002"}
    # preview findings are not in the JSON or SARIF output unless asked for
    script = tmp_path / "preview.py"
    script.write_text(PREVIEW_ONLY)
    r = run_cli("lint", "--no-config", "--format", "json", str(script))
    assert json.loads(r.stdout) == [] and r.returncode == 0
    r = run_cli("lint", "--no-config", "--format", "json", "--preview", str(script))
    assert [x["code"] for x in json.loads(r.stdout)] == ["DDP037"]
    assert results[0]["locations"][0]["physicalLocation"]["region"]["startLine"] > 0


def test_usage_errors_exit_two(tmp_path: Path) -> None:
    assert run_cli("lint", str(tmp_path / "missing.py")).returncode == 2
    r = run_cli("lint", "--no-config", "--select", "DDP999", WRONG)
    assert r.returncode == 2 and "DDP999" in r.stderr


def test_folder_with_unparsable_file(tmp_path: Path) -> None:
    (tmp_path / "broken.py").write_text("def f(:\n    pass\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "env.py").write_text('import os\nos.environ["NCCL_TIMEOUT"] = "5"\n')
    r = run_cli("lint", "--no-config", str(tmp_path))
    assert r.returncode == 1
    assert f"{tmp_path / 'broken.py'}:1:" in r.stdout and "DDP000 syntax error" in r.stdout
    assert "env.py:2:12: DDP011" in r.stdout


def test_pyproject_settings(tmp_path: Path) -> None:
    script = tmp_path / "pkg" / "train.py"
    script.parent.mkdir()
    script.write_text('import torch.distributed as dist\ndist.init_process_group("gloo")\n'
                      'print("hello")\ndist.destroy_process_group()\n')
    (tmp_path / "pyproject.toml").write_text(
        '[tool.ddpguard.lint]\nextend-select = ["DDP018"]\nseverity = { DDP018 = "warning" }\n')
    r = run_cli("lint", "--format", "json", str(script))
    rows = json.loads(r.stdout)
    assert [(x["code"], x["severity"]) for x in rows] == [("DDP018", "warning")]
    assert r.returncode == 1
    (tmp_path / "pyproject.toml").write_text('[tool.ddpguard.lint]\nextend-select = ["DDP018"]\n'
                                             'ignore = ["DDP018"]\n')
    assert run_cli("lint", str(script)).returncode == 0
    # info findings alone do not fail the run
    (tmp_path / "pyproject.toml").write_text('[tool.ddpguard.lint]\nselect = ["DDP018"]\n')
    r = run_cli("lint", str(script))
    assert r.returncode == 0 and "DDP018" in r.stdout


def test_jobs_gives_same_findings() -> None:
    one = run_cli("lint", "--no-config", "--format", "json", str(CORPUS))
    two = run_cli("lint", "--no-config", "--format", "json", "--jobs", "2", str(CORPUS))
    assert json.loads(one.stdout) == json.loads(two.stdout) != []
