"""Issue 20, second round: the false-positive classes the first blind review found, each
pinned by a fixture (tests/lint_corpus/fp_*.py) that expects nothing, and here by the one-line
change that makes the same code wrong again: the inference must still see it."""

from __future__ import annotations

from pathlib import Path

from ddpguard.lint import Selection, lint_paths, lint_source

CORPUS = Path(__file__).parent / "lint_corpus"
ALL = Selection(select=("ALL",), ignore=("DDP018",))


def codes(name: str, old: str = "", new: str = "") -> list[tuple[str, int]]:
    source = (CORPUS / name).read_text(encoding="utf-8")
    if old:
        assert old in source, old
        source = source.replace(old, new)
    return [(f.code, f.line) for f in lint_source(source, name, ALL)]


def test_leader_first_as_two_plain_ifs() -> None:
    name = "fp_leader_first_plain_if.py"
    assert codes(name) == []
    # Rank 0 no longer lets the others go: they wait at line 12 for a barrier rank 0 never
    # makes, while rank 0 goes on to the loop's barrier.
    got = codes(name, "        dist.barrier()  # rank 0 lets them go\n", "        pass\n")
    assert ("DDP005", 12) in got
    # A rank-0-only exit between the pair leaves the others in their barrier.
    got = codes(name, "    if expected is not None and len(items) < expected:",
                "    if dist.get_rank() == 0 and expected and len(items) < expected:")
    # (a raise: a failure, which torchrun turns into the end of the job; DDP022)
    assert [c for c, _ in got] == ["DDP022"]


def test_tensor_split_into_a_multiple_of_the_world_size_is_even() -> None:
    name = "fp_leader_first_plain_if.py"
    got = codes(name, "// (max_batch * world) + 1) * world", "// max_batch + 1)")
    assert got == [("DDP003", 23)]
    # chunk() may return fewer pieces than asked: not proven even.
    assert codes(name, ".tensor_split(num_batches)", ".chunk(num_batches)") == [("DDP003", 23)]


def test_both_sides_of_one_broadcast() -> None:
    name = "fp_broadcast_two_sides.py"
    assert codes(name) == []
    # The receivers go on to an all_reduce where the sender waits in a barrier.
    got = codes(name, "    data = payload[0]\n    assert data is not None\n    dist.barrier()",
                "    data = payload[0]\n    dist.all_reduce(torch.zeros(1))")
    assert "DDP005" in [c for c, _ in got]
    # An assert that can fire (not a type-checker narrowing) before the sender's broadcast.
    got = codes(name, "assert obj is not None", "assert obj.numel() > 0")
    assert got == [("DDP022", 15)]


def test_reduced_value_read_only_behind_the_callees_guard() -> None:
    name = "fp_reduce_read_in_callee.py"
    assert codes(name) == []
    assert codes(name, "        if not is_main():\n            return None\n", "") == [
        ("DDP016", 20)]
    # Handed to a builtin that reads it right there, on every rank.
    assert codes(name, "return self.summarize(stats)", "return float(stats)") == [
        ("DDP016", 20)]


def test_join_anywhere_on_the_command_line_handles_uneven_shards(tmp_path: Path) -> None:
    (tmp_path / "data.py").write_text(
        "import torch.distributed as dist\n"
        "def shard(files):\n"
        "    return files[dist.get_rank()::dist.get_world_size()]\n")
    trainer = tmp_path / "trainer.py"
    trainer.write_text(
        "from contextlib import nullcontext\n"
        "def train(model, loader, uneven):\n"
        "    ctx = model.join if uneven else nullcontext\n"
        "    with ctx():\n"
        "        for batch in loader:\n"
        "            model(batch).sum().backward()\n")
    assert [f.code for f in lint_paths([tmp_path], ALL)] == []
    trainer.write_text(trainer.read_text().replace("model.join", "model.no_sync"))
    assert [f.code for f in lint_paths([tmp_path], ALL)] == ["DDP003"]


HEAD = "import torch\nimport torch.distributed as dist\n\n\n"


def inline(src: str) -> list[tuple[str, int]]:
    return [(f.code, f.line - HEAD.count("\n")) for f in lint_source(HEAD + src, "t.py", ALL)]


