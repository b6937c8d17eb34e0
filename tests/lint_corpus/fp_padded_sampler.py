# Our fixture (issue 20, round 4): a repeated-augmentation sampler that pads its index list
# from itself to `num_samples * num_replicas` and cuts it with a stride of the world size,
# then asserts the share's length (torch's own DistributedSampler arithmetic, copied widely).
# Every rank gets `num_samples` indices. Expects nothing, also with DDP003 selected.
import math

import torch
import torch.distributed as dist


class RepeatSampler(torch.utils.data.Sampler):
    def __init__(self, dataset, repeats=3):
        self.dataset = dataset
        self.num_replicas = dist.get_world_size()
        self.rank = dist.get_rank()
        self.repeats = repeats
        self.num_samples = math.ceil(len(dataset) * repeats / self.num_replicas)
        self.total_size = self.num_samples * self.num_replicas

    def __iter__(self):
        indices = [i for i in range(len(self.dataset)) for _ in range(self.repeats)]
        indices += indices[: self.total_size - len(indices)]
        indices = indices[self.rank:self.total_size:self.num_replicas]
        assert len(indices) == self.num_samples
        return iter(indices)

    def __len__(self):
        return self.num_samples
