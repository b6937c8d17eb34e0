# Our fixture (issue 13): gradient accumulation by a step counter (yolov5 style), a DDP model
# made by a helper, AMP's scaler stepping the optimizer, and no no_sync anywhere.
import math

import torch
from torch.nn.parallel import DistributedDataParallel as DDP


def smart_DDP(model, local_rank):
    return DDP(model, device_ids=[local_rank], output_device=local_rank)


def train(model, loader, optimizer, scaler, batch_size, local_rank, epochs):
    model = smart_DDP(model, local_rank)
    accumulate = max(round(64 / batch_size), 1)
    last_opt_step = -1
    nb = len(loader)
    for epoch in range(epochs):
        loader.sampler.set_epoch(epoch)
        for i, (x, y) in enumerate(loader):
            ni = i + nb * epoch
            with torch.autocast("cuda"):
                loss = torch.nn.functional.mse_loss(model(x), y)
            scaler.scale(loss).backward()
            if ni - last_opt_step >= accumulate:
                scaler.step(optimizer)  # expect: DDP013
                scaler.update()
                optimizer.zero_grad()
                last_opt_step = ni
    return math.nan
