# Our fixture (issue 20): every rank writes its own contents to one path. Each rank's
# embedding shard and its own pickle overwrite the others': one rank's data survives.
import pickle

import torch
import torch.distributed as dist


def dump_embeddings(model, loader, out_dir):
    local_embeddings = torch.cat([model(x) for x in loader])
    torch.save(local_embeddings, f"{out_dir}/embeddings.pt")  # expect: DDP007
    with open(f"{out_dir}/index.pkl", "wb") as f:
        pickle.dump({"local_ids": list(range(len(local_embeddings)))}, f)  # expect: DDP007


if __name__ == "__main__":
    dist.init_process_group("nccl")
    dump_embeddings(None, [], "out")
    dist.destroy_process_group()
