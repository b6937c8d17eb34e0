"""A finding inside a function the program can never run is false, whatever the rule: new-vrwkv's
`distill_main.py` asserts `args.distill` and then calls `main()` only in the `else` of `if
args.distill:` (corpus39a, DDP019 judged false). Each dead shape has a live twin that must
still report."""

from __future__ import annotations

import textwrap
from pathlib import Path

from helpers import lint_paths

BODY = """\
import torch.distributed as dist


def main(args):
    dist.init_process_group("gloo")
    if dist.get_rank() == 0 and args.throughput:
        return
    dist.barrier()


def main_distill(args):
    dist.init_process_group("gloo")
    dist.barrier()


"""


def _ddp019(tmp_path: Path, files: dict[str, str]) -> list[tuple[str, int]]:
    for name, text in files.items():
        (tmp_path / name).write_text(textwrap.dedent(text))
    return sorted((Path(f.path).name, f.line) for f in lint_paths([tmp_path])
                  if f.code == "DDP019")


def _script(tail: str) -> str:
    return BODY + textwrap.dedent(tail)


ASSERTED = """\
if __name__ == "__main__":
    args = parse()
    assert args.distill
    if args.distill:
        main_distill(args)
    else:
        main(args)
"""


def test_a_call_in_the_arm_an_assert_rules_out_is_dead(tmp_path: Path) -> None:
    assert _ddp019(tmp_path, {"distill_main.py": _script(ASSERTED)}) == []


def test_without_the_assert_the_call_is_live(tmp_path: Path) -> None:
    text = _script(ASSERTED.replace("    assert args.distill\n", ""))
    assert _ddp019(tmp_path, {"distill_main.py": text}) == [("distill_main.py", 7)]


def test_asserting_the_negation_kills_the_body_instead(tmp_path: Path) -> None:
    text = _script(ASSERTED.replace("assert args.distill", "assert not args.distill"))
    assert _ddp019(tmp_path, {"distill_main.py": text}) == [("distill_main.py", 7)]


def test_a_call_in_the_body_of_what_was_asserted_false_is_dead(tmp_path: Path) -> None:
    text = _script("""\
        if __name__ == "__main__":
            args = parse()
            assert not args.legacy
            if args.legacy:
                main(args)
            main_distill(args)
        """)
    assert _ddp019(tmp_path, {"train.py": text}) == []


def test_a_constant_false_arm_is_dead(tmp_path: Path) -> None:
    text = _script("""\
        if __name__ == "__main__":
            if False:
                main(parse())
            main_distill(parse())
        """)
    assert _ddp019(tmp_path, {"train.py": text}) == []


def test_another_script_of_the_same_name_is_not_a_caller(tmp_path: Path) -> None:
    # main.py's own `main()` calls its own definition, not distill_main's.
    other = _script('if __name__ == "__main__":\n    main(parse())\n')
    assert _ddp019(tmp_path, {"distill_main.py": _script(ASSERTED), "main.py": other}) == [
        ("main.py", 7)]


def test_an_importer_keeps_it_alive(tmp_path: Path) -> None:
    importer = "from distill_main import main\n\nmain(None)\n"
    assert _ddp019(tmp_path, {"distill_main.py": _script(ASSERTED), "run.py": importer}) == [
        ("distill_main.py", 7)]


def test_unnamed_in_a_script_of_a_project_is_dead(tmp_path: Path) -> None:
    text = _script('if __name__ == "__main__":\n    main_distill(parse())\n')
    helper = "def parse():\n    return None\n"
    assert _ddp019(tmp_path, {"train.py": text, "opts.py": helper}) == []


def test_unnamed_in_a_lone_file_stays_reported(tmp_path: Path) -> None:
    # Alone, the file shows none of its importers.
    text = _script('if __name__ == "__main__":\n    main_distill(parse())\n')
    assert _ddp019(tmp_path, {"train.py": text}) == [("train.py", 7)]


def test_a_spawned_function_is_live(tmp_path: Path) -> None:
    spawned = _script('if __name__ == "__main__":\n    mp.spawn(main, nprocs=2)\n')
    helper = "def parse():\n    return None\n"
    assert _ddp019(tmp_path, {"train.py": spawned, "opts.py": helper}) == [("train.py", 7)]


def test_functions_looked_up_by_name_at_run_time_are_live(tmp_path: Path) -> None:
    # `fire.Fire()` with no argument exposes every function of the module as a command
    text = _script('if __name__ == "__main__":\n    fire.Fire()\n')
    helper = "def parse():\n    return None\n"
    assert _ddp019(tmp_path, {"train.py": text, "opts.py": helper}) == [("train.py", 7)]
    text = _script('if __name__ == "__main__":\n    globals()[parse().cmd](parse())\n')
    assert _ddp019(tmp_path, {"train.py": text, "opts.py": helper}) == [("train.py", 7)]


def test_vars_of_the_options_looks_up_no_function(tmp_path: Path) -> None:
    # new-vrwkv's `json.dumps(vars(args))` beside the asserted-away call
    text = _script(ASSERTED.replace("    assert args.distill\n",
                                    "    assert args.distill\n    print(vars(args))\n"))
    assert _ddp019(tmp_path, {"distill_main.py": text}) == []
