"""Timing and peak memory of one call, on CUDA or on the CPU, for the benchmark tools."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable

import torch


def time_call(call: Callable[[], object], device: str) -> float:
    """Seconds of one ``call()``, the device synchronised before and after."""
    if device.startswith('cuda'):
        torch.cuda.synchronize()
    start = time.perf_counter()
    call()
    if device.startswith('cuda'):
        torch.cuda.synchronize()
    return time.perf_counter() - start


def proc_status_mb(field: str) -> float:
    """A memory field of /proc/self/status (VmRSS, VmHWM) in MB."""
    with open('/proc/self/status') as f:
        for line in f:
            if line.startswith(field + ':'):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f'{field} not in /proc/self/status')


def peak_memory(call: Callable[[], object], device: str) -> tuple[float, float]:
    """(peak, base) memory in MB around one ``call()``: CUDA's allocated bytes, or on CPU the resident set
    (VmHWM after resetting it to VmRSS)."""
    if device.startswith('cuda'):
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        call()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() / 2 ** 20, base / 2 ** 20
    base = proc_status_mb('VmRSS')
    with open('/proc/self/clear_refs', 'w') as f:
        f.write('5')  # resets VmHWM to the current RSS
    call()
    return proc_status_mb('VmHWM'), base


def step_memory(step: Callable[[], None], device: str) -> float:
    """Peak memory (MB) above what was allocated before one call of ``step`` (after a warm-up call)."""
    step()
    peak, base = peak_memory(step, device)
    return peak - base


def last_line_of(script: str, args: list[str], threads: int) -> str:
    """The last output line of ``python script *args --threads T --device cpu`` in a fresh interpreter (a
    benchmark's hidden memory-probe option), so that nothing measured before counts."""
    cmd = [sys.executable, script, *args, '--threads', str(threads), '--device', 'cpu']
    out = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ))
    if out.returncode:
        raise RuntimeError(f'memory probe {" ".join(args)} failed:\n{out.stderr[-2000:]}')
    return out.stdout.strip().splitlines()[-1]


def interleaved_times(steps: list[Callable[[], object]], rounds: int, device: str) -> list[list[float]]:
    """Seconds of each step per round, after one warm-up call each; the steps take turns within a round, so that
    the machine's drifts (shared CPUs, clocks) fall on all of them alike."""
    for step in steps:
        step()
    times: list[list[float]] = [[] for _ in steps]
    for _ in range(rounds):
        for i, step in enumerate(steps):
            times[i].append(time_call(step, device))
    return times
