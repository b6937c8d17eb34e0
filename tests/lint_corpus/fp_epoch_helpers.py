# Our fixture (issue 13, held-out repos): a helper called inside the batch loop that only
# reads len(loader) is no epoch; a helper that iterates the loader is; a checkpoint helper
# that this module never calls runs under its caller's guard, elsewhere.
import torch
import torch.distributed as dist


def adjust_learning_rate(optimizer, loader, step):
    for g in optimizer.param_groups:
        g["lr"] = 0.1 * step / (10 * len(loader))


def train_one_epoch(model, data_loader, optimizer):
    for x, y in data_loader:
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()


def save_checkpoint(state, path):
    torch.save(state, path)


def main(model, dataset, val_set, optimizer, epochs):
    dist.init_process_group("nccl")
    sampler = torch.utils.data.distributed.DistributedSampler(dataset)
    loader = torch.utils.data.DataLoader(dataset, batch_size=8, sampler=sampler)
    val_sampler = torch.utils.data.distributed.DistributedSampler(val_set)
    val_loader = torch.utils.data.DataLoader(val_set, batch_size=8, sampler=val_sampler)
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for step, (x, _y) in enumerate(loader, start=epoch * len(loader)):
            adjust_learning_rate(optimizer, loader, step)
            model(x).sum().backward()
            if step % 1000 == 0:  # a mid-epoch evaluation inside the batch loop
                train_one_epoch(model, val_loader, optimizer)
    for _epoch in range(epochs):  # expect: DDP001
        train_one_epoch(model, data_loader=loader, optimizer=optimizer)
    dist.destroy_process_group()
