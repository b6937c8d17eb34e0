"""Whether a script forms a process group at all: a `__main__` script that calls nothing that
could form one never reaches a collective, so what its DistributedSampler would need never
matters."""

from __future__ import annotations

import re

from .context import ModuleInfo

MAY_FORM = re.compile("dist|setup|init|launch|accelerat|spawn|fabric|comm|deepspeed|horovod|hvd")
NOT_FORMING = ("distributedsampler", "distributeddataparallel", "ddp")


def never_forms_a_group(info: ModuleInfo) -> bool:
    """A script (it has a `__main__` block) that calls nothing that could form the process
    group: no `init_process_group`, no helper named like a set-up (`init_distributed_mode`,
    `setup(rank)`, `deepspeed.initialize`), nothing it spawns. A DistributedSampler there
    raises "Default process group has not been initialized" before the first epoch, so a
    missing set_epoch never matters (CodeBERT's UniXcoder code completion, whose distributed
    arm wraps in apex's DDP and never calls init_process_group)."""
    if not info.has_main:
        return False
    for name in info.call_lasts():
        last = name.lower()
        if last.startswith("__") or last in NOT_FORMING:
            continue
        if MAY_FORM.search(last):
            return False
    return True
