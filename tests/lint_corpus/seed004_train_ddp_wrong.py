# ruff: noqa  (test data for ddpguard lint: kept as the seeds wrote it)
# Seed 004, train_ddp_wrong.py (indentation and quotes restored so it parses).
import os, random, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler

class DummyDS(Dataset):
    def init(self, N=1003): # 刻意设成非 world_size 整数倍
        self.N = N
    def len(self): return self.N
    def getitem(self, i):
        x = torch.randn(32, 3, 224, 224)
        y = torch.randint(0, 10, (32,)) # 模拟有时会丢弃某些样本的增强(省略)
        return x, y

def setup():
    dist.init_process_group("nccl")
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))

def main():
    setup()
    rank = dist.get_rank()
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
    ds = DummyDS()

    sampler = DistributedSampler(ds, shuffle=True, drop_last=False)  # ❌ drop_last=False
    # ❌ DataLoader 里又写了 shuffle=True(被忽略,但容易误以为生效)
    loader = DataLoader(ds, batch_size=2, shuffle=True, sampler=sampler, num_workers=4)
    model = torch.nn.Linear(3*224*224, 10).to(device)
    model = DDP(model, device_ids=[device.index])
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(5):
        # ❌ 忘记 sampler.set_epoch(epoch)
        for x, y in loader:
            x = x.view(x.size(0), -1).to(device)
            y = y.to(device)
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()      # 🔥 偶发卡在这里(allreduce)
            opt.step()
        if rank == 0:
            print(f"epoch {epoch} done")
    dist.destroy_process_group()

if __name__ == "__main__":
    main()
