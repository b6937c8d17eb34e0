"""One module per rule, named after it (`ddp005_collective_divergence.py`): its metadata in
`@rule(...)`, its user-facing explanation in the module docstring, its code. Rules read
lint/analysis/ and never each other."""

from __future__ import annotations

from . import (
    ddp001_missing_set_epoch,
    ddp002_shuffle_with_sampler,
    ddp003_uneven_manual_shard,
    ddp004_rank_dependent_step_count,
    ddp005_collective_divergence,
    ddp006_ddp_forward_divergence,
    ddp007_shared_file_write,
    ddp008_save_ddp_state_dict,
    ddp009_syncbatchnorm_after_wrap,
    ddp010_unsafe_torch_load,
    ddp011_bad_nccl_variable,
    ddp012_missing_destroy,
    ddp013_accumulation_without_no_sync,
    ddp014_data_parallel,
    ddp015_ddp_device_placement,
    ddp016_reduce_read_on_all_ranks,
    ddp017_local_rank_zero_writes,
    ddp018_unguarded_print,
    ddp019_exit_before_collective,
    ddp020_padded_eval_sampler,
    ddp021_batchnorm_local_statistics,
    ddp022_failure_before_collective,
    ddp023_deprecated_nccl_variable,
    ddp024_forward_around_ddp,
)

# In code order: the engine runs them, and docs/lint.md lists them, in this order.
MODULES = [
    ddp001_missing_set_epoch,
    ddp002_shuffle_with_sampler,
    ddp003_uneven_manual_shard,
    ddp004_rank_dependent_step_count,
    ddp005_collective_divergence,
    ddp006_ddp_forward_divergence,
    ddp007_shared_file_write,
    ddp008_save_ddp_state_dict,
    ddp009_syncbatchnorm_after_wrap,
    ddp010_unsafe_torch_load,
    ddp011_bad_nccl_variable,
    ddp012_missing_destroy,
    ddp013_accumulation_without_no_sync,
    ddp014_data_parallel,
    ddp015_ddp_device_placement,
    ddp016_reduce_read_on_all_ranks,
    ddp017_local_rank_zero_writes,
    ddp018_unguarded_print,
    ddp019_exit_before_collective,
    ddp020_padded_eval_sampler,
    ddp021_batchnorm_local_statistics,
    ddp022_failure_before_collective,
    ddp023_deprecated_nccl_variable,
    ddp024_forward_around_ddp,
]
ALL = [m.RULE for m in MODULES]
