# Our fixture (issue 20, round 4): features extracted under a padding DistributedSampler and
# gathered with their sample indices, then stored by index (`index_copy_`). A repeated sample
# writes its own row again: nothing is counted twice. Expects nothing.
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler


@torch.no_grad()
def extract_features(model, dataset):
    loader = DataLoader(dataset, batch_size=16,
                        sampler=DistributedSampler(dataset, shuffle=False))
    world = dist.get_world_size()
    features = None
    for images, index in loader:
        feats = model(images)
        if features is None:
            features = torch.zeros(len(dataset), feats.shape[-1])
        index_parts = [torch.empty_like(index) for _ in range(world)]
        dist.all_gather(index_parts, index)
        feat_parts = [torch.empty_like(feats) for _ in range(world)]
        dist.all_gather(feat_parts, feats)
        features.index_copy_(0, torch.cat(index_parts), torch.cat(feat_parts))
    return features
