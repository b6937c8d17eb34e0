# ruff: noqa  (test data for ddpguard lint: kept as the seeds wrote it)
# Seed 004, "开启 NCCL 调试" step, written as the os.environ writes a script would do.
import os

os.environ["NCCL_DEBUG"] = "INFO"
os.environ["NCCL_ASYNC_ERROR_HANDLING"] = "1"
os.environ["NCCL_BLOCKING_WAIT"] = "1"
