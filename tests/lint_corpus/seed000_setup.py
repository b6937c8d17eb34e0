# ruff: noqa  (test data for ddpguard lint: kept as the seeds wrote it)
# Seed 000: the three setup snippets (setup_distributed, sampler + loader, DDP), joined.
import os

import torch


def setup_distributed(cfg):
    """
    Setup distributed training environment and return the device and rank.
    """
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)
    torch.distributed.init_process_group(backend="nccl", init_method="env://")
    print(f"Process {os.environ.get('RANK')} initialized on GPU {local_rank}")
    return device, local_rank


def build(cfg, train_set, model, batch_size, num_workers, train_collate_fn):
    device, local_rank = setup_distributed(cfg)
    train_sampler = torch.utils.data.distributed.DistributedSampler(train_set)
    train_loader = torch.utils.data.DataLoader(train_set,batch_size=batch_size,pin_memory=True,num_workers=num_workers,
                                        shuffle=False,sampler=train_sampler,collate_fn=train_collate_fn,drop_last=True)
    model = torch.nn.parallel.DistributedDataParallel(
                model, device_ids=[local_rank],find_unused_parameters=False
            )
    return model, train_loader, train_sampler
