"""One rank of tests/utils/test_runtime.py's two-process check, started by torch.distributed.run: joins the group
as the tools do and writes the device it took and the GPU it would take."""
import json
import os
import sys

import torch.distributed as dist

from mmwf.utils import init_tool_distributed, launched_device


def main(out: str) -> None:
    rank, world_size, device = init_tool_distributed('pytorch', 'cpu')
    seen = dict(rank=rank, world_size=world_size, device=device, backend=dist.get_backend(),
                gpu=launched_device('cuda'), local_rank=int(os.environ['LOCAL_RANK']))
    with open(os.path.join(out, f'rank{rank}.json'), 'w') as f:
        json.dump(seen, f)
    dist.destroy_process_group()


if __name__ == '__main__':
    main(sys.argv[1])
