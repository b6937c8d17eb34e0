"""The argument words of `ddpguard run`, as pure functions: which words are torchrun's, which
are ddpguard's own, and the exact argv handed to torch.distributed.run. Every default is
testable without starting a process."""

from __future__ import annotations

__all__ = ["BOOTSTRAP", "OUR_FLAGS", "OUR_VALUES", "flag_options", "split_launcher_args",
           "pop_our_options", "build_torchrun_argv", "default_nproc", "user_logs",
           "max_restarts"]

BOOTSTRAP = "ddpguard.guard.bootstrap"
OUR_FLAGS = {"--no-guard"}
OUR_VALUES = {"--stall-timeout"}


def flag_options() -> set[str]:
    """torchrun options that take no value, read from torchrun's own parser so a new torch
    release with new flags cannot make us misplace the script."""
    from torch.distributed.run import get_args_parser

    flags: set[str] = set()
    for action in get_args_parser()._actions:
        if action.nargs == 0:
            flags.update(action.option_strings)
    return flags


def split_launcher_args(argv: list[str], flags: set[str]) -> tuple[list[str], list[str]]:
    """Split into (torchrun options, [script, *script args]). Pure."""
    i = 0
    while i < len(argv):
        word = argv[i]
        if word == "--":
            return argv[:i], argv[i + 1 :]
        if not word.startswith("-"):
            return argv[:i], argv[i:]
        if "=" in word or word in flags:
            i += 1
        else:
            i += 2  # an option with its value in the next word
    return argv, []


def pop_our_options(opts: list[str]) -> tuple[list[str], dict[str, str]]:
    """Take ddpguard's own valued options out of the launcher options: (rest, settings). Pure.
    A bad value raises ValueError naming it."""
    rest: list[str] = []
    settings: dict[str, str] = {}
    i = 0
    while i < len(opts):
        word = opts[i]
        name, eq, value = word.partition("=")
        if name in OUR_VALUES:
            if not eq:
                if i + 1 >= len(opts):
                    raise ValueError(f"{name} needs a value in seconds")
                value = opts[i + 1]
                i += 1
            try:
                seconds = float(value)
            except ValueError:
                raise ValueError(f"{name}={value!r} is not a number of seconds") from None
            if not seconds > 0:
                raise ValueError(f"{name}={value!r} must be > 0 seconds")
            settings["DDPGUARD_STALL_TIMEOUT"] = value
        else:
            rest.append(word)
        i += 1
    return rest, settings


def _given(opts: list[str], *names: str) -> bool:
    return any(o == n or o.startswith(n + "=") for o in opts for n in names)


def default_nproc(gpu_count: int) -> int:
    return gpu_count if gpu_count > 0 else 2


def build_torchrun_argv(
    argv: list[str], *, gpu_count: int, flags: set[str], guard: bool = True,
    log_dir: str | None = None,
) -> list[str]:
    """The exact argv handed to torch.distributed.run. Pure, so every default is testable.

    With `guard` (and unless `--no-guard` is among the options) the script is wrapped:
    `-m ddpguard.guard.bootstrap script.py args`; a user's own `-m module` becomes
    `-m ddpguard.guard.bootstrap -m module args`. `--no-python` runs a non-Python program,
    which cannot be guarded, so it is left alone. With `log_dir`, and unless the user chose
    how torchrun keeps logs, each rank's stderr goes to a file there (`--redirects=2`)."""
    opts, rest = split_launcher_args(argv, flags | OUR_FLAGS)
    if not rest:
        raise ValueError("no script given: usage is `ddpguard run [torchrun options] script.py`")
    guard = guard and "--no-guard" not in opts
    opts = [o for o in opts if o not in OUR_FLAGS]
    opts, _ = pop_our_options(opts)
    if guard and not _given(opts, "--no-python", "--no_python"):
        user_module = [o for o in opts if o in ("-m", "--module")]
        opts = [o for o in opts if o not in ("-m", "--module")]
        rest = ["-m", BOOTSTRAP, *(["-m"] if user_module else []), *rest]
    if guard and not _given(opts, "--monitor-interval", "--monitor_interval"):
        opts.append("--monitor-interval=1")
    if guard and log_dir and not user_logs(opts):
        opts += ["--redirects=2", f"--log-dir={log_dir}"]
    if not _given(opts, "--nproc-per-node", "--nproc_per_node"):
        opts.append(f"--nproc-per-node={default_nproc(gpu_count)}")
    multi_node = _given(
        opts, "--nnodes", "--rdzv-endpoint", "--rdzv_endpoint", "--master-addr",
        "--master_addr", "--master-port", "--master_port", "--standalone",
    )
    if not multi_node:
        opts.append("--standalone")
    return opts + rest


def user_logs(opts: list[str]) -> bool:
    """Did the user choose how torchrun keeps the ranks' output? Then we leave it alone."""
    return _given(opts, "--redirects", "-r", "--tee", "-t", "--log-dir", "--log_dir",
                  "--local-ranks-filter", "--local_ranks_filter")


def max_restarts(opts: list[str]) -> int:
    """torchrun's `--max-restarts` among the launcher options (0 when absent). Pure."""
    for i, word in enumerate(opts):
        name, eq, value = word.partition("=")
        if name in ("--max-restarts", "--max_restarts"):
            raw = value if eq else (opts[i + 1] if i + 1 < len(opts) else "")
            try:
                return max(0, int(raw))
            except ValueError:
                raise ValueError(f"{name}={raw!r} is not a whole number of restarts") from None
    return 0
