# Our fixture (issue 20, an older held-out case): torch.load without map_location in a module
# that uses torch.distributed: every rank restores the tensors onto the GPU that saved them,
# whatever torch's weights_only default.
import torch
import torch.distributed as dist


def load_pretrained(model, path):
    state = torch.load(path, weights_only=True)  # expect: DDP010
    model.load_state_dict(state)
    dist.barrier()
