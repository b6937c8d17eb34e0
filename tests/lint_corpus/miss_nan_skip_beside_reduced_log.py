# Our fixture (issue 35): a detector's loop that all-reduces a copy of the loss dict for its log
# line, then skips the step on the rank's own NaN loss (the unreduced one): the reduction is
# no agreement, and the rank that meets a NaN skips the gradient all-reduce the others wait in.
# The twin below tests the reduced value itself: every rank decides alike, no finding.
import torch
import torch.distributed as dist


def reduce_dict(losses):
    names = sorted(losses)
    values = torch.stack([losses[k] for k in names])
    dist.all_reduce(values)
    return dict(zip(names, values / dist.get_world_size(), strict=True))


def train_one_epoch(model, criterion, loader, optimizer):
    for images, targets in loader:
        loss_dict = criterion(model(images), targets)
        losses = loss_dict["total_loss"]
        loss_dict_reduced = reduce_dict(loss_dict)
        if torch.isnan(losses):  # expect: DDP004
            continue
        losses.backward()
        optimizer.step()
        optimizer.zero_grad()
        print({k: float(v) for k, v in loss_dict_reduced.items()})


def train_one_epoch_agreed(model, criterion, loader, optimizer):
    for images, targets in loader:
        loss_dict = criterion(model(images), targets)
        loss_dict = reduce_dict(loss_dict)
        losses = loss_dict["total_loss"]
        if torch.isnan(losses):
            continue
        losses.backward()
        optimizer.step()
        optimizer.zero_grad()


def train_one_epoch_in_place(model, criterion, loader, optimizer):
    for images, targets in loader:
        loss = criterion(model(images), targets)
        flag = torch.isfinite(loss.detach()).float()
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)
        if torch.isnan(loss) or flag.item() < 1:
            continue
        loss.backward()
        optimizer.step()