EVALUATE = """\
def evaluate(args, data, is_master):
    sharded = getattr(args, "fsdp", False)
    leader = is_master(args)
    if not sharded and not leader:
        return {}
    signal = torch.zeros(1)
    if sharded:
        dist.broadcast(signal, src=0)
    return {"n": len(data)}
"""


def test_flag_from_a_predicate_call_is_true_on_rank_0() -> None:
    # `leader = is_master(args)` holds on rank 0 (a test of the rank, not the rank itself);
    # read as the rank value it came out false on rank 0 and the classes swapped places.
    src = EVALUATE.replace("    if sharded:\n        dist.broadcast", "    if True:\n"
                           "        dist.broadcast")
    [(code, line)] = inline(src)
    [f] = [f for f in lint_source(HEAD + src, "t.py", ALL)]
    assert (code, line) == ("DDP019", 5)
    assert f.message.startswith("ranks > 0 can leave at line")


def test_exit_and_collective_behind_the_same_flag_are_exclusive() -> None:
    assert inline(EVALUATE) == []
    # Another flag guards the collective: nothing ties the two, the hang is possible.
    src = EVALUATE.replace("    if sharded:\n", "    if args.sync:\n")
    assert inline(src) == [("DDP019", 5)]


def test_matching_pairs_stay_quiet_beside_a_real_divergence() -> None:
    """When a function holds a real divergence, the parts that do match (a leader-first
    context manager, one helper called from both arms, the two sides of one broadcast) must
    still align, so the finding is the real one alone."""
    src = """\
from contextlib import contextmanager


@contextmanager
def leader_first(rank):
    if rank > 0:
        dist.barrier()
    yield
    if rank == 0:
        dist.barrier()


def sync(t):
    dist.all_reduce(t)


def main(t, rank):
    with leader_first(rank):
        t = t + 1
    if rank == 0:
        sync(t)
    else:
        t = t * 2
        sync(t)
    if rank == 0:
        dist.broadcast_object_list([t], src=0)
    else:
        box = [None]
        dist.broadcast_object_list(box, src=0)
    if rank == 0:
        dist.barrier()
"""
    assert inline(src) == [("DDP005", 31)]
    assert inline(src[:src.rindex("    if rank == 0:\n        dist.barrier()\n")]) == []


def test_pairs_inside_helpers_stay_quiet_beside_a_real_divergence() -> None:
    src = """\
from contextlib import contextmanager


@contextmanager
def leader_first(rank):
    if rank > 0:
        dist.barrier()
    yield
    if rank == 0:
        dist.barrier()
    if rank == 0:
        dist.all_reduce(torch.zeros(1))


def share(obj, rank):
    if rank == 0:
        assert obj.numel() > 0
        dist.broadcast_object_list([obj], src=0)
        return obj
    box = [None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def main(t, rank):
    if rank == 0:
        t = share(t, rank)
    else:
        t = share(None, rank)
    if rank == 0:
        dist.barrier()
"""
    got = inline(src)
    # leader_first: only the extra all_reduce; share: only rank 0's assert before its
    # broadcast; main: only the last barrier. The matching pairs around them stay quiet.
    assert got == [("DDP005", 12), ("DDP022", 17), ("DDP005", 31)]


# -- issue 20, third round: classes from the second blind half ------------------------------

def test_paddle_data_parallel_is_not_torchs() -> None:
    src = "import paddle\nmodel = paddle.DataParallel(net)\n"
    assert [f.code for f in lint_source(src, "t.py", ALL)] == []
    src = "import torch\nmodel = torch.nn.DataParallel(net)\n"
    assert [f.code for f in lint_source(src, "t.py", ALL)] == ["DDP014"]


def test_set_device_in_another_file_places_the_model(tmp_path: Path) -> None:
    (tmp_path / "dist_utils.py").write_text(
        "import os\nimport torch\nimport torch.distributed as dist\n"
        "def enable():\n    torch.cuda.set_device(int(os.environ['LOCAL_RANK']))\n"
        "    dist.init_process_group('nccl')\n")
    (tmp_path / "linear.py").write_text(
        "import torch\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n"
        "def setup(model):\n    model = model.cuda()\n    return DDP(model)\n")
    assert [f.code for f in lint_paths([tmp_path], ALL)] == []
    assert [f.code for f in lint_paths([tmp_path / "linear.py"], ALL)] == ["DDP015"]


