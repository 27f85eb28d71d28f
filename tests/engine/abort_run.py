"""A rank for tests/engine/test_two_ranks.py: in a folder not named 'again', rank 1 aborts as gloo's threads once did
('terminate called ...') or, with 'raise', fails with a Python error, and with 'raise-while-0-waits' does so while
rank 0 waits for it to join the process group; otherwise each rank writes its file."""
import os
import sys
from pathlib import Path


def main(out: str, how: str) -> None:
    rank = int(os.environ['RANK'])
    if how == 'raise-while-0-waits':
        if rank == 0:
            import torch.distributed as dist
            dist.init_process_group('gloo')  # waits for rank 1, which fails first
            dist.barrier()
        raise RuntimeError('a failure of the code under test')
    if rank == 1 and Path(out).name != 'again':
        if how == 'raise':
            raise RuntimeError('a failure of the code under test')
        sys.stderr.write('terminate called without an active exception\n')
        sys.stderr.flush()
        os.abort()
    (Path(out) / f'rank{rank}.txt').write_text('ok')


if __name__ == '__main__':
    main(*sys.argv[1:])
