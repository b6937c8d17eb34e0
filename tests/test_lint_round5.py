"""Issue 20, fifth round: the false-positive classes of the lint8 tuning corpus (old example
trainers launched one process per GPU), each pinned by a fixture of our own that expects only
the findings that are true, and by the one-line change to the script that makes the analysis
report again (the inference must still see real bugs)."""

from __future__ import annotations

from pathlib import Path

from ddpguard.lint import Selection, lint_source

CORPUS = Path(__file__).parent / "lint_corpus"
ALL = Selection(select=("ALL",), ignore=("DDP018",))
NAME = "fp_cache_leader_eval.py"


def findings(*edits: str) -> list[tuple[str, int, str]]:
    """The fixture's findings after each (old, new) pair of `edits` is applied once."""
    source = (CORPUS / NAME).read_text(encoding="utf-8")
    for old, new in zip(edits[::2], edits[1::2], strict=True):
        assert source.count(old) == 1, old
        source = source.replace(old, new)
    return [(f.code, f.line, f.message) for f in lint_source(source, NAME, ALL)]


def codes(*edits: str) -> list[tuple[str, int]]:
    return [(c, line) for c, line, _ in findings(*edits)]


def test_the_old_example_trainer_shape_is_quiet_but_for_the_node_local_saves() -> None:
    # The cache write and the checkpoint block: local rank 0 of every node writes them
    # (the script reads get_rank(), so it runs on several nodes). Once per block.
    assert codes() == [("DDP017", 24), ("DDP017", 51)]


def test_a_literal_argument_decides_the_callees_test() -> None:
    # With `evaluate=True` the leader's barrier is skipped: rank 0 may evaluate alone.
    # Without the `not evaluate` on the leader's side, rank 0 waits in that barrier while the
    # others have left: the hang is reported at main's call, through evaluate() and
    # load_features().
    got = findings("    if args.local_rank == 0 and not evaluate:\n",
                   "    if args.local_rank == 0:\n")
    hangs = [(c, line, m) for c, line, m in got if c == "DDP005"]
    # load_features() itself: the leader waits even when told it evaluates; and main's
    # rank-0-only evaluation, through evaluate() (train's call passes the default False, under
    # which the pair still matches).
    assert [(c, line) for c, line, _ in hangs] == [("DDP005", 26), ("DDP005", 70)]
    assert "barrier() at line 26 (through the call at line 70)" in hangs[1][2]
    # The literal decides only the parameter it binds: passed by name or by position.
    assert codes("    feats = load_features(args, evaluate=True)\n",
                 "    feats = load_features(args, True)\n") == codes()


def test_a_literal_reaches_through_a_parameter_of_the_caller() -> None:
    src = '''import torch.distributed as dist


def load(rank, evaluate=False):
    if rank > 0 and not evaluate:
        dist.barrier()
    if rank == 0 and not evaluate:
        dist.barrier()


def run(rank, evaluate):
    load(rank, evaluate)


def main(rank):
    dist.init_process_group("gloo")
    if rank == 0:
        run(rank, True)
    dist.destroy_process_group()
'''
    assert [f.code for f in lint_source(src, "t.py", ALL)] == []
    assert [(f.code, f.line) for f in lint_source(src.replace("run(rank, True)",
                                                              "run(rank, False)"),
                                                  "t.py", ALL)] == [("DDP005", 18)]


# Evaluation with gradients on: a forward under no_grad on rank 0 alone pairs its one buffer
# broadcast with the others' next training forward (sixth round), so these checks of which
# arm runs and which name holds the wrapper evaluate with gradients.
GRAD_ON = ("    with torch.no_grad():\n        return model(feats).mean().item()\n",
           "    if True:\n        return model(feats).mean().item()\n")


def test_the_single_process_arm_is_never_taken_in_a_distributed_run() -> None:
    # `args.local_rank == -1` is false on every rank once launched: the evaluation under it
    # (which runs the leader-first cache load) is no rank-0-only collective. Drop the test
    # and rank 0 forwards the DDP model alone.
    assert not [c for c in codes(*GRAD_ON) if c[0] == "DDP006"]
    got = codes("            if args.local_rank == -1 and args.eval_during_training:\n",
                "            if args.eval_during_training:\n", *GRAD_ON)
    assert ("DDP006", 48) in got


def test_a_local_name_holds_the_wrapper_only_where_it_was_wrapped() -> None:
    # main() evaluates a fresh `model` on rank 0 only: not the wrapper of train().
    assert not [c for c in codes(*GRAD_ON) if c[0] == "DDP006"]
    # Rank 0 evaluating the wrapped model inside train() is a forward of the wrapper.
    got = codes("            if args.local_rank == -1 and args.eval_during_training:\n"
                "                print(evaluate(args, model))\n",
                "            print(evaluate(args, model))\n", *GRAD_ON)
    assert ("DDP006", 47) in got
    # Under no_grad its one broadcast pairs with the others' next training forward.
    assert not [c for c in codes("            if args.local_rank == -1 and "
                                 "args.eval_during_training:\n"
                                 "                print(evaluate(args, model))\n",
                                 "            print(evaluate(args, model))\n") if c[0] == "DDP006"]


def test_a_node_local_save_is_reported_where_it_is_not_at_every_call() -> None:
    got = findings()
    assert all("load_features() writes" not in m and "evaluate() writes" not in m
               for _, _, m in got)
    # A helper whose save has no test of its own is reported at the guarded call.
    got = codes("        if args.local_rank in [-1, 0]:\n"
                "            torch.save(feats, path)  # expect: DDP017\n",
                "        torch.save(feats, path)\n")
    assert ("DDP017", 69) in got and ("DDP017", 23) not in got
