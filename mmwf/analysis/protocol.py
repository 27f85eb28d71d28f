"""The one protocol of the speed benchmarks: every model of a comparison runs under the same settings, stated in the
table's header line: the dtype (fp32 with TF32 on or off, or bf16 autocast), cuDNN's autotuner, ``torch.compile``'s
mode (the compile time reported apart from the steady time), and where the numbers come from (commit, card, torch,
command)."""
from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn as nn

from mmwf.utils.tf32_settings import tf32

DTYPES = ('fp32', 'bf16')
COMPILE_MODES = ('none', 'default', 'reduce-overhead', 'max-autotune')
ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Protocol:
    """What every model of one comparison runs under.

    Args:
        dtype (str): ``'fp32'`` or ``'bf16'`` (autocast: the matrix products and convolutions in bf16).
        tf32 (bool): fp32 matrix products and convolutions on TF32 tensor cores (CUDA). Defaults to False.
        compile (str): ``'none'`` (eager) or a ``torch.compile`` mode (``'default'``, ``'reduce-overhead'``: CUDA
            graphs, ``'max-autotune'``); one graph per input size, as a run at one size compiles.
        cudnn_benchmark (bool): cuDNN's autotuner (``torch.backends.cudnn.benchmark``), as the release's throughput
            test sets it. Defaults to True.
        backend (str): ``torch.compile``'s backend: ``'inductor'`` (what a run uses), or ``'eager'`` (dynamo's graphs
            on eager kernels: the dry runs check the wiring without a compiler's minutes). Defaults to
            ``'inductor'``.
    """
    dtype: str = 'fp32'
    tf32: bool = False
    compile: str = 'none'
    cudnn_benchmark: bool = True
    backend: str = 'inductor'

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f'dtype must be one of {DTYPES}, got {self.dtype!r}')
        if self.compile not in COMPILE_MODES:
            raise ValueError(f'compile must be one of {COMPILE_MODES}, got {self.compile!r}')

    @classmethod
    def from_args(cls, args) -> Protocol:
        return cls(args.dtype, args.tf32, args.compile, not args.no_cudnn_benchmark, args.compile_backend)

    def describe(self, amp: bool = False) -> str:
        """The settings in a few words, for a table's header (``amp``: the references' mixed precision instead of
        the protocol's dtype)."""
        dtype = 'bf16 autocast' if self.dtype == 'bf16' else f'fp32 (TF32 {"on" if self.tf32 else "off"})'
        dtype = 'AMP (fp16 with a loss scale on CUDA, bf16 on the CPU)' if amp else dtype
        mode = 'eager' if self.compile == 'none' else f'torch.compile mode {self.compile!r}'
        mode += '' if self.compile == 'none' or self.backend == 'inductor' else f' (backend {self.backend!r})'
        return f'{dtype}, {mode}, cudnn.benchmark {"on" if self.cudnn_benchmark else "off"}'

    @contextmanager
    def backends(self) -> Iterator[None]:
        """torch's TF32 (matmul and cuDNN, :func:`mmwf.utils.tf32_settings.tf32`) and cuDNN autotuner settings as the
        protocol says, restored on exit."""
        benchmark = torch.backends.cudnn.benchmark
        torch.backends.cudnn.benchmark = self.cudnn_benchmark
        try:
            with tf32(matmul=self.tf32, cudnn=self.tf32):
                yield
        finally:
            torch.backends.cudnn.benchmark = benchmark

    def autocast(self, device: str) -> torch.autocast:
        return torch.autocast(device.split(':')[0], dtype=torch.bfloat16, enabled=self.dtype == 'bf16')

    def prepare(self, model: nn.Module) -> Callable:
        """``model`` itself, or compiled in the protocol's mode."""
        if self.compile == 'none':
            return model
        if self.backend != 'inductor':
            return torch.compile(model, backend=self.backend, dynamic=False)
        return torch.compile(model, mode=None if self.compile == 'default' else self.compile, dynamic=False)


EAGER_FP32 = Protocol()  # the default: eager fp32 without TF32


def add_protocol_arguments(parser) -> None:
    parser.add_argument('--dtype', choices=DTYPES, default='fp32', help='fp32, or bf16 autocast. Defaults to fp32')
    parser.add_argument('--tf32', action='store_true', help='fp32 products on TF32 tensor cores (CUDA)')
    parser.add_argument('--compile', nargs='?', const='default', default='none', choices=COMPILE_MODES,
                        help='torch.compile every model in this mode (no mode: default). Defaults to none (eager)')
    parser.add_argument('--no-cudnn-benchmark', action='store_true', help="cuDNN's autotuner off")
    parser.add_argument('--compile-backend', default='inductor', choices=('inductor', 'eager'),
                        help="torch.compile's backend; eager (dynamo's graphs, eager kernels) checks the wiring fast")


def commit() -> str:
    """The checkout's commit, with ``+changes`` when tracked files differ from it."""
    try:
        head = subprocess.run(['git', 'rev-parse', '--short=12', 'HEAD'], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(['git', 'status', '--porcelain', '--untracked-files=no'], cwd=ROOT,
                               capture_output=True, text=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return 'unknown (not a git checkout)'
    return head + ('+changes' if dirty else '')


def provenance(device: str) -> str:
    """One line: the commit, the device, torch and the command."""
    cpu = f'CPU, {torch.get_num_threads()} threads'
    card = torch.cuda.get_device_name(device) if device.startswith('cuda') else cpu
    return (f'commit {commit()}, {card}, torch {torch.__version__}, '
            f'command: {" ".join([Path(sys.argv[0]).name, *sys.argv[1:]])}')
