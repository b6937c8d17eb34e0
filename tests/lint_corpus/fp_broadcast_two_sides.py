# Our fixture (issue 20, second round): the sending and the receiving side of one
# broadcast_object_list, written as the two arms of a rank test in a helper that the caller
# also reaches from two arms (with and without the payload). Both sides call the same
# collectives in the same order; the `is not None` asserts are for the type checker about
# values that were just made. Expects nothing.
import io
import pickle

import torch
import torch.distributed as dist


def share(obj=None, src=0):
    if dist.get_rank() == src:
        assert obj is not None
        buf = io.BytesIO()
        pickle.dump(obj, buf)
        payload = [buf.getvalue()]
        dist.broadcast_object_list(payload, src=src)
        dist.barrier()
        return obj
    payload = [None]
    dist.broadcast_object_list(payload, src=src)
    data = payload[0]
    assert data is not None
    dist.barrier()
    return pickle.loads(data)


def main():
    dist.init_process_group("gloo")
    if dist.get_rank() == 0:  # noqa: SIM108 (the two arms are the point)
        table = share(torch.rand(100, 8))
    else:
        table = share(None)
    print(table.shape)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
