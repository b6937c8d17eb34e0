# ruff: noqa  (test data for ddpguard lint: kept as the seeds wrote it)
# Seed 001, torchrun_multigpu.py plus its get_reduced helper (indentation restored).
## 加载Torch相关模块
import torch
import torch.nn.functional as F
from torch.utils.data import Dataset, DataLoader
# 分布式相关模块
from torch.utils.data.distributed import DistributedSampler
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.distributed import init_process_group, destroy_process_group
import os
## 初始设置
# 单机训练时的GPU id
local_rank = int(os.environ["LOCAL_RANK"])
# 多机训练时的GPU 全局id
rank = int(os.environ["RANK"])
# 全部GPU的数量
world_size = torch.distributed.get_world_size()
torch.cuda.set_device(local_rank)
init_process_group(backend="nccl")
## 数据层面
# 分布式样本抽样(使得每个GPU获取样本没有重复)
train_sampler = DistributedSampler(train_dataset)
# 样本迭代器(由于train_sampler默认已经shuffle,所有这里不用设置shuffle)
train_loader = DataLoader(train_dataset,
batch_size=BATCH_SIZE,
shuffle = False,
sampler=train_sampler)
## 模型层面
model = MyModel()
# 如果模型有Batchnorm操作
model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
model = model.to(local_rank)
model = DDP(model, device_ids=[local_rank])
## 训练时将小批量数据转移至GPU操作类似
for index, (data, labels) in enumerate(train_loader):
    data, labels = data.to(local_rank), labels.to(local_rank)
    print(f'[GPU {local_rank}] Epoch {epoch} | Step {index} is OK ---')
#其它需要转移GPU设置类似


def get_reduced(tensor, current_device, dest_device, world_size):
    """
    将不同GPU上的变量或tensor集中在主GPU上,并得到均值
    """
    # 如果输入的是 tensor,则创建一个其拷贝并与计算图断开;否则将其转化为 tensor。
    tensor = tensor.clone().detach() if torch.is_tensor(tensor) else torch.tensor(tensor)
    # 将 tensor 移动到当前设备
    tensor = tensor.to(current_device)
    # 使用 torch.distributed.reduce 将当前设备的 tensor 发送到目标设备(dest_device)上
    torch.distributed.reduce(tensor, dst=dest_device)
    # 在目标设备上将 tensor 值取平均
    tensor_mean = tensor.item() / world_size
    return tensor_mean
# 计算每个GPU训练的平均loss
epoch_loss = get_reduced(epoch_loss, local_rank, 0, world_size)
## 结束DDT分布式训练
destroy_process_group()
