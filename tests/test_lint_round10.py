"""Issue 20, tenth round: false-positive classes of the round-9 blind halves and of the
round-10 tuning halves, each pinned by code of our own that expects nothing, and by the
one-line change that makes the same code wrong."""

from __future__ import annotations

from helpers import lint_source


def codes(src: str) -> list[tuple[str, int]]:
    return [(f.code, f.line) for f in lint_source(src)]


# An evaluation loop under no_grad that skips empty batches (DiffSinger's trainer): no rank
# waits on another inside it.
EVAL_SKIP = """\
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader


class Trainer:
    def evaluate(self, model, loader):
        torch.set_grad_enabled(False)
        outputs = []
        for batch_idx, batch in enumerate(loader):
            if batch is None:
                continue
            outputs.append(self.forward_step(model, batch))
        return outputs

    def forward_step(self, model, batch):
        return model(batch)
"""


def test_a_skipped_batch_in_a_loop_that_never_syncs_is_no_step_mismatch() -> None:
    assert codes(EVAL_SKIP) == []


def test_a_skipped_batch_in_a_training_loop_is_reported() -> None:
    direct = EVAL_SKIP.replace("            outputs.append(self.forward_step(model, batch))",
                               "            model(batch).sum().backward()")
    assert codes(direct) == [("DDP004", 11)]
    # the backward one call away, in a method of this file
    helper = EVAL_SKIP.replace("        return model(batch)\n",
                               "        loss = model(batch)\n        loss.backward()\n")
    assert codes(helper) == [("DDP004", 11)]


# Validation on rank 0 alone, under no_grad, through the DDP wrapper of a model whose class
# is in this file and holds only layers without buffers (graphlearn's HGT of PyG layers).
NO_BUFFERS = """\
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch_geometric.nn import HGTConv, Linear


class HGT(torch.nn.Module):
    def __init__(self, hidden, out):
        super().__init__()
        self.convs = torch.nn.ModuleList([HGTConv(hidden, hidden) for _ in range(2)])
        self.lin = Linear(hidden, out)
        self.head = Head(out)

    def forward(self, x):
        for conv in self.convs:
            x = conv(x)
        return self.head(self.lin(x))


class Head(torch.nn.Module):
    def __init__(self, n):
        super().__init__()
        self.proj = torch.nn.Linear(n, n)
        self.norm = torch.nn.LayerNorm(n)

    def forward(self, x):
        return self.norm(self.proj(x))


@torch.no_grad()
def test(model, loader):
    return [model(x) for x in loader]


def run(rank, train_loader, val_loader, optimizer):
    dist.init_process_group("nccl", rank=rank, world_size=2)
    model = HGT(64, 10).to(rank)
    model = DistributedDataParallel(model, device_ids=[rank])
    for epoch in range(10):
        for x in train_loader:
            model(x).sum().backward()
            optimizer.step()
        dist.barrier()
        if rank == 0:
            test(model, val_loader)
        dist.barrier()
"""


def test_a_rank0_no_grad_forward_of_a_visibly_buffer_free_model_is_no_hang() -> None:
    assert codes(NO_BUFFERS) == []


def test_a_layer_with_buffers_anywhere_in_the_model_brings_the_finding_back() -> None:
    # in a class the model builds, from a model zoo (its buffers are not visible)
    zoo = NO_BUFFERS.replace("        self.norm = torch.nn.LayerNorm(n)",
                             "        self.norm = timm.create_model('resnet18')")
    assert codes("import timm\n" + zoo) == [("DDP006", 46)]
    # a registered buffer in that class
    buf = NO_BUFFERS.replace("        self.norm = torch.nn.LayerNorm(n)",
                             "        self.register_buffer('pos', torch.zeros(n))")
    assert [c for c, _ in codes(buf)] == ["DDP006"]
    # a norm layer that keeps running statistics
    inorm = NO_BUFFERS.replace("torch.nn.LayerNorm(n)",
                               "torch.nn.InstanceNorm1d(n, track_running_stats=True)")
    assert [c for c, _ in codes(inorm)] == ["DDP006"]
    # a layer from a package whose layers are not known
    other = NO_BUFFERS.replace("from torch_geometric.nn import HGTConv, Linear",
                               "from mylayers import HGTConv, Linear")
    assert [c for c, _ in codes(other)] == ["DDP006"]
    # a model that is not built from this file's class
    passed = NO_BUFFERS.replace("    model = HGT(64, 10).to(rank)\n", "    model = net.to(rank)\n")
    assert [c for c, _ in codes(passed)] == ["DDP006"]
    # with grad on, the forward on rank 0 alone stays a finding whatever the buffers
    grad = NO_BUFFERS.replace("@torch.no_grad()\n", "")
    assert [c for c, _ in codes(grad)] == ["DDP006"]


