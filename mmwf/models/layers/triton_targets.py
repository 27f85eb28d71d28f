"""mmwf's Triton kernels compiled ahead of time for the GPUs they target, on any machine (no GPU, no driver): per
kernel, specialization and target (sm_80: A100; sm_90a: H100 / H200) the registers a thread uses, the bytes it
spills, the shared memory a program takes, the barriers and the tensor-core instructions, read from what Triton
builds (its PTX and cubin, ``ptxas -v`` with Triton's own flags, the SASS by ``cuobjdump``; all three ship in the
triton wheel). A kernel that spills or forgoes the tensor cores shows it here, before any GPU runs it.

    python -m mmwf.models.layers.triton_targets            # the table (markdown), docs/gpu.md's
    python -m mmwf.models.layers.triton_targets --json     # the facts as JSON

Triton's interpreter (``TRITON_INTERPRET=1``, the CPU tests') replaces ``triton.jit`` and triton.language's own
functions by its Python evaluations, which the compiler cannot take: :func:`facts` compiles in a child process
without it whenever this one interprets.
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import inspect
import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterable

TARGETS = {'sm_80': 80, 'sm_90a': 90}  # A100; H100 / H200 (Triton compiles capability 9.0 for sm_90a)
# pointers and the integer arguments named in Specialization.aligned are taken as multiples of 16 (what Triton
# assumes at a launch for 16-byte aligned pointers and for the layers' widths: 192, 384, 768, ...)
DIVISIBILITY = [['tt.divisibility', 16]]
FACTS_FILE = 'mmwf_static_facts.json'


@dataclasses.dataclass(frozen=True)
class Specialization:
    """One compiled form of a kernel: ``kernel`` (the module's attribute, a ``triton.jit`` or ``triton.autotune``
    function), its argument types (``'*bf16'``, ``'i32'``; the constexprs' values in ``constexprs``), the launch's
    warps and stages; ``label`` names it in the table, ``aligned`` the integer arguments taken as multiples of 16."""
    module: str
    kernel: str
    label: str
    signature: tuple[tuple[str, str], ...]
    constexprs: tuple[tuple[str, object], ...]
    num_warps: int
    num_stages: int
    aligned: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class Facts:
    """What one specialization compiles to for one target (``registers``: per thread; ``shared``: bytes per
    program; ``spill_stores`` / ``spill_loads``: bytes per thread; ``mma``: the tensor-core instructions in the
    SASS, HMMA or HGMMA, 0 where there are none; ``ptx_mma``: the PTX's kind of them, ``mma`` or ``wgmma``, else
    ``-``; ``barriers``: the bar.sync / barrier.sync in the PTX)."""
    kernel: str
    specialization: str
    target: str
    registers: int
    shared: int
    spill_stores: int
    spill_loads: int
    mma: int
    ptx_mma: str
    barriers: int
    num_warps: int
    num_stages: int


def spec(module: str, kernel: str, label: str, args: dict[str, str], constexprs: dict[str, object],
         num_warps: int = 4, num_stages: int = 3, aligned: Iterable[str] = ()) -> Specialization:
    """A :class:`Specialization` from dicts (kept as tuples, hashable)."""
    return Specialization(module, kernel, label, tuple(args.items()), tuple(constexprs.items()), num_warps,
                          num_stages, tuple(aligned))


def specializations() -> list[Specialization]:
    """Every specialization the layers and configs reach, from the kernel modules' own lists (their block sizes,
    warps and autotuned configs): the depthwise conv at K 3, 5 and 7 in fp32, bf16 and fp16 (its three kernels),
    the fused linear in fp32, TF32, bf16 and fp16 at each autotuned tile."""
    from . import dwconv_triton, dynamic_linear_triton
    return [*dwconv_triton.aot_specializations(), *dynamic_linear_triton.aot_specializations()]


def _python_function(kernel):
    """The undecorated Python function of a ``triton.jit`` / ``triton.autotune`` / interpreted kernel."""
    while not inspect.isfunction(kernel):
        kernel = kernel.fn
    return kernel


@functools.cache
def _tool(name: str) -> str:
    from triton import knobs
    return getattr(knobs.nvidia, name.replace('-', '_')).path


def _ptxas_facts(ptx: str, arch: str) -> tuple[int, int, int]:
    """Registers, spill stores and spill loads (bytes per thread) from ``ptxas -v`` with Triton's flags."""
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, 'kernel.ptx')
        with open(path, 'w') as f:
            f.write(ptx)
        proc = subprocess.run([_tool('ptxas'), '-lineinfo', '-v', '--regAllocOptLevel=2', f'--gpu-name={arch}', path,
                               '-o', os.path.join(folder, 'kernel.cubin')], capture_output=True, text=True,
                              check=True)
    log = proc.stdout + proc.stderr
    registers = re.search(r'Used (\d+) registers', log)
    spills = re.search(r'(\d+) bytes spill stores, (\d+) bytes spill loads', log)
    if registers is None or spills is None:
        raise RuntimeError(f'ptxas -v printed no register or spill counts:\n{log}')
    return int(registers.group(1)), int(spills.group(1)), int(spills.group(2))


