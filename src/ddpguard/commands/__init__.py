"""Sub-commands of the `ddpguard` CLI, discovered by `ddpguard.cli`."""
