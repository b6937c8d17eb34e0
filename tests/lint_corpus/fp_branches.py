# Our fixture (issue 13): one script, several launch modes (pytorch/examples' imagenet style).
# Moves and loads in sibling branches never meet the other branch's DDP wrapper; the
# DataParallel branch is the single-process fallback; a shuffle=False validation sampler
# needs no set_epoch; torch's DistributedSampler pads, so drop_last is not needed.
import torch
import torch.distributed as dist
import torch.utils.data


def main_worker(gpu, ngpus_per_node, args, model, train_set, val_set):
    args.gpu = gpu
    if args.distributed:
        dist.init_process_group("nccl", world_size=args.world_size, rank=args.rank)
        if args.gpu is not None:
            torch.cuda.set_device(args.gpu)
            model.cuda(args.gpu)
            model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[args.gpu])
        else:
            model.cuda()
            # The fallback for a launch that names no device (one process per node): the
            # per-process launch takes the arm above. Reported by issue 13; since issue 20's
            # eighth round not (independent reviews: 0 true in 4).
            model = torch.nn.parallel.DistributedDataParallel(model)
    elif args.gpu is not None:
        torch.cuda.set_device(args.gpu)
        model = model.cuda(args.gpu)
    else:
        model = torch.nn.DataParallel(model).cuda()
    if args.resume:
        if args.gpu is None:
            checkpoint = torch.load(args.resume)
        else:
            checkpoint = torch.load(args.resume, map_location=f"cuda:{args.gpu}")
        model.load_state_dict(checkpoint["state_dict"])
    train_sampler = torch.utils.data.distributed.DistributedSampler(train_set)
    val_sampler = torch.utils.data.distributed.DistributedSampler(val_set, shuffle=False)
    train_loader = torch.utils.data.DataLoader(train_set, batch_size=32, sampler=train_sampler)
    val_loader = torch.utils.data.DataLoader(val_set, batch_size=32, sampler=val_sampler)
    for epoch in range(args.epochs):
        train_sampler.set_epoch(epoch)
        for x, y in train_loader:
            torch.nn.functional.cross_entropy(model(x), y).backward()
        for x, _ in val_loader:
            model(x)
        if args.rank == 0:
            sanity_check(model.state_dict())
    dist.destroy_process_group()


def sanity_check(state_dict):
    return {k.removeprefix("module."): v for k, v in state_dict.items()}
