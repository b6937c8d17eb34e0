"""`python -m ddpguard.guard.bootstrap script.py args...`: run an unmodified training script
with the guard. `ddpguard run` hands this to torchrun in place of the script.

We hook `torch.distributed.init_process_group` (the guard starts once the script's group
exists) and `destroy_process_group` (the guard stops first, so a clean exit is not mistaken
for a hang); DataLoader and optimizer hooks are installed by the guard itself.

Everything this module says goes through the guard's own descriptor (channel.py), and nothing
of ours may end the rank with a traceback of its own: a script that replaced `print` or its
streams still gets the guard's verdict and exit code 17.
"""

from __future__ import annotations

import functools
import os
import re
import runpy
import sys
import traceback
from typing import Any

from ddpguard.guard import channel

__all__ = ["main"]


def _world_from_env() -> Any:
    from ddpguard.world import detect

    return detect()


def _hook_process_group() -> None:
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    from ddpguard import guard

    orig_init = c10d.init_process_group
    orig_destroy = c10d.destroy_process_group

    @functools.wraps(orig_init)
    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        out = orig_init(*args, **kwargs)
        try:
            world = _world_from_env()
            if dist.get_world_size() > 1 and world.world_size == dist.get_world_size():
                guard.start(world)
        except Exception as exc:  # never break the user's set-up because of the guard
            channel.write(f"ddpguard: guard not started: {exc}")
        return out

    @functools.wraps(orig_destroy)
    def destroy_process_group(*args: Any, **kwargs: Any) -> Any:
        if not args and kwargs.get("group") is None:
            guard.stop("exited")
        return orig_destroy(*args, **kwargs)

    dist.init_process_group = init_process_group
    c10d.init_process_group = init_process_group
    dist.destroy_process_group = destroy_process_group
    c10d.destroy_process_group = destroy_process_group


def _peer_error(exc: BaseException) -> bool:
    """gloo/NCCL errors that mean 'the other side went away', not a bug on this rank."""
    low = str(exc).lower()
    return any(s in low for s in ("connection closed by peer", "connection reset by peer",
                                  "remote worker", "broken pipe"))


def _user_tb(exc: BaseException) -> Any:
    """The traceback from the script's first frame on: this module's and runpy's frames are
    ours, not the user's (Python run directly would not show them)."""
    tb = exc.__traceback__
    while tb is not None and (tb.tb_frame.f_code.co_filename in (__file__, runpy.__file__)
                              or "runpy" in tb.tb_frame.f_code.co_filename):
        tb = tb.tb_next
    return tb or exc.__traceback__


def _crashed(exc: BaseException) -> int:
    """This rank's own code raised: say where, whether a peer failed first, and whether the
    ranks had desynchronized just before (which turns a nonsense error into its cause)."""
    import time

    from ddpguard import guard
    from ddpguard.guard import crash
    from ddpguard.guard.rules import Decision
    from ddpguard.guard.stacks import is_library_file, short_path

    g = guard.active()
    if g is not None and (g.failure.active or g.store_get_many(["trigger"])):
        # The guard is stopping the job and this error is its echo (a peer left the
        # collective): let the guard thread finish its report and exit.
        time.sleep(30)
    tb = traceback.extract_tb(exc.__traceback__)
    user = next((f for f in reversed(tb) if not is_library_file(f.filename)),
                tb[-1] if tb else None)
    place = f" at {short_path(user.filename)}:{user.lineno}" if user else ""
    text = f"{type(exc).__name__}: {exc}{place}"
    rank = os.environ.get("RANK", "?")
    # The traceback Python would have printed, through our descriptor: the script's own
    # sys.stderr may be /dev/null on this rank.
    channel.write("".join(traceback.format_exception(type(exc), exc, _user_tb(exc))).rstrip())
    waiting = crash.waiting_on(g) if g is not None else ""
    others = crash.peer_failures(g) if g is not None and _peer_error(exc) else []
    cause = g.exchange.on_crash() if g is not None and not others else None
    if others:
        text = f"{type(exc).__name__} because {'; '.join(others)}"
        channel.write(f"ddpguard: rank {rank} stopped{place}{waiting}: a peer failed first: "
                      f"{'; '.join(others)}")
    elif cause:
        text = f"{type(exc).__name__} after a desync: {cause}"
        channel.write(f"ddpguard: rank {rank} crashed: {type(exc).__name__}: {exc}{place}\n"
                      f"ddpguard: the real cause: {cause}")
    else:
        channel.write(f"ddpguard: rank {rank} crashed: {text}")
    if g is not None and others:
        # A peer died and took this rank's collective with it: the guard's proof ("a peer
        # gone while this rank waits"), reported as such, with exit 17 and the JSON report.
        culprits = tuple(sorted({int(m) for m in re.findall(r"rank (\d+)", "; ".join(others))}
                                - {g.rank}))
        if user is not None:
            g.note_position(f"{short_path(user.filename)}:{user.lineno} in {user.name}  "
                            f"`{(user.line or '').strip()}`",
                            f"its collective failed when the peer died{waiting}")
        g.failure.fail(Decision("peer_gone", f"{'; '.join(others)}, while rank {g.rank} "
                                f"waited{waiting or ' in a collective'}", culprits),
                       g.read_peers())
    guard.stop("crashed", text)
    if g is not None and not others:
        crash.await_report(g, g.config.grace + 3.0)
    return 1


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:
        channel.write("usage: python -m ddpguard.guard.bootstrap script.py [args...]")
        return 2
    from ddpguard import guard
    from ddpguard.guard.ledger import ensure_recorder_env

    channel.open_channel()  # before the script can dup2 anything onto fd 2
    ensure_recorder_env()
    _hook_process_group()
    as_module = argv[0] in ("-m", "--module")
    if as_module:
        argv = argv[1:]
    sys.argv = list(argv)
    if not as_module:
        sys.path.insert(0, os.path.dirname(os.path.abspath(argv[0])))
    code = 0
    try:
        if as_module:
            runpy.run_module(argv[0], run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if exc.code not in (None, 0) and not isinstance(exc.code, int):
            channel.write(str(exc.code))
    except guard.UnevenBatchesError as exc:
        return _guard_raised(exc)
    except BaseException as exc:
        try:
            return _crashed(exc)
        except BaseException as inner:  # our own handling failed: say so in one line
            channel.write(f"ddpguard: rank {os.environ.get('RANK', '?')} crashed: "
                          f"{type(exc).__name__}: {exc} (and the guard could not report it: "
                          f"{type(inner).__name__}: {inner})")
            return 1
    guard.stop("exited")
    return code


def _guard_raised(exc: BaseException) -> int:
    """The guard itself stopped the training thread (loader lengths differ): the same report
    and exit code as any other stop, never a traceback out of this module."""
    from ddpguard import guard

    channel.write(str(exc))
    g = guard.active()
    try:
        if g is not None:
            from ddpguard.guard.rules import Decision

            # Ends the process (os._exit) once the report is written.
            g.failure.fail(Decision("uneven_batches", g.mismatch or str(exc)), g.read_peers())
    except Exception as inner:
        channel.write(f"ddpguard: the report could not be written: {inner}")
    return guard.EXIT_CODE


if __name__ == "__main__":
    sys.exit(main())
