# ruff: noqa  (test data for ddpguard lint: kept as the seeds wrote it)
# Seed 003: the NCCL variables the post recommends, as a script would set them, and its
# init_process_group call with a long timeout.
import os
from datetime import timedelta

import torch.distributed as dist

os.environ["NCCL_TIMEOUT"] = "7200000"  # the post's "集合操作超时阈值" (not a real variable)
os.environ["NCCL_BLOCKING_WAIT"] = "1"  # 旧版本torch
os.environ["TORCH_NCCL_BLOCKING_WAIT"] = "1"  # 新版本torch (correct)
dist.init_process_group(backend="nccl", init_method="env://", timeout=timedelta(seconds=7200))
dist.destroy_process_group()