# The dataset is rebuilt, shuffled, every epoch and a fresh DistributedSampler made over it
# (coconut: "the sampler is deterministic even if shuffle is set to True, so we have
# shuffled the dataset when it's constructed, at every epoch").
RESHUFFLED = """\
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler


def main(base, configs, model, optimizer):
    dist.init_process_group("nccl")
    model = torch.nn.parallel.DistributedDataParallel(model)
    for epoch in range(configs.num_epochs):
        stage = epoch // configs.epochs_per_stage
        dataset_train = build_dataset(stage, base, shuffle=True)
        loader = DataLoader(dataset_train, batch_size=4,
                            sampler=DistributedSampler(dataset_train, shuffle=True))
        for batch in loader:
            model(batch).sum().backward()
            optimizer.step()
"""


def test_a_sampler_over_data_reshuffled_every_epoch_needs_no_set_epoch() -> None:
    assert codes(RESHUFFLED) == []


def test_a_fresh_sampler_over_the_same_order_every_epoch_is_reported() -> None:
    same = RESHUFFLED.replace("build_dataset(stage, base, shuffle=True)",
                              "build_dataset(stage, base, shuffle=False)")
    assert codes(same) == [("DDP001", 9)]


# DDP only for evaluation runs, FSDP for training (coconut): the accumulating loop never
# drives the DDP model.
MODES = """\
import torch.distributed as dist
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.nn.parallel import DistributedDataParallel as DDP


def main(configs, model, loader, optimizer, rank):
    dist.init_process_group("nccl")
    if configs.only_eval:
        parallel_model = DDP(model, device_ids=[rank])
    else:
        parallel_model = FSDP(model, device_id=rank)
    if not configs.only_eval:
        for step, batch in enumerate(loader):
            loss = parallel_model(**batch).loss / configs.gradient_accumulation_steps
            loss.backward()
            if (step + 1) % configs.gradient_accumulation_steps == 0:
                optimizer.step()
                optimizer.zero_grad()
"""


def test_accumulation_in_a_mode_whose_model_is_not_ddp_is_no_finding() -> None:
    assert codes(MODES) == []


def test_accumulation_on_the_ddp_mode_is_reported() -> None:
    swapped = MODES.replace("    if not configs.only_eval:\n        for",
                            "    if configs.only_eval:\n        for")
    assert codes(swapped) == [("DDP013", 17)]
    always = MODES.replace("    if not configs.only_eval:\n        for",
                           "    if configs.train:\n        for")
    assert codes(always) == [("DDP013", 17)]


# A rank-0-only helper that reaches a barrier only in the fallback of a search, then a
# barrier every rank reaches (PixelRec's and MicroLens's trainers: the log directory is named
# after the logger's file handler, which every rank has; only without one is the time stamp,
# and its barrier, taken).
SEARCH_FALLBACK = """\
import os

import torch.distributed as dist


def stamp():
    dist.barrier()
    return "now"


def board_dir(logger):
    name = None
    for handler in logger.handlers:
        if hasattr(handler, "baseFilename"):
            name = os.path.basename(handler.baseFilename)
            break
    if name is None:
        name = "run-" + stamp()
    return name


class Trainer:
    def __init__(self, logger):
        self.rank = dist.get_rank()
        if self.rank == 0:
            self.board = board_dir(logger)
        self.saved = "model-" + stamp()
"""


