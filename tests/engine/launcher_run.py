"""One process of a launcher test (tests/engine/test_launchers.py), started by torchrun, srun, mpirun or their
stand-ins: it joins the process group the way mmwf's tools do (:func:`mmwf.utils.init_tool_distributed`) and rank 0
writes what every rank saw: the rank the launcher gave it before the group existed, the group's rank and size,
its local rank and its node."""
import json
import os
import sys

import torch.distributed as dist

from mmwf.engine.world import launched_process
from mmwf.utils import close_distributed, init_tool_distributed

# the node's index among the job's nodes (Open MPI sets none: its NODE_RANK counts processes on a node)
NODE_VARIABLES = {'pytorch': 'GROUP_RANK', 'slurm': 'SLURM_NODEID'}


def main(out: str, launcher: str) -> None:
    before = launched_process(launcher)
    rank, world_size, _ = init_tool_distributed(launcher, 'cpu')
    node = int(os.environ[NODE_VARIABLES[launcher]]) if launcher in NODE_VARIABLES else None
    seen = dict(launched=[before.rank, before.world_size, before.local_rank], rank=rank, world_size=world_size,
                local_rank=int(os.environ['LOCAL_RANK']), node=node)
    everyone = [None] * world_size
    dist.all_gather_object(everyone, seen)
    if rank == 0:
        with open(os.path.join(out, 'ranks.json'), 'w') as f:
            json.dump(everyone, f)
    close_distributed()


if __name__ == '__main__':
    main(*sys.argv[1:])
