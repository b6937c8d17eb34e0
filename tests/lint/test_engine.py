"""The engine: every rule's basic case, selection and `# noqa`, severities, DDP000, the seeds'
NCCL variables' messages, the torch floor, and rank provenance. The fixtures' markers
(tests/lint/fixtures) are read by test_fixtures.py."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import (
    ALL_BUT_PRINT,
    HEAD_DDP,
    HEAD_SCHEDULE,
    LINT_FIXTURES,
    codes_after_head,
    lint_paths_with_defaults,
    lint_with_defaults,
)

from ddpguard.lint import RULES, Selection, lint_file
from ddpguard.lint.analysis.provenance import GLOBAL, LOCAL, NONE
from ddpguard.lint.analysis.walker import build
from ddpguard.lint.pyproject import torch_floor


def test_noqa() -> None:
    src = 'os.environ["NCCL_TIMEOUT"] = "1"  # noqa: DDP011\n'
    src += 'os.environ["NCCL_TIMEOUT"] = "1"  # noqa\n'
    src += 'os.environ["NCCL_TIMEOUT"] = "1"  # noqa: DDP001\n'
    assert codes_after_head(src) == ["DDP011"]


def test_default_selection_excludes_info_rule() -> None:
    src = HEAD_DDP + 'dist.init_process_group("gloo")\nprint("x")\nmodel = DDP(net)\n'
    # DDP018 (info) and DDP012 (0 of 13 blind findings worth acting on) are off by default.
    assert [f.code for f in lint_with_defaults(src)] == []
    assert [
        f.code for f in lint_with_defaults(src, "t.py", Selection(extend_select=("DDP012",)))
    ] == ["DDP012"]
    assert Selection(ignore=("DDP01",)).codes() == [
        "DDP001",
        "DDP002",
        "DDP004",
        "DDP006",
        "DDP008",
        "DDP009",
        "DDP024",
        "DDP025",
        "DDP026",
        "DDP029",
        "DDP030",
        "DDP031",
        "DDP032",
        "DDP034",
        "DDP035",
        "DDP036",
        "DDP038",
        "DDP039",
        "DDP040",
        "DDP041",
        "DDP043",
        "DDP045",
        "DDP047",
        "DDP049",
        "DDP050",
        "DDP051",
    ]
    # The preview rules (precision below 90 % on their first findings in unseen code)
    # join only with preview=True, or when named; the CLI counts what they hold back.
    assert Selection(ignore=("DDP01", "DDP02", "DDP03", "DDP04", "DDP05"),
                     preview=True).codes() == [
        f"DDP00{i}" for i in range(1, 10) if i not in (3, 7)
    ]
    assert Selection().held_back() == ["DDP005", "DDP015", "DDP027", "DDP028", "DDP033",
                                       "DDP037", "DDP042", "DDP044", "DDP046", "DDP048"]
    assert Selection(ignore=("DDP005",)).held_back() == ["DDP015", "DDP027", "DDP028", "DDP033",
                                                         "DDP037", "DDP042", "DDP044", "DDP046",
                                                         "DDP048"]
    assert Selection(preview=True).held_back() == Selection(select=("DDP0",)).held_back() == []
    assert "DDP005" in Selection(extend_select=("DDP005",)).codes()
    assert "DDP005" in Selection(select=("DDP005",)).codes()
    with pytest.raises(ValueError, match="DDP999"):
        Selection(select=("DDP999",))


def test_syntax_error_reported_with_line() -> None:
    [f] = lint_with_defaults("x = 1\ndef f(:\n", "bad.py")
    assert (f.code, f.line, f.path) == ("DDP000", 2, "bad.py")
    assert "syntax" in f.message


def test_seed003_and_004_nccl_variables() -> None:
    # A variable nothing reads (DDP011, on by default); deprecated names torch still reads
    # and warns about (DDP023, off by default).
    msgs = [f.message for f in lint_file(LINT_FIXTURES / "DDP011_seed003_nccl_timeout.py")]
    assert len(msgs) == 1 and "NCCL_TIMEOUT does not exist" in msgs[0]
    msgs = [
        f.message
        for f in lint_file(
            LINT_FIXTURES / "DDP011_seed003_nccl_timeout.py", Selection(extend_select=("DDP023",))
        )
    ]
    assert any("NCCL_BLOCKING_WAIT is deprecated" in m for m in msgs)
    assert len(msgs) == 2  # TORCH_NCCL_BLOCKING_WAIT is the right name


def test_lint_does_not_import_torch() -> None:
    code = (
        "import sys; from ddpguard.lint import lint_paths; "
        f"lint_paths([{str(LINT_FIXTURES)!r}]); print('torch' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.strip() == "False"


def test_torch_floor_parsing() -> None:
    assert torch_floor(["torch>=2.6"], None) == (2, 6)
    assert torch_floor(["torch"], None) == (0, 0)
    assert torch_floor(["torchvision>=0.20"], None) is None
    assert torch_floor(['torch[cuda]>=2.1,<3; python_version>"3.9"'], None) == (2, 1)
    assert torch_floor(["torch>=2.0"], ">=3.13") == (2, 5)
    assert torch_floor([], None) is None


@pytest.mark.parametrize(
    ("setup", "test", "level"),
    [
        ("", "RANK in {-1, 0}", GLOBAL),
        ("", "RANK == -1", NONE),
        ("", "LOCAL_RANK != -1", NONE),
        ("", "args.gpu is not None", NONE),
        ("", "args.rank % ngpus_per_node == 0", LOCAL),
        (
            "ddp_rank = int(os.environ['RANK'])\nmaster = ddp_rank == 0\n",
            "it % 5 == 0 and master",
            GLOBAL,
        ),
        ("self.gpu_id = int(os.environ['LOCAL_RANK'])\n", "self.gpu_id == 0", LOCAL),
        ("who = int(os.environ.get('SLURM_PROCID', 0))\n", "who == 0", GLOBAL),
        ("r = dist.get_rank() if dist.is_initialized() else 0\n", "r == 0", GLOBAL),
        ("", "epoch % save_every == 0", NONE),
        ("", "args.gpu != 0 or args.rank != 0", GLOBAL),
    ],
)
def test_rank_provenance(setup: str, test: str, level: int) -> None:
    info = build(ast.parse(HEAD_DDP + setup))
    assert info.rank_level(ast.parse(test, mode="eval").body) == level


def test_function_guard_level_follows_its_call_sites() -> None:
    src = HEAD_DDP + (
        "def save(s):\n    torch.save(s, 'c.pt')\n"
        "def log(s):\n    print(s)\n"
        "if int(os.environ['LOCAL_RANK']) == 0:\n    save(1)\n    log(1)\n"
        "if dist.get_rank() == 0:\n    log(2)\n"
    )
    info = build(ast.parse(src))
    levels = {fn.name: lv for fn, lv in info.guarded_funcs.items()}
    assert levels == {"save": LOCAL, "log": LOCAL}  # one local-rank site is enough


def test_truthful_messages() -> None:
    [dp] = [
        f
        for f in lint_with_defaults(
            HEAD_DDP + "m = torch.nn.DataParallel(net)\n",
            "t.py",
            Selection(extend_select=("DDP014",)),
        )
        if f.code == "DDP014"
    ]
    assert "deprecated" not in dp.message and "GIL" in dp.message
    assert "DDP014" not in codes_after_head("m = torch.nn.DataParallel(net)\nm = DDP(net)\n")
    assert "DDP007" not in codes_after_head(
        'dist.init_process_group("gloo")\ntorch.save(x, io.BytesIO())\n'
    )


def test_bom_file_is_linted(tmp_path: Path) -> None:
    p = tmp_path / "bom.py"
    p.write_bytes(b"\xef\xbb\xbf" + (HEAD_SCHEDULE + "dist.barrier() if 0 else None\n").encode())
    assert [f.code for f in lint_paths_with_defaults([p], ALL_BUT_PRINT)] == []
    p.write_bytes(b"# -*- coding: latin-1 -*-\nx = '\xe9'\n")
    assert lint_paths_with_defaults([p], ALL_BUT_PRINT) == []
    p.write_bytes(b"x = '\xe9'\n")  # not UTF-8 and no cookie: Python refuses it too
    [f] = lint_paths_with_defaults([p], ALL_BUT_PRINT)
    assert f.code == "DDP000" and "encoding" in f.message


CASES: dict[str, tuple[str, str]] = {
    "DDP001": (
        """
        s = DistributedSampler(ds)
        loader = DataLoader(ds, sampler=s, drop_last=True)
        for epoch in range(3):
            for b in loader:
                pass
        """,
        """
        s = DistributedSampler(ds)
        train_loader = DataLoader(ds, sampler=s, drop_last=True)
        for epoch in range(3):
            train_loader.sampler.set_epoch(epoch)
            for b in train_loader:
                pass
        """,
    ),
    "DDP002": (
        "DataLoader(ds, sampler=DistributedSampler(ds), shuffle=True, drop_last=True)\n",
        "DataLoader(ds, sampler=None, shuffle=True)\n",
    ),
    "DDP003": (
        """
        def shard(files):
            return files[dist.get_rank()::dist.get_world_size()]
        """,
        """
        train_loader = DataLoader(ds, sampler=DistributedSampler(ds))
        every_other = files[0::2]
        """,
    ),
    "DDP004": (
        """
        def collate(batch):
            batch = [b for b in batch if b is not None]
            if not batch:
                return None
            return batch
        loader = DataLoader(ds, collate_fn=collate)
        for batch in loader:
            if batch is None:
                continue
            model(batch).sum().backward()
        """,
        """
        def collate(batch):
            return torch.stack(batch)
        loader = DataLoader(ds, collate_fn=collate)
        for batch in loader:
            if batch is None:
                raise RuntimeError("empty batch")
        """,
    ),
    "DDP005": (
        """
        if dist.get_rank() == 0:
            dist.broadcast(t, 0)
        else:
            dist.all_reduce(t)
        """,
        """
        if dist.get_rank() == 0:
            print("hi")
        dist.barrier()
        if world_size > 1:
            dist.all_reduce(t)
        """,
    ),
    "DDP006": (
        """
        model = DDP(nn.Sequential(net, nn.BatchNorm1d(8)))
        if dist.get_rank() == 0:
            out = model(x)
        """,
        """
        model = DDP(nn.Sequential(net, nn.BatchNorm1d(8)))
        out = model(x)
        if dist.get_rank() == 0:
            out = model.module(x)
        """,
    ),
    "DDP037": (
        """
        model = DDP(net)
        if dist.get_rank() == 0:
            out = model(x)
        """,
        # the same forward where a BatchNorm is visible is DDP006's
        """
        model = DDP(nn.Sequential(net, nn.BatchNorm1d(8)))
        if dist.get_rank() == 0:
            out = model(x)
        """,
    ),
    "DDP007": (
        """
        dist.init_process_group("gloo")
        torch.save(state, "ckpt.pt")
        """,
        """
        dist.init_process_group("gloo")
        def save(state):
            torch.save(state, "ckpt.pt")
        if dist.get_rank() == 0:
            save(state)
        """,
    ),
    "DDP008": (
        """
        if args.resume:
            net.load_state_dict(torch.load(args.resume, map_location="cpu"))
        model = DDP(net)
        torch.save(model.state_dict(), "x")
        """,
        """
        model = DDP(net)
        if args.resume:  # the resume reads into the same wrapper: the keys match
            model.load_state_dict(torch.load(args.resume, map_location="cpu"))
        torch.save(model.state_dict(), "y")
        """,
    ),
    "DDP009": (
        """
        net = torch.nn.Sequential(torch.nn.Conv2d(3, 3, 3), torch.nn.BatchNorm2d(3))
        model = DDP(net)
        model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)
        """,
        """
        net = torch.nn.Sequential(torch.nn.Conv2d(3, 3, 3), torch.nn.BatchNorm2d(3))
        net = torch.nn.SyncBatchNorm.convert_sync_batchnorm(net)
        model = DDP(net)
        """,
    ),
    "DDP021": (
        """
        net = torch.nn.Sequential(torch.nn.Conv2d(3, 3, 3), torch.nn.BatchNorm2d(3))
        model = DDP(net)
        """,
        """
        net = torch.nn.Sequential(torch.nn.Conv2d(3, 3, 3), torch.nn.BatchNorm2d(3))
        net = torch.nn.SyncBatchNorm.convert_sync_batchnorm(net)
        model = DDP(net)
        """,
    ),
    "DDP010": (
        "sd = torch.load(args.ckpt, map_location='cpu', weights_only=False)\n",
        "sd = torch.load(args.ckpt, map_location='cpu')\n"
        "sd = torch.load('x.pt', weights_only=False, map_location='cpu')\n"
        "def load(p, **kw):\n    return torch.load(p, **kw)\n",
    ),
    "DDP011": (
        'os.environ["NCCL_TIMEOUT"] = "1000"\n',
        'os.environ["TORCH_NCCL_BLOCKING_WAIT"] = "1"\nos.environ["NCCL_DEBUG"] = "1"\n',
    ),
    "DDP024": (
        """
        model = DDP(net)
        for b in loader:
            loss = model.module(b).sum()
            loss.backward()
            optimizer.step()
        """,
        """
        model = DDP(net)
        for b in loader:
            loss = model(b).sum()
            loss.backward()
            optimizer.step()
        """,
    ),
    "DDP023": (
        'os.environ["NCCL_ASYNC_ERROR_HANDLING"] = "1"\n',
        'os.environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = "1"\n',
    ),
    "DDP012": (
        'dist.init_process_group("gloo")\nif __name__ == "__main__":\n    pass\n',
        'dist.init_process_group("gloo")\ndist.destroy_process_group()\n'
        'if __name__ == "__main__":\n    pass\n',
    ),
    "DDP013": (
        """
        model = DDP(net)
        for i, b in enumerate(loader):
            model(b).sum().backward()
            if (i + 1) % 4 == 0:
                optimizer.step()
        """,
        """
        model = DDP(net)
        for i, b in enumerate(loader):
            with model.no_sync() if (i + 1) % 4 else contextlib.nullcontext():
                model(b).sum().backward()
            if (i + 1) % 4 == 0:
                optimizer.step()
        """,
    ),
    "DDP014": ("model = torch.nn.DataParallel(net)\n", "model = DDP(net)\n"),
    "DDP015": (
        """
        model = DDP(net.cuda())
        model = model.cuda()
        """,
        """
        model = DDP(net.cuda(), device_ids=[0])
        """,
    ),
    "DDP016": (
        """
        def mean(t):
            dist.reduce(t, dst=0)
            return t.item()
        """,
        """
        def mean(t):
            dist.reduce(t, dst=0)
            if dist.get_rank() == 0:
                return t.item()
            return None
        """,
    ),
    "DDP017": (
        """
        rank = int(os.environ["RANK"])
        local_rank = int(os.environ["LOCAL_RANK"])
        if local_rank == 0:
            torch.save(state, "ckpt.pt")
        """,
        """
        rank = int(os.environ["RANK"])
        if rank == 0:
            torch.save(state, "ckpt.pt")
        """,
    ),
    "DDP019": (
        """
        def resume(t, path):
            if dist.get_rank() == 0:
                if not os.path.exists(path):
                    return None
            dist.broadcast(t, 0)
        """,
        """
        def resume(t, path):
            if not os.path.exists(path):
                return None
            dist.broadcast(t, 0)
        """,
    ),
    "DDP022": (
        """
        def resume(t, path):
            if dist.get_rank() == 0:
                assert os.path.exists(path)
            dist.broadcast(t, 0)
        """,
        """
        def resume(t, path):
            assert os.path.exists(path)
            dist.broadcast(t, 0)
        """,
    ),
    "DDP020": (
        """
        sampler = DistributedSampler(val_set, shuffle=False)
        dist.all_reduce(correct)
        """,
        """
        sampler = DistributedSampler(val_set, shuffle=False, drop_last=True)
        dist.all_reduce(correct)
        """,
    ),
    "DDP025": (
        """
        node = int(os.environ["NODE_RANK"])
        rank = dist.get_rank()
        torch.cuda.set_device(rank)
        """,
        """
        local_rank = int(os.environ["LOCAL_RANK"])
        torch.cuda.set_device(local_rank)
        dist.init_process_group("nccl", rank=int(os.environ["RANK"]))
        """,
    ),
    "DDP026": (
        """
        with model.join():
            for b in loader:
                model(b).sum().backward()
                dist.all_reduce(t)
        """,
        """
        with model.join():
            for b in loader:
                model(b).sum().backward()
        dist.all_reduce(t)
        """,
    ),
    "DDP027": (
        """
        if dist.get_rank() == 0:
            path = "runs/a"
        state = torch.load(path)
        model = DDP(net)
        """,
        """
        path = None
        if dist.get_rank() == 0:
            path = "runs/a"
        state = torch.load(path)
        model = DDP(net)
        """,
    ),
    "DDP028": (
        "DistributedSampler(ds)\nmodel = torch.nn.DataParallel(net, device_ids=[gpu])\n",
        "model = torch.nn.DataParallel(net, device_ids=[0, 1])\n",
    ),
    "DDP029": (
        "dist.all_reduce(loss.detach().clone())\n",
        "t = loss.detach().clone()\ndist.all_reduce(t)\n",
    ),
    "DDP030": (
        'if not os.path.exists(d):\n    os.makedirs(d)\nmodel = DDP(net)\n',
        'if not os.path.exists(d):\n    os.makedirs(d, exist_ok=True)\nmodel = DDP(net)\n',
    ),
    "DDP031": (
        'if dist.get_rank() == 0:\n    torch.save(m, "a.pt")\nm = torch.load("a.pt")\n',
        'if dist.get_rank() == 0:\n    torch.save(m, "a.pt")\ndist.barrier()\n'
        'm = torch.load("a.pt")\n',
    ),
    "DDP032": (
        'def setup(rank, port):\n    while socket.socket().connect_ex(("", port)) == 0:\n'
        '        port += 1\n    os.environ["MASTER_PORT"] = str(port)\n'
        '    dist.init_process_group("gloo", rank=rank, world_size=2)\n',
        'def setup(rank, port):\n    os.environ["MASTER_PORT"] = str(port)\n'
        '    dist.init_process_group("gloo", rank=rank, world_size=2)\n',
    ),
    "DDP033": (
        'import torch.multiprocessing as mp\nif args.nodes > 1:\n'
        '    main(int(os.environ["RANK"]))\nelse:\n    mp.spawn(main, nprocs=2)\n',
        'import torch.multiprocessing as mp\nif "RANK" in os.environ:\n'
        '    main(int(os.environ["RANK"]))\nelse:\n    mp.spawn(main, nprocs=2)\n',
    ),
    "DDP034": (
        """
        rank = dist.get_rank()
        is_master = rank == 0
        if is_master:
            dist.barrier()
        if dist.get_rank() == 0:
            dist.all_reduce(t)
        """,
        # a different collective on the other side: DDP005's (preview), not certain
        """
        if dist.get_rank() == 0:
            dist.all_reduce(t)
        else:
            dist.broadcast(t, 0)
        """,
    ),
    "DDP035": (
        """
        import subprocess
        procs = []
        for rank in range(4):
            procs.append(subprocess.Popen(["python", "train.py", f"--rank={rank}"]))
        for p in procs:
            p.wait()
        """,
        # the same launcher that ends the others at the first failure
        """
        import subprocess
        procs = []
        for rank in range(4):
            procs.append(subprocess.Popen(["python", "train.py", f"--rank={rank}"]))
        for p in procs:
            if p.wait() != 0:
                for q in procs:
                    q.kill()
        """,
    ),
    "DDP036": (
        """
        class Lines(torch.utils.data.IterableDataset):
            def __iter__(self):
                for i, line in enumerate(open(self.path)):
                    if i % dist.get_world_size() == dist.get_rank():
                        yield line
        """,
        # the same stream, every rank stopped at a count agreed with MIN
        """
        class Lines(torch.utils.data.IterableDataset):
            def __iter__(self):
                for i, line in enumerate(open(self.path)):
                    if i % dist.get_world_size() == dist.get_rank():
                        yield line
        n = torch.tensor([count])
        dist.all_reduce(n, op=dist.ReduceOp.MIN)
        """,
    ),
    "DDP038": (
        """
        dist.init_process_group("gloo")
        train_ds, val_ds = torch.utils.data.random_split(dataset, [0.9, 0.1])
        sampler = torch.utils.data.DistributedSampler(train_ds)
        """,
        # the same split drawn from a generator seeded alike on every rank
        """
        dist.init_process_group("gloo")
        gen = torch.Generator().manual_seed(0)
        train_ds, val_ds = torch.utils.data.random_split(dataset, [0.9, 0.1], generator=gen)
        sampler = torch.utils.data.DistributedSampler(train_ds)
        """,
    ),
    "DDP039": (
        """
        dist.init_process_group("gloo")
        DDP(net)
        """,
        # the wrapper kept
        """
        dist.init_process_group("gloo")
        model = DDP(net)
        """,
    ),
    "DDP040": (
        """
        def train(rank):
            dist.init_process_group("gloo", world_size=4, rank=rank)
        torch.multiprocessing.spawn(train, nprocs=2)
        """,
        # the spawned count passed on
        """
        def train(rank, n):
            dist.init_process_group("gloo", world_size=n, rank=rank)
        torch.multiprocessing.spawn(train, args=(2,), nprocs=2)
        """,
    ),
    "DDP041": (
        """
        dist.init_process_group("gloo")
        val_loader = DataLoader(val_set, sampler=DistributedSampler(val_set))
        def validate(model):
            total = 0.0
            for x in val_loader:
                total += model(x).item()
            return total
        """,
        # the sums all-reduced before the metric
        """
        dist.init_process_group("gloo")
        val_loader = DataLoader(val_set, sampler=DistributedSampler(val_set))
        def validate(model):
            total = torch.zeros(())
            for x in val_loader:
                total += model(x)
            dist.all_reduce(total)
            return total.item()
        """,
    ),
    "DDP042": (
        """
        import os
        def setup(args):
            if "RANK" in os.environ:
                args.rank = int(os.environ["RANK"])
                args.world_size = int(os.environ["WORLD_SIZE"])
            elif "SLURM_PROCID" in os.environ:
                args.rank = int(os.environ["SLURM_PROCID"])
            dist.init_process_group("nccl", world_size=args.world_size, rank=args.rank)
        parser.add_argument("--world_size", default=1, type=int)
        """,
        # the SLURM arm sets the world size too
        """
        import os
        def setup(args):
            if "RANK" in os.environ:
                args.rank = int(os.environ["RANK"])
                args.world_size = int(os.environ["WORLD_SIZE"])
            elif "SLURM_PROCID" in os.environ:
                args.rank = int(os.environ["SLURM_PROCID"])
                args.world_size = int(os.environ["SLURM_NTASKS"])
            dist.init_process_group("nccl", world_size=args.world_size, rank=args.rank)
        parser.add_argument("--world_size", default=1, type=int)
        """,
    ),
    "DDP043": (
        """
        model = DDP(net)
        if dist.get_rank() == 0:
            scheduler.step()
        """,
        # every rank steps it
        """
        model = DDP(net)
        scheduler.step()
        """,
    ),
    "DDP044": (
        """
        model = DDP(net)
        loss = model(x).sum() / dist.get_world_size()
        loss.backward()
        """,
        # DDP averages the gradients: no division
        """
        model = DDP(net)
        loss = model(x).sum()
        loss.backward()
        """,
    ),
    "DDP045": (
        """
        model = DDP(net)
        loss = model(x).sum()
        with model.no_sync():
            loss.backward()
        """,
        # the forward inside the block: this backward does not all-reduce
        """
        model = DDP(net)
        with model.no_sync():
            loss = model(x).sum()
            loss.backward()
        """,
    ),
    "DDP046": (
        """
        rank = dist.get_rank()
        torch.cuda.set_device(rank)
        """,
        # a second node in sight: DDP025's
        """
        node = int(os.environ["NODE_RANK"])
        rank = dist.get_rank()
        torch.cuda.set_device(rank)
        """,
    ),
    "DDP047": (
        """
        for x in loader:
            pdb.set_trace()
            model(x).sum().backward()
        """,
        # behind a flag that is off by default
        """
        for x in loader:
            if args.debug:
                pdb.set_trace()
            model(x).sum().backward()
        """,
    ),
    "DDP048": (
        "model = DDP(net)\nmodel.generate(tokens)\n",
        # through the wrapped model
        "model = DDP(net)\nmodel.module.generate(tokens)\n",
    ),
    "DDP049": (
        """
        import pandas as pd
        dist.init_process_group("gloo")
        log = pd.DataFrame()
        for x in loader:
            model(x).sum().backward()
            if dist.get_rank() == 0:
                log = log.append({"loss": 1.0}, ignore_index=True)
        """,
        # the current spelling
        """
        import pandas as pd
        dist.init_process_group("gloo")
        log = pd.DataFrame()
        for x in loader:
            model(x).sum().backward()
            if dist.get_rank() == 0:
                log = pd.concat([log, pd.DataFrame([{"loss": 1.0}])], ignore_index=True)
        """,
    ),
    "DDP050": (
        """
        import argparse
        parser = argparse.ArgumentParser()
        parser.add_argument("--local_rank", type=int, default=0)
        args = parser.parse_args()
        dist.init_process_group("nccl")
        model = DDP(net, device_ids=[args.local_rank])
        """,
        # both spellings
        """
        import argparse
        parser = argparse.ArgumentParser()
        parser.add_argument("--local-rank", "--local_rank", type=int, default=0)
        args = parser.parse_args()
        dist.init_process_group("nccl")
        model = DDP(net, device_ids=[args.local_rank])
        """,
    ),
    "DDP051": (
        'dist.init_process_group("nccl", init_method="tcp://10.0.0.2:23456")\n',
        'dist.init_process_group("nccl", init_method="env://")\n',
    ),
    "DDP018": (
        'dist.init_process_group("gloo")\nprint("loss")\n',
        'dist.init_process_group("gloo")\nif dist.get_rank() == 0:\n    print("loss")\n'
        'print(f"rank {dist.get_rank()}")\n',
    ),
}


@pytest.mark.parametrize("code", sorted(CASES))
def test_rule_positive(code: str) -> None:
    assert code in codes_after_head(CASES[code][0])


@pytest.mark.parametrize("code", sorted(CASES))
def test_rule_negative(code: str) -> None:
    assert code not in codes_after_head(CASES[code][1])


def test_every_rule_has_cases() -> None:
    assert sorted(CASES) == sorted(set(RULES) - {"DDP000"})


def test_require_backward_grad_sync_counts_as_no_sync() -> None:
    src = CASES["DDP013"][0] + "model.require_backward_grad_sync = False\n"
    assert "DDP013" not in codes_after_head(src)
