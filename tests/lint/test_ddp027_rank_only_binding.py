"""DDP027 a name bound under a rank test and read by every rank (its fixture is
tests/lint/fixtures/DDP027_rank_only_binding.py)."""

from __future__ import annotations

from helpers import HEAD_DIST, lint_with_defaults

from ddpguard.lint import RULES, Selection

# Preview since the twenty-first round: named, as a user who opts in would.
ON = Selection(extend_select=("DDP027",))


def test_the_message_names_the_binding_and_what_follows() -> None:
    src = HEAD_DIST + (
        "def main(model):\n"
        "    if dist.get_rank() == 0:\n"
        "        out = 'runs/a'\n"
        "    print(out)\n"
        "    dist.barrier()\n")
    [f] = lint_with_defaults(src, "t.py", ON)
    assert f.code == "DDP027" and f.line - HEAD_DIST.count("\n") == 4
    assert "`out` is bound only where `dist.get_rank() == 0`" in f.message
    assert "barrier() at line" in f.message


def test_a_try_around_the_read_may_catch_the_error() -> None:
    src = HEAD_DIST + (
        "def main(model):\n"
        "    if dist.get_rank() == 0:\n"
        "        out = 'runs/a'\n"
        "    try:\n"
        "        print(out)\n"
        "    except NameError:\n"
        "        pass\n"
        "    dist.barrier()\n")
    assert lint_with_defaults(src, "t.py", ON) == []


def test_in_preview() -> None:
    # Its record on unseen code (corpus37a, the twenty-first round: two false findings, a
    # comprehension's own variable read as a rank-only binding) is below the default bar.
    assert RULES["DDP027"].preview


def test_storing_into_an_imported_config_binds_no_name() -> None:
    # corpus35t, solar-radiation-challenge: `HPARAMS[k] = v` on rank 0 changes the imported
    # dict's values; every rank still has the name, so no NameError can follow.
    src = HEAD_DIST + (
        "from config import HPARAMS\n"
        "def main(model, cfg):\n"
        "    if dist.get_rank() == 0:\n"
        "        for k, v in cfg.items():\n"
        "            HPARAMS[k] = v\n"
        "        model.lr = 3\n"
        "    print(HPARAMS['lr'], model)\n"
        "    dist.barrier()\n")
    assert lint_with_defaults(src, "t.py", ON) == []
    bound = src.replace("            HPARAMS[k] = v\n", "            HPARAMS = dict(cfg)\n")
    [f] = lint_with_defaults(bound, "t.py", ON)
    assert f.code == "DDP027" and "`HPARAMS` is bound only where" in f.message
