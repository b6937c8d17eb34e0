# Our fixture (issue 35): a training loop that catches an out-of-memory error of its step and
# carries on. The error is this rank's alone: it skips the backward (DDP's gradient all-reduce)
# the other ranks wait in, and the job hangs. The twins stay silent: a handler that re-raises
# what it does not handle, a flag all-reduced so that every rank skips alike, and the end of the
# second loader (its StopIteration comes on every rank at the same step).
import torch
import torch.distributed as dist


def train(model, loader, optimizer):
    for batch in loader:
        try:
            loss = model(batch).mean()
            loss.backward()
            optimizer.step()
        except RuntimeError as e:  # expect: DDP004
            if "out of memory" not in str(e):
                raise
            print("OOM, batch skipped")
            torch.cuda.empty_cache()
        optimizer.zero_grad()


def train_forward_only(model, loader, optimizer):
    for batch in loader:
        try:
            out = model(batch)
        except ValueError:  # expect: DDP004
            continue
        out.mean().backward()
        optimizer.step()


def train_reraise(model, loader, optimizer):
    for batch in loader:
        try:
            loss = model(batch).mean()
            loss.backward()
        except RuntimeError:
            torch.cuda.empty_cache()
            raise
        optimizer.step()


def train_agreed(model, loader, optimizer):
    for batch in loader:
        failed = torch.zeros(1)
        try:
            loss = model(batch).mean()
        except RuntimeError:
            failed = torch.ones(1)
        dist.all_reduce(failed)
        if failed.item() > 0:
            continue
        loss.backward()
        optimizer.step()


def train_with_aux(model, loader, aux_loader, optimizer):
    aux = iter(aux_loader)
    for batch in loader:
        try:
            extra = next(aux)
        except StopIteration:
            break
        model(batch, extra).mean().backward()
        optimizer.step()
