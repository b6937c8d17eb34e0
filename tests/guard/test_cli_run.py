"""`ddpguard run` end to end (real torch.distributed.run) and `ddpguard doctor`."""

from __future__ import annotations

import subprocess
import sys

import pytest
from helpers import ROOT, child_env, run_cli

from ddpguard.launch.argv import default_nproc, split_launcher_args

FLAGS = {"--standalone", "-m", "--module", "--no-python", "--run-path", "--no-guard"}


@pytest.mark.parametrize(
    "argv, opts, rest",
    [
        (["train.py", "--lr", "1"], [], ["train.py", "--lr", "1"]),
        (["--nproc-per-node", "4", "train.py"], ["--nproc-per-node", "4"], ["train.py"]),
        (["--nnodes=2", "--standalone", "t.py", "-x"], ["--nnodes=2", "--standalone"],
         ["t.py", "-x"]),
        (["--max-restarts", "1", "--", "t.py"], ["--max-restarts", "1"], ["t.py"]),
        (["--nproc-per-node", "2"], ["--nproc-per-node", "2"], []),
    ],
)
def test_split_launcher_args(argv, opts, rest):
    assert split_launcher_args(argv, FLAGS) == (opts, rest)


def test_default_process_count():
    assert default_nproc(0) == 2
    assert default_nproc(8) == 8


def test_demo_places_ranks_on_gpus_or_on_the_cpu():
    from ddpguard.commands.demo import plan_ranks

    assert plan_ranks(None, 0) == (2, None)
    assert plan_ranks(None, 1) == (1, None)
    assert plan_ranks(None, 8) == (8, None)
    assert plan_ranks(4, 8) == (4, None)
    assert plan_ranks(3, 0) == (3, None)
    n, note = plan_ranks(2, 1)  # NCCL refuses two ranks on one GPU
    assert n == 2 and note is not None and "2 ranks" in note and "1 GPU" in note and "gloo" in note


def test_run_hello_on_two_ranks():
    res = run_cli("run", "--nproc-per-node", "2", "examples/hello.py", timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.count("hello from rank 0 of 2 (torchrun)") == 1
    assert res.stdout.count("hello from rank 1 of 2 (torchrun)") == 1
    assert "sum of (rank + 1) over 2 ranks = 3" in res.stdout


def test_hello_as_single_process():
    res = subprocess.run([sys.executable, "examples/hello.py"], capture_output=True, text=True,
                         timeout=120, env=child_env(), cwd=ROOT)
    assert res.returncode == 0, res.stderr
    assert "hello from rank 0 of 1 (single)" in res.stdout


def test_failing_script_gives_nonzero_exit(tmp_path):
    script = tmp_path / "fail.py"
    script.write_text("import sys\nsys.exit(3)\n")
    res = run_cli("run", "--nproc-per-node", "1", str(script), timeout=120)
    assert res.returncode == 3


def test_run_without_script_is_a_usage_error():
    res = run_cli("run", "--nproc-per-node", "2", timeout=60)
    assert res.returncode == 2
    assert "no script or command given" in res.stderr


def test_two_nodes_on_loopback():
    """Two torchrun agents, --nnodes 2, c10d rendezvous on 127.0.0.1: one world of 2."""
    from ddpguard.testing import free_port

    endpoint = f"127.0.0.1:{free_port()}"
    common = ["--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
              "--rdzv-endpoint", endpoint, "--rdzv-id", "twonodes", "--max-restarts", "0"]
    procs = [
        subprocess.Popen([sys.executable, "-m", "ddpguard", "run", *common, "--node-rank",
                          str(node), "examples/hello.py"],
                         env=child_env(), cwd=ROOT, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
        for node in (0, 1)
    ]
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=150))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    assert [p.returncode for p in procs] == [0, 0], [e for _, e in outs]
    text = "".join(o for o, _ in outs)
    assert "hello from rank 0 of 2 (torchrun)" in text
    assert "hello from rank 1 of 2 (torchrun)" in text


def test_doctor_flags_bad_variables():
    res = run_cli("doctor", env=child_env(NCCL_TIMEOUT="1800", NCCL_BLOCKING_WAIT="1"),
                  timeout=60)
    assert res.returncode == 0, res.stderr
    assert "NCCL_TIMEOUT=1800   <- DOES NOT EXIST" in res.stdout
    assert "NCCL_BLOCKING_WAIT=1   <- DEPRECATED: use TORCH_NCCL_BLOCKING_WAIT" in res.stdout
    assert "ddpguard would run as: rank 0/1" in res.stdout
    assert "torch 2." in res.stdout and "backends: gloo yes" in res.stdout


def test_doctor_explains_half_set_environment():
    res = run_cli("doctor", env=child_env(RANK="1"), timeout=60)
    assert "ddpguard would refuse to start: half-set distributed environment" in res.stdout
