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
import runpy
import sys
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


def _crashed(exc: BaseException) -> int:
    """This rank's own code raised: the crash path (crash.handle_exception) says where and
    why, and stops the job with its report where it can explain the end."""
    from ddpguard.guard.crash import handle_exception

    return handle_exception(exc)


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
    from ddpguard.guard.crash import guard_raised

    return guard_raised(exc)


if __name__ == "__main__":
    sys.exit(main())
