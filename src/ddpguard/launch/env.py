"""The variables `ddpguard run` gives every rank it launches, whichever way it launches them."""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass

from ddpguard.guard.channel import LAUNCHER_ENV
from ddpguard.guard.report import LAUNCH_ENV

from .outcome import Launch

__all__ = ["LaunchEnv", "launch_env"]


@dataclass(frozen=True)
class LaunchEnv:
    launch: Launch
    variables: dict[str, str]


def launch_env(environ: dict[str, str] | os._Environ[str] | None = None) -> LaunchEnv:
    """A report folder the launcher knows (absolute: the script may chdir), this launch's id
    (to tell its reports from older ones in the same folder), the directory paths are shown
    relative to, and the word that makes the ranks leave the stop block to the launcher."""
    env = os.environ if environ is None else environ
    folder = os.path.abspath(env.get("DDPGUARD_REPORT_DIR") or "ddpguard-reports")
    launch = Launch(folder, uuid.uuid4().hex)
    return LaunchEnv(launch, {
        LAUNCHER_ENV: "1", LAUNCH_ENV: launch.launch_id, "DDPGUARD_REPORT_DIR": folder,
        "DDPGUARD_START_DIR": env.get("DDPGUARD_START_DIR") or os.getcwd()})
