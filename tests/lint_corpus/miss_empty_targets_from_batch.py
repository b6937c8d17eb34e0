# Our fixture (issue 35): a skip decided on a value built from the batch inside the loop (the
# targets unpacked from it, then `if len(targets) == 0: continue`) is this rank's alone: the
# rank whose batch has no targets skips the backward the others all-reduce in. The twin tests a
# value that is not the batch's (a counter of the loop), which every rank holds alike.
import torch.distributed as dist


def train(model, loader, optimizer, warmup):
    done = 0
    for batch in loader:
        images, targets = batch["image"], batch["targets"]
        if len(targets) == 0:  # expect: DDP004
            continue
        model(images, targets).backward()
        optimizer.step()
        done += 1


def train_after_warmup(model, loader, optimizer, warmup):
    done = 0
    for batch in loader:
        images, targets = batch["image"], batch["targets"]
        left = warmup - done
        done += 1
        if left == 0:
            continue
        model(images, targets).backward()
        optimizer.step()


def world():
    return dist.get_world_size()