def test_a_collective_only_in_a_searchs_fallback_is_no_proven_divergence() -> None:
    assert codes(SEARCH_FALLBACK) == []


def test_a_collective_behind_a_value_that_is_no_search_is_reported() -> None:
    # the same test on a value read once, not searched for
    read = SEARCH_FALLBACK.replace("    name = None\n", "    name = logger.default_name\n")
    assert [c for c, _ in codes(read)] == ["DDP005"]
    # the barrier outside the fallback: rank 0 always calls it once more
    always = SEARCH_FALLBACK.replace('        name = "run-" + stamp()\n    return name',
                                     '        name = "run"\n    return name + stamp()')
    assert [c for c, _ in codes(always)] == ["DDP005"]
    # a flag of the caller's (the same on every rank, but taken by rank 0 alone here)
    flag = SEARCH_FALLBACK.replace("    if name is None:\n", "    if logger.timestamped:\n")
    assert [c for c, _ in codes(flag)] == ["DDP005"]


# A script whose distributed arm never forms a process group (CodeBERT's UniXcoder code
# completion: apex's DDP, no init_process_group): its DistributedSampler raises before the
# first epoch, so the set_epoch it lacks never matters.
NO_GROUP = """\
import argparse

import torch
from torch.utils.data import DataLoader, DistributedSampler, RandomSampler


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--local_rank", type=int, default=-1)
    args = parser.parse_args()
    model = build_model()
    if args.local_rank != -1:
        from apex.parallel import DistributedDataParallel as DDP
        model = DDP(model)
    data = load_examples()
    sampler = RandomSampler(data) if args.local_rank == -1 else DistributedSampler(data)
    loader = DataLoader(data, sampler=sampler, batch_size=8)
    for epoch in range(3):
        for batch in loader:
            model(batch).sum().backward()


if __name__ == "__main__":
    main()
"""


def test_a_script_that_never_forms_a_group_has_no_epoch_order_to_fix() -> None:
    assert codes(NO_GROUP) == []


def test_a_script_that_forms_its_group_gets_the_missing_set_epoch() -> None:
    formed = NO_GROUP.replace("        model = DDP(model)\n", "        model = DDP(model)\n"
                              "        torch.distributed.init_process_group('nccl')\n")
    assert codes(formed) == [("DDP001", 19)]
    # through a set-up helper of another module, whose body is not visible
    helper = NO_GROUP.replace("    model = build_model()\n",
                              "    init_distributed_mode(args)\n    model = build_model()\n")
    assert codes(helper) == [("DDP001", 19)]
    # a module without a __main__ block: its caller may have formed the group
    module = NO_GROUP.replace('\n\nif __name__ == "__main__":\n    main()\n', "\n")
    assert codes(module) == [("DDP001", 18)]


# A collate_fn that checks something about the samples without dropping any (deepmd's atom
# counts): every rank keeps its batch size.
COLLATE = """\
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader


def collate(batch):
    atypes = [d.get("atype") for d in batch if d.get("atype") is not None]
    if atypes and any(len(a) != len(atypes[0]) for a in atypes):
        raise NotImplementedError("frames with different atom counts")
    return torch.stack([d["coord"] for d in batch])


loader = DataLoader(dataset, batch_size=4, collate_fn=collate)
"""


def test_a_collate_fn_that_only_inspects_its_samples_drops_none() -> None:
    assert codes(COLLATE) == []


def test_a_collate_fn_that_filters_samples_keeps_the_step_count() -> None:
    # a smaller batch, not fewer steps: every rank still gets one batch per index
    drops = COLLATE.replace('    atypes = [d.get("atype") for d',
                            '    batch = atypes = [d for d')
    assert codes(drops) == []
    assert codes(COLLATE.replace("    atypes = [d.get(\"atype\") for d in batch if",
                                 "    atypes = list(filter(lambda d:")
                 .replace('d.get("atype") is not None]', 'd is not None, batch))')) == []


