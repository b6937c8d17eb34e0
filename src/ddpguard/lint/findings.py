"""Findings and the rule registry (codes, severities, messages, fixes)."""

from __future__ import annotations

from dataclasses import asdict, dataclass

SEVERITIES = ("error", "warning", "info")


@dataclass(frozen=True)
class Rule:
    code: str
    name: str
    severity: str
    summary: str
    fix: str
    default: bool = True


@dataclass(frozen=True)
class Finding:
    path: str
    line: int
    col: int
    code: str
    severity: str
    message: str
    fix: str

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


_R = Rule
RULES: dict[str, Rule] = {r.code: r for r in [
    _R("DDP000", "syntax-error", "error", "file does not parse", "fix the syntax error"),
    _R("DDP001", "missing-set-epoch", "error",
       "DistributedSampler drives an epoch loop but set_epoch is not called in it",
       "call sampler.set_epoch(epoch) at the top of every epoch"),
    _R("DDP002", "shuffle-with-sampler", "error",
       "DataLoader gets a sampler and shuffle=True (mutually exclusive)",
       "drop shuffle=True; shuffle in the sampler instead"),
    _R("DDP003", "uneven-manual-shard", "warning",
       "data sharded by hand (`x[rank::world_size]`, `array_split(x, world)[rank]`): ranks can "
       "get different sample counts",
       "use DistributedSampler (it pads), or pad/trim every shard to the same length"),
    _R("DDP004", "rank-dependent-step-count", "error",
       "a collate_fn or batch loop can drop samples or batches on one rank only",
       "never return None / drop samples in collate_fn; resample in the Dataset instead"),
    _R("DDP005", "collective-in-rank-branch", "error",
       "collective called inside a branch on rank: the other ranks never join it",
       "call the collective on every rank, outside the rank branch"),
    _R("DDP006", "ddp-forward-in-rank-branch", "error",
       "forward of the DDP-wrapped model on some ranks only (directly or in a helper called "
       "under a rank test); error when the module visibly has buffers (BatchNorm)",
       "evaluate on every rank, or call model.module(...) on rank 0"),
    _R("DDP007", "save-on-every-rank", "warning",
       "torch.save runs on every rank", "guard it with `if rank == 0:` (then barrier)"),
    _R("DDP008", "save-ddp-state-dict", "warning",
       "state_dict() of the DDP wrapper is saved (keys get a `module.` prefix)",
       "save model.module.state_dict()"),
    _R("DDP009", "batchnorm-without-sync", "warning",
       "BatchNorm model wrapped in DDP without SyncBatchNorm (or converted after wrapping)",
       "model = nn.SyncBatchNorm.convert_sync_batchnorm(model) before DDP(model)"),
    _R("DDP010", "unsafe-torch-load", "warning",
       "torch.load with weights_only=False on a non-literal path, without weights_only where the "
       "project supports torch < 2.6, or without map_location in a CUDA DDP script",
       "torch.load(path, map_location=device, weights_only=True)"),
    _R("DDP011", "bad-nccl-variable", "warning",
       "deprecated or non-existent NCCL variable",
       "use TORCH_NCCL_BLOCKING_WAIT / TORCH_NCCL_ASYNC_ERROR_HANDLING; "
       "timeouts go in init_process_group(timeout=...)"),
    _R("DDP012", "missing-destroy", "warning",
       "a training script initializes a process group and never destroys it",
       "call dist.destroy_process_group() on the way out (try/finally)"),
    _R("DDP013", "accumulation-without-no-sync", "warning",
       "gradient accumulation on a DDP model without no_sync",
       "wrap the micro-steps in `with model.no_sync():`"),
    _R("DDP014", "data-parallel", "warning",
       "nn.DataParallel as the multi-GPU strategy (one GIL-bound process, slower than DDP)",
       "use DistributedDataParallel with one process per device"),
    _R("DDP015", "ddp-device-placement", "warning",
       "model moved after DDP wrapping on the same path, or DDP without device_ids on a model "
       "placed with a bare .cuda() and no set_device",
       "move the model to its device first, then DDP(model, device_ids=[local_rank])"),
    _R("DDP016", "reduce-read-on-all-ranks", "error",
       "result of dist.reduce read on every rank (only dst holds the sum)",
       "use dist.all_reduce, or read the result only on rank dst"),
    _R("DDP017", "local-rank-zero-writes", "warning",
       "a local-rank test (`local_rank == 0`, `rank % ngpus_per_node == 0`) decides "
       "checkpointing/logging in a multi-node script",
       "use the global rank (dist.get_rank() == 0)"),
    _R("DDP018", "unguarded-print", "info", "print on every rank",
       "guard with `if rank == 0:` or include the rank in the message", default=False),
]}
