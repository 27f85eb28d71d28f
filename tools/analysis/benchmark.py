"""The speed and memory benchmarks, side by side in interleaved rounds, one sub-command each (`--help` on each):

    python tools/analysis/benchmark.py inference --sizes 224 512 1024 --plot fig5.png
    python tools/analysis/benchmark.py kernels --models weightformer_t --sizes 224 1024 --device cuda
    python tools/analysis/benchmark.py train --part classifier --batch 256 --size 224 --amp --device cuda
    python tools/analysis/benchmark.py generation --archs S/2 B/2 --batch 32 --device cuda
    python tools/analysis/benchmark.py workload --rounds 3 --plot workload.png
    python tools/analysis/benchmark.py engine-split --plot docs/images/engine_split.png
    python tools/analysis/benchmark.py onnx --sizes 224 1024

inference: throughput and peak memory of classifiers against resolution (Table 3, Figure 5); kernels: a dynamic
block's operations in every evaluation beside the layers' rule; train: a classifier's or backbone + pyramid's
training step; generation: WF-DiT against DiT, training and sampling steps (``--profile``: by phase and operator
group); workload: detection / segmentation configs in pairs; engine-split: one block's token mixer against its
channel mixer; onnx: ONNX Runtime against eager PyTorch.
"""
from __future__ import annotations

import argparse
import os.path as osp

import torch

from mmwf.analysis.benchmarks import BENCHMARKS


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    commands = parser.add_subparsers(dest='benchmark', required=True, metavar='{' + ','.join(BENCHMARKS) + '}')
    for name, module in BENCHMARKS.items():
        sub = commands.add_parser(name, description=module.__doc__.split('\n\n')[0],
                                  formatter_class=argparse.RawDescriptionHelpFormatter)
        module.add_arguments(sub)
        sub.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu')
        sub.add_argument('--threads', type=int, default=None, help='torch CPU threads (default: all)')
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    args.script = osp.abspath(__file__)
    BENCHMARKS[args.benchmark].run(args)


if __name__ == '__main__':
    main()