def test_a_collate_fn_that_can_return_none_is_reported() -> None:
    none = COLLATE.replace("    if atypes and", "    if not atypes:\n        return None\n"
                           "    if atypes and")
    assert codes(none) == [("DDP004", 9)]


# The leader fills shared memory and sends its shape; every other rank's main process
# receives it, and DataLoader workers, which are no ranks, skip the collectives (omnivore's
# SharedMemory dataset).
WORKERS = """\
import torch.distributed as dist
from torch.utils.data import get_worker_info


def share(arr, local_rank):
    if local_rank == 0:
        dist.barrier()
        dist.broadcast_object_list([arr.shape])
    else:
        if not is_torch_dataloader_worker():
            dist.barrier()
            dist.broadcast_object_list([None])
    return arr


def is_torch_dataloader_worker():
    return get_worker_info() is not None
"""


def test_the_dataloader_workers_arm_is_no_ranks_path() -> None:
    assert codes(WORKERS) == []
    info = WORKERS.replace("        if not is_torch_dataloader_worker():",
                           "        if get_worker_info() is None:")
    assert codes(info) == []


def test_a_rank_that_skips_the_collectives_on_another_test_is_reported() -> None:
    flag = WORKERS.replace("        if not is_torch_dataloader_worker():",
                           "        if arr.wait:")
    assert [c for c, _ in codes(flag)] == ["DDP005"]
    inverted = WORKERS.replace("        if not is_torch_dataloader_worker():",
                               "        if get_worker_info() is not None:")
    assert {c for c, _ in codes(inverted)} == {"DDP005"}


# The source sends a size and, unless it is 0, the payload; the others receive the size and
# read the payload only when it is not 0 (verl's and sglang's broadcast_pyobj).
SIZE_THEN_PAYLOAD = """\
import pickle

import torch
import torch.distributed as dist


def broadcast_pyobj(data, rank, src=0, expected=0):
    if rank == src:
        if len(data) == 0:
            size = torch.tensor([0], dtype=torch.long)
            dist.broadcast(size, src=src)
        else:
            payload = torch.ByteTensor(list(pickle.dumps(data)))
            size = torch.tensor([len(payload)], dtype=torch.long)
            dist.broadcast(size, src=src)
            dist.broadcast(payload, src=src)
        return data
    size = torch.tensor([0], dtype=torch.long)
    dist.broadcast(size, src=src)
    n = size.item()
    if n == 0:
        return []
    payload = torch.empty(n, dtype=torch.uint8)
    dist.broadcast(payload, src=src)
    return pickle.loads(bytes(payload.tolist()))
"""


def test_a_receiver_that_follows_the_size_it_received_matches_the_sender() -> None:
    assert codes(SIZE_THEN_PAYLOAD) == []


def test_a_receiver_that_decides_on_its_own_value_is_reported() -> None:
    own = SIZE_THEN_PAYLOAD.replace("    if n == 0:\n", "    if expected == 0:\n")
    assert [c for c, _ in codes(own)] == ["DDP005"]


# Validation on each dataset of a collection, with a fresh sampler over each (the files of
# multiple_physics_pretraining's validation set): the loop walks datasets, not epochs.
PER_DATASET = """\
import torch
from torch.utils.data import DataLoader, DistributedSampler


def validate(model, dsets):
    model.eval()
    for subset in dsets:
        loader = DataLoader(subset, batch_size=8, sampler=DistributedSampler(subset))
        for batch in loader:
            model(batch)
"""


def test_a_fresh_sampler_per_dataset_is_no_epoch_loop() -> None:
    assert codes(PER_DATASET) == []


def test_a_fresh_sampler_per_epoch_over_the_same_data_is_reported() -> None:
    epochs = PER_DATASET.replace("    for subset in dsets:\n", "    subset = dsets[0]\n"
                                 "    for epoch in range(3):\n")
    assert codes(epochs) == [("DDP001", 8)]