def _sass(cubin: bytes) -> str:
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, 'kernel.cubin')
        with open(path, 'wb') as f:
            f.write(cubin)
        return subprocess.run([_tool('cuobjdump'), '-sass', path], capture_output=True, text=True, check=True).stdout


def compile_facts(specialization: Specialization, target: str) -> Facts:
    """Compile ``specialization`` for ``target`` (a key of :data:`TARGETS`) in this process (which must not
    interpret Triton) and read its facts."""
    import importlib

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.runtime.jit import JITFunction

    module = importlib.import_module(specialization.module)
    fn = JITFunction(_python_function(getattr(module, specialization.kernel)))
    signature = dict(specialization.signature)
    names = list(signature)
    attrs = {(names.index(name),): DIVISIBILITY for name, kind in signature.items()
             if kind.startswith('*') or name in specialization.aligned}
    source = triton.compiler.ASTSource(fn=fn, signature=signature, constexprs=dict(specialization.constexprs),
                                       attrs=attrs)
    compiled = triton.compile(source, target=GPUTarget('cuda', TARGETS[target], 32),
                              options=dict(num_warps=specialization.num_warps,
                                           num_stages=specialization.num_stages))
    return Facts(kernel=specialization.kernel.lstrip('_'), specialization=specialization.label, target=target,
                 shared=int(compiled.metadata.shared), num_warps=specialization.num_warps,
                 num_stages=specialization.num_stages, **_binary_facts(compiled, target))


def _binary_facts(compiled, target: str) -> dict:
    """Registers, spills, tensor-core instructions and barriers of a compiled kernel, kept beside it in Triton's
    cache (its hash is the source's, the options' and the target's): reading the SASS takes most of a second."""
    from triton.runtime.cache import get_cache_manager
    cache = get_cache_manager(compiled.hash)
    kept = cache.get_file(FACTS_FILE)
    if kept is not None:
        with open(kept) as f:
            return json.load(f)
    ptx, sass = compiled.asm['ptx'], _sass(compiled.asm['cubin'])
    registers, stores, loads = _ptxas_facts(ptx, target)
    kinds = [kind for kind in ('wgmma', 'mma') if re.search(rf'^\s*{kind}\.', ptx, re.MULTILINE)]
    found = dict(registers=registers, spill_stores=stores, spill_loads=loads,
                 mma=len(re.findall(r'\b(?:HMMA|HGMMA)\.', sass)), ptx_mma=kinds[0] if kinds else '-',
                 barriers=len(re.findall(r'^\s*(?:bar|barrier)\.sync\b', ptx, re.MULTILINE)))
    cache.put(json.dumps(found), FACTS_FILE, binary=False)
    return found


def _interpreting() -> bool:
    from triton import knobs
    return bool(knobs.runtime.interpret) or os.environ.get('TRITON_INTERPRET') == '1'


def facts(targets: Iterable[str] = tuple(TARGETS), only: str | None = None) -> list[Facts]:
    """The facts of every specialization (:func:`specializations`; ``only``: those whose kernel or label contains
    it) for each target, compiled in a child process without the interpreter when this one interprets."""
    targets = list(targets)
    if _interpreting():
        env = {k: v for k, v in os.environ.items() if k != 'TRITON_INTERPRET'}
        argv = [sys.executable, '-m', __name__, '--json', '--targets', *targets, *(['--only', only] if only else [])]
        proc = subprocess.run(argv, env=env, capture_output=True, text=True)
        if proc.returncode:
            raise RuntimeError(f'{" ".join(argv)} failed:\n{proc.stdout[-3000:]}{proc.stderr[-5000:]}')
        return [Facts(**row) for row in json.loads(proc.stdout)]
    return [compile_facts(s, t) for s in specializations()
            if only is None or only in s.kernel or only in s.label for t in targets]


COLUMNS = ['kernel', 'specialization', 'target', 'warps x stages', 'registers', 'shared memory (B)',
           'spills (B stored / loaded)', 'barriers', 'tensor-core instructions']


def table(rows: Iterable[Facts]) -> str:
    """The facts as a markdown table (docs/gpu.md's)."""
    lines = ['| ' + ' | '.join(COLUMNS) + ' |', '|' + '---|' * len(COLUMNS)]
    for r in rows:
        mma = f'{r.mma} ({r.ptx_mma})' if r.mma else '0'
        lines.append(f'| {r.kernel} | {r.specialization} | {r.target} | {r.num_warps} x {r.num_stages} | '
                     f'{r.registers} | {r.shared} | {r.spill_stores} / {r.spill_loads} | {r.barriers} | {mma} |')
    return '\n'.join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--json', action='store_true', help='the facts as JSON, not the markdown table')
    parser.add_argument('--targets', nargs='+', default=list(TARGETS), choices=list(TARGETS))
    parser.add_argument('--only', help='the specializations whose kernel or label contains this')
    args = parser.parse_args(argv)
    rows = facts(args.targets, args.only)
    print(json.dumps([dataclasses.asdict(r) for r in rows]) if args.json else table(rows))


if __name__ == '__main__':
    main()
