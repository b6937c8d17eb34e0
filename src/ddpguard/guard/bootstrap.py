"""`python -m ddpguard.guard.bootstrap script.py args...`: run an unmodified training script
with the guard. `ddpguard run` hands this to torchrun in place of the script.

The guard starts when the script forms its default process group (`autostart`, the same
hook every launch of `ddpguard run -- COMMAND` uses); DataLoader and optimizer hooks are
installed by the guard itself.

Everything this module says goes through the guard's own descriptor (channel.py), and nothing
of ours may end the rank with a traceback of its own: a script that replaced `print` or its
streams still gets the guard's verdict and exit code 17.
"""

from __future__ import annotations

import os
import runpy
import sys

from ddpguard.guard import autostart, channel, workers
from ddpguard.guard.crash import report_exception

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:
        channel.write("usage: python -m ddpguard.guard.bootstrap script.py [args...]")
        return 2
    from ddpguard import guard
    from ddpguard.guard.ledger import ensure_recorder_env

    channel.open_channel()  # before the script can dup2 anything onto fd 2
    _mark_attempt()
    ensure_recorder_env()
    autostart.hook_process_group()
    workers.note_loader_sites()
    as_module = argv[0] in ("-m", "--module")
    if as_module:
        argv = argv[1:]
    sys.argv = list(argv)
    if not as_module:
        sys.path.insert(0, os.path.dirname(os.path.abspath(argv[0])))
    code = 0
    failure: BaseException | None = None
    try:
        if as_module:
            runpy.run_module(argv[0], run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        _note_exit(exc)
        if exc.code not in (None, 0) and not isinstance(exc.code, int):
            channel.write(str(exc.code))
    except BaseException as exc:
        failure = exc  # a plain store: nothing here may run a signal handler (see below)
    if failure is None:
        guard.stop("exited")
        return code
    earlier = failure
    for _ in range(4):
        # torch's SIGCHLD handler raises a dead DataLoader worker's error at the first call
        # after the rank's read failed, which is ours: inside this `try` it is caught and
        # reported in place of the first error (crash.settle), not a traceback of ours.
        try:
            return report_exception(failure, earlier)
        except Exception as late:
            failure = late
    return report_exception(failure, earlier)


def _mark_attempt() -> None:
    """Under `ddpguard run`, say that this attempt started (before the script can fail), so
    the launcher's verdict is the last attempt's."""
    from ddpguard import attempts
    from ddpguard.guard.report import LAUNCH_ENV

    launch, folder = os.environ.get(LAUNCH_ENV), os.environ.get("DDPGUARD_REPORT_DIR")
    if launch and folder:
        attempts.mark_start(folder, launch, attempts.attempt_now())


def _note_exit(exc: SystemExit) -> None:
    """The line of the script's `sys.exit`: the innermost frame of its traceback."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    if tb is not None:
        from .leaving import note_leave_site

        note_leave_site(tb.tb_frame)


if __name__ == "__main__":
    sys.exit(main())