# Rank 0 hands the training method to a sweep agent that calls it; the others call it
# themselves (multiple_physics_pretraining's `wandb.agent(function=trainer.train)`).
AGENT = """\
import torch.distributed as dist


class Trainer:
    def train(self):
        dist.barrier()
        dist.barrier()


if __name__ == "__main__":
    trainer = Trainer()
    if args.sweep_id and dist.get_rank() == 0:
        wandb.agent(args.sweep_id, function=trainer.train, count=1)
    else:
        trainer.train()
"""


def test_a_method_handed_to_an_agent_on_rank0_is_no_proven_divergence() -> None:
    assert codes(AGENT) == []


def test_rank0_skipping_the_method_the_others_call_is_reported() -> None:
    skipped = AGENT.replace("function=trainer.train", "function=None")
    assert [c for c, _ in codes(skipped)] == ["DDP005"]


# Features for a linear probe, extracted under no_grad with a shuffling sampler and no
# set_epoch (Siamese-Image-Modeling's make_embeddings): the order changes nothing.
EMBEDDINGS = """\
import torch
from torch.utils.data import DataLoader, DistributedSampler


def make_embeddings(dataset, encoder, epochs=1):
    loader = DataLoader(dataset, batch_size=64, sampler=DistributedSampler(dataset))
    feats = []
    for _ in range(epochs):
        for imgs, labels in loader:
            with torch.no_grad():
                feats.append(encoder(imgs))
    return feats
"""


def test_an_epoch_loop_that_only_extracts_features_needs_no_set_epoch() -> None:
    assert codes(EMBEDDINGS) == []


def test_an_epoch_loop_that_trains_is_reported() -> None:
    trains = EMBEDDINGS.replace("            with torch.no_grad():\n"
                                "                feats.append(encoder(imgs))\n",
                                "            encoder(imgs).sum().backward()\n")
    assert codes(trains) == [("DDP001", 8)]
    # a teacher's targets under no_grad, then the student's backward (distillation)
    distils = EMBEDDINGS.replace("                feats.append(encoder(imgs))\n",
                                 "                target = teacher(imgs)\n"
                                 "            (encoder(imgs) - target).sum().backward()\n")
    assert codes(distils) == [("DDP001", 8)]


# A test of the rank within a subgroup: the leaders of the reduction groups reduce among
# themselves, on the group of leaders (makani's tree reduction).
SUBGROUP = """\
import torch.distributed as dist


def reduce_stats(stats, mesh):
    if dist.get_rank(mesh.get_group("reduction")) == 0:
        stats = tree_reduce(stats, mesh.get_group("tree"))
    dist.barrier()
    return stats


def tree_reduce(stats, group):
    dist.barrier(group=group)
    return stats
"""


def test_a_test_of_the_rank_within_a_subgroup_is_no_global_rank_class() -> None:
    assert codes(SUBGROUP) == []


def test_a_test_of_the_global_rank_before_a_subgroup_collective_is_reported() -> None:
    glob = SUBGROUP.replace('dist.get_rank(mesh.get_group("reduction"))', "dist.get_rank()")
    assert [c for c, _ in codes(glob)] == ["DDP005"]


# The wrapper's state_dict saved under one name, a checkpoint of another name loaded strictly
# before the wrap (PVDM: `model_last.pth` is written by the trainer, unwrapped).
OTHER_FILES = """\
import os

import torch
from torch.nn.parallel import DistributedDataParallel as DDP


def main(args, model, rank, rootdir):
    if args.resume:
        ckpt = torch.load(os.path.join(args.folder, "model_last.pth"), map_location="cpu")
        model.load_state_dict(ckpt)
    model = DDP(model, device_ids=[rank])
    train(model)
    if rank == 0:
        torch.save(model.state_dict(), rootdir + "net_meta.pth")
"""


def test_a_save_and_a_load_of_different_files_are_no_resume_mismatch() -> None:
    assert codes(OTHER_FILES) == []


def test_the_same_file_saved_wrapped_and_loaded_unwrapped_is_reported() -> None:
    same = OTHER_FILES.replace('"model_last.pth"', '"net_meta.pth"')
    assert codes(same) == [("DDP008", 14)]