def test_shard_sized_by_len_floordiv_world_is_handled() -> None:
    src = """\
def validate(keys, rank):
    last_barrier_at = len(keys) // dist.get_world_size() - 1
    keys = keys[rank::dist.get_world_size()]
    for i, k in enumerate(keys):
        if i < last_barrier_at:
            dist.barrier()
    dist.barrier()
"""
    assert inline(src) == []
    assert inline(src.replace("len(keys) // dist.get_world_size() - 1", "10")) == [
        ("DDP003", 3)]


def test_skipping_the_first_index_is_no_empty_batch() -> None:
    src = """\
def evaluate(loader, warm):
    for it, data in enumerate(loader):
        if warm and it == 0:
            continue
        dist.all_reduce(data)
"""
    assert inline(src) == []
    assert inline(src.replace("warm and it == 0", "data is None")) == [("DDP004", 3)]


def test_move_inside_the_wraps_arguments_comes_first() -> None:
    src = """\
from torch.nn.parallel import DistributedDataParallel as DDP


def setup(model, rank):
    torch.cuda.set_device(rank)
    model = DDP(
        model.cuda(), device_ids=[rank])
    return model
"""
    assert inline(src) == []
    moved_after = src.replace("        model.cuda(), device_ids=[rank])\n",
                              "        model, device_ids=[rank])\n    model.cuda()\n")
    assert inline(moved_after) == [("DDP015", 8)]


def test_an_uncalled_helper_that_saves_through_another_is_left_to_its_caller(
        tmp_path: Path) -> None:
    src = """\
def persist(obj, path):
    torch.save(obj, path)


def export_ema(src, dst):
    persist(torch.load(src, map_location="cpu"), dst)


def setup():
    dist.init_process_group("gloo")
"""
    assert inline(src) == []
    called = src + "\n\nif __name__ == '__main__':\n    setup()\n" \
        "    export_ema('a.pt', 'b.pt')\n    dist.destroy_process_group()\n"
    assert inline(called) == [("DDP007", 2)]


RESUME = """\
def sync_path(path):
    box = [path]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def main(args, exists):
    if dist.get_rank() == 0 and exists and not args.resume:
        raise ValueError("the run exists")
    if args.resume:
        sync_path(args.path)
"""


def test_exclusive_flag_also_holds_through_a_helper() -> None:
    assert inline(RESUME) == []
    assert inline(RESUME.replace("    if args.resume:\n        sync_path", "    if args.sync:\n"
                                 "        sync_path")) == [("DDP022", 9)]


def test_an_exit_names_the_first_collective_it_does_abandon() -> None:
    [f] = lint_source(HEAD + RESUME + "    dist.barrier()\n", "t.py", ALL)
    assert (f.code, f.line - 4) == ("DDP022", 9)
    assert "barrier() at line 16" in f.message and "broadcast" not in f.message


# -- after the lint5 blind review (tuning data since) ---------------------------------------

def test_the_name_passed_as_rank_to_init_process_group_is_the_rank() -> None:
    src = """\
def run(proc_id, world, model):
    dist.init_process_group("nccl", rank=proc_id, world_size=world)
    if proc_id == 0:
        torch.save(model.state_dict(), "model.pt")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    torch.multiprocessing.spawn(run, args=(2, None), nprocs=2)
"""
    assert inline(src) == []
    assert inline(src.replace("rank=proc_id, ", "")) == [("DDP007", 4)]


def test_the_same_move_again_after_the_wrap_is_a_no_op() -> None:
    src = """\
from torch.nn.parallel import DistributedDataParallel as DDP


def main(model, device, load):
    model.to(device)
    model = DDP(model, device_ids=[device])
    model = load(model)
    model.to(device)
    return model
"""
    assert inline(src) == []
    assert inline(src.replace("    model.to(device)\n    model = DDP", "    model = DDP")) == [
        ("DDP015", 7)]
