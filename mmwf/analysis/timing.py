"""Timing and peak memory of one call, on CUDA or on the CPU, for the benchmark tools."""
from __future__ import annotations

import importlib.util
import os
import os.path as osp
import subprocess
import sys
import time
from collections.abc import Callable
from types import ModuleType

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


def device_busy_share(call: Callable[[], object], device: str) -> float | None:
    """The share of one ``call()``'s wall time the GPU spent in kernels (the profiler's kernel times summed over the
    wall time, the device synchronised around it): near 1 when the GPU is kept busy, low when the host's launches
    keep it waiting. None off CUDA."""
    if not device.startswith('cuda'):
        return None
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        wall = time_call(call, device)
    cuda = torch.autograd.DeviceType.CUDA
    kernels = sum(e.time_range.elapsed_us() for e in prof.events() if e.device_type == cuda)
    return kernels / 1e6 / wall


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


def training_step(parameters, loss: Callable[[], torch.Tensor], device: str, amp: torch.dtype | None = None,
                  weight_decay: float = 0.01) -> Callable[[], torch.Tensor]:
    """One training step as every benchmark times it: ``loss()`` under ``amp`` autocast (float16 with a dynamic loss
    scale, as mmengine's AmpOptimWrapper; None: fp32), backward, AdamW (lr 1e-4; on CUDA torch's fused kernel, the
    fastest it offers, for every model alike); the step returns the loss, and its GradScaler is the step's attribute
    ``scaler`` (a scale that keeps falling means non-finite gradients)."""
    optimizer = torch.optim.AdamW(parameters, lr=1e-4, weight_decay=weight_decay, fused=device.startswith('cuda'))
    device_type = device.split(':')[0]
    scaler = torch.amp.GradScaler(device_type, enabled=amp == torch.float16)

    def step() -> torch.Tensor:
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device_type, dtype=amp or torch.float32, enabled=amp is not None):
            value = loss()
        scaler.scale(value).backward()
        scaler.step(optimizer)
        scaler.update()
        return value.detach()
    step.scaler = scaler
    return step


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


# group of a step's profile -> the aten operator names (without 'aten::') it takes, by prefix; the rest is
# element-wise
OP_GROUPS: dict[str, tuple[str, ...]] = {
    'matrix products': ('mm', 'addmm', 'bmm', 'baddbmm', 'addbmm'),
    'fused attention': ('_scaled_dot_product',),
    'convolutions': ('convolution', 'mkldnn_convolution', '_slow_conv2d', '_conv_depthwise2d', 'cudnn_convolution'),
    'activations': ('gelu', 'silu', 'sigmoid'),
    'layer norms': ('native_layer_norm',),
    'copies': ('copy_', 'cat', 'clone', 'fill_', 'zero_', 'empty', 'index'),
}


def op_group(name: str) -> str:
    """The :data:`OP_GROUPS` group of an aten operator."""
    name = name.removeprefix('aten::')
    return next((group for group, prefixes in OP_GROUPS.items() if name.startswith(prefixes)), 'element-wise')


def step_profile(step: Callable[[], object], device: str = 'cpu') -> dict[tuple[str, str], float]:
    """Milliseconds of one ``step()`` by (phase, group): on the CPU each aten operator's own CPU time, on CUDA its
    own kernel time on the device (the profiler records CUDA activity; host time there is only the launches); the
    phase ``'forward'``, ``'backward'`` (run by autograd's engine) or ``'optimizer'`` (inside ``Optimizer.step``),
    the group of each operator (:data:`OP_GROUPS`, else ``'element-wise'``). ``('all', 'step')`` is the step's wall
    time (the device synchronised before and after), so what the operators do not account for is Python, dispatch
    and, on CUDA, the device waiting for launches."""
    from torch.profiler import ProfilerActivity, profile
    cuda = device.startswith('cuda')
    activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]
    with profile(activities=activities) as prof:
        wall = time_call(step, device)
    out: dict[tuple[str, str], float] = {('all', 'step'): wall * 1e3}
    for event in prof.events():
        if not event.name.startswith('aten::') or event.device_type != torch.autograd.DeviceType.CPU:
            continue
        phase, parent = 'forward', event.cpu_parent
        while parent is not None:
            if parent.name.startswith('Optimizer.step'):
                phase = 'optimizer'
                break
            if parent.name.startswith('autograd::engine::evaluate_function'):
                phase = 'backward'
            parent = parent.cpu_parent
        own = event.self_device_time_total if cuda else event.self_cpu_time_total
        key = (phase, op_group(event.name))
        out[key] = out.get(key, 0.0) + own / 1e3
    return out


def module_from_file(path: str, what: str) -> ModuleType:
    """Import a reference's source file (``what`` names it in the error) for a side-by-side benchmark."""
    if not osp.isfile(path):
        raise FileNotFoundError(f'{path}: no such file (give {what})')
    spec = importlib.util.spec_from_file_location(f'reference_{osp.splitext(osp.basename(path))[0]}', path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # as an import would (timm's register_model looks the module up there)
    spec.loader.exec_module(module)
    return module
