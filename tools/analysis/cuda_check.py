"""The CUDA checks in one prepared run of at most about ten minutes on one GPU, each step a benchmark of
``benchmark.py`` or the CUDA tests, results written to ``--out``: ``results.json`` (every step's status, time, command
and tables; the tests one by one; the paper's GPU claims beside what was measured), ``results.md`` (the same as
tables), ``log.txt`` (every step's whole output) and the plots. Started by ``bash tools/cuda_check.sh``, which
installs what a machine with torch and timm lacks; a step whose need is missing (a CUDA device, two of them, ONNX
Runtime's CUDA provider) is skipped with the reason, and a step that fails or runs out of time does not stop the
others.

    bash tools/cuda_check.sh --out work_dirs/cuda_check                 # on a GPU machine
    bash tools/cuda_check.sh --dry-run --out /tmp/cuda_check            # every step at tiny sizes on the CPU

The steps, most important first (``--budget`` seconds in all; a step not started in time is skipped):
the test suite on the device (every Triton test runs its compiled kernels there: the whole suite where the MMLab
stack is installed, else the tests that need only torch, timm, triton and mmengine); the CUDA tests; WF-T against
DeiT-T throughput and peak memory at 224, 1024 and 1248 (Table 3, Section 5.5: eager fp32, then both compiled alike,
the ImageNet and Cascade training steps compiled, and compiled bf16 inference); DeiT-T with unfused attention, as
the paper's DeiT ran; one mixed-precision training step per family at the configs' per-GPU batch (ImageNet, Cascade
and UperNet backbones with their pyramid, WF-DiT B/2 in bf16 and fp16); the generation benchmark at Table 7's
per-GPU batch; the dynamic layers' kernel choices timed; the generation step's profile by kernel; one block's token
mixer against its channel mixer; ONNX Runtime's CUDA provider; NCCL on two GPUs.

Without a CUDA device only ``--dry-run`` runs: a real run there exits with an error rather than report steps whose
every test was skipped. A pytest step whose tests were all skipped reads "not run", never "passed".
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import os.path as osp
import sys
import time
from collections.abc import Callable

import torch

from mmwf.analysis.check_steps import Step, junit_tests, run_step, step_server

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
TOOLS = osp.join(ROOT, 'tools', 'analysis')
# the release's throughput batch (128) at 224; 8 at the high resolutions
TABLE3 = dict(sizes=[224, 1024, 1248], batch={224: 128, 1024: 8, 1248: 8})
# Table 3's networks: WF-T (mmwf's name) and DeiT-T as timm computes it, the paper's reference
WF_T, DEIT_T = 'weightformer_t', 'deit_tiny_patch16_224'
MMLAB = ('mmcv', 'mmdet', 'mmseg', 'mmpretrain')
# the suite's tests that need only torch, timm, triton and mmengine (what cuda_check.sh installs), where the MMLab
# stack is missing: the layers (their Triton kernels among them), the backbones, the ViT pyramid, the denoisers, the
# compiled graphs and the transfer of weights; tests/models' others need mmcv's RoIAlign, mmdet, mmpretrain's configs
# or diffusers, and tests/test_cuda.py is the next step's
CORE_TESTS = ['tests/models/layers', 'tests/models/backbones', 'tests/models/necks/test_vit_baseline_pyramid.py',
              'tests/models/diffusion', '--ignore', 'tests/models/diffusion/test_diffusers.py',
              'tests/models/test_compile.py', 'tests/models/test_transfer.py']
# the junit files of the pytest steps: step -> file under --out
JUNIT = {'suite': 'suite_tests.xml', 'cuda-tests': 'cuda_tests.xml'}


def tool(benchmark: str, *args: object) -> list[str]:
    """``benchmark.py BENCHMARK ARGS``."""
    return [sys.executable, osp.join(TOOLS, 'benchmark.py'), benchmark, *map(str, args)]


def cuda_devices() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def need_gpus(count: int, dry_run: bool) -> Callable[[], str | None]:
    def need() -> str | None:
        if dry_run:
            return f'dry run: needs {count} CUDA device{"s" * (count > 1)}'
        found = cuda_devices()
        return None if found >= count else f'needs {count} CUDA device{"s" * (count > 1)}, found {found}'
    return need


def need_onnx(provider: str) -> Callable[[], str | None]:
    def need() -> str | None:
        try:
            import onnxruntime
            import onnxscript  # noqa: F401  (the exporter's dependency)
        except ImportError as err:
            return f'{err.name} is not installed (requirements/deploy.txt; onnxruntime-gpu for CUDA)'
        if provider not in onnxruntime.get_available_providers():
            return (f'ONNX Runtime {onnxruntime.__version__} here has no {provider} (providers: '
                    f'{", ".join(onnxruntime.get_available_providers())}; install onnxruntime-gpu)')
        return None
    return need


def suite_tests() -> tuple[list[str], str]:
    """The suite step's pytest arguments and what they cover: every test but tests/test_cuda.py (the next step)
    where the MMLab stack is installed, else :data:`CORE_TESTS`; on every core where pytest-xdist is there."""
    missing = [package for package in MMLAB if importlib.util.find_spec(package) is None]
    parallel = ['-n', 'auto', '--dist', 'loadgroup'] if importlib.util.find_spec('xdist') else []
    if not missing:
        return ['tests', '--ignore', 'tests/test_cuda.py', *parallel], \
            'the test suite on the device (pytest tests, all but tests/test_cuda.py: the next step)'
    return [*CORE_TESTS, *parallel], (f'the tests that need only torch, timm, triton and mmengine on the device, '
                                      f'the layers\' and backbones\' among them ({", ".join(missing)} not '
                                      'installed; results.json names the files)')


def steps(out: str, dry_run: bool) -> list[Step]:
    """The run's steps in order; ``dry_run``: each at tiny sizes on the CPU."""
    dev = 'cpu' if dry_run else 'cuda'
    sizes = [64] if dry_run else TABLE3['sizes']
    batch = [f'{s}:{2 if dry_run else TABLE3["batch"][s]}' for s in sizes]
    rounds = ['--rounds', 1] if dry_run else ['--rounds', 5]
    table3 = ['--sizes', *sizes, '--batch', *batch, *rounds, '--iters', 1 if dry_run else 5, '--device', dev,
              *(['--no-memory'] if dry_run else [])]
    # compiled alike for both models; the dry run checks the wiring with dynamo's graphs on eager kernels
    compiled = ['--compile', *(['--compile-backend', 'eager'] if dry_run else [])]
    cls_batch, cls_size = (2, 32) if dry_run else (256, 224)
    dense = {'cascade': (1, 64) if dry_run else (4, 1024), 'upernet': (1, 64) if dry_run else (8, 512)}
    gen = ['--sizes', 8 if dry_run else 32, '--batch', 2 if dry_run else 32, '--device', dev, *rounds]
    gen_no_memory = ['--no-memory'] if dry_run else []
    dit = 'S/2' if dry_run else 'B/2'
    suite, suite_what = suite_tests()
    junit = {name: osp.join(out, file) for name, file in JUNIT.items()}
    return [
        # a GPU in the dry run too: on the CPU the suite is the one `make test` runs, and it runs this dry run
        Step('suite', suite_what,
             [sys.executable, '-m', 'pytest', *suite, '-m', 'not benchmark', '-p', 'no:cacheprovider', '-q', '-rfE',
              '--junitxml', junit['suite']], 240, need=need_gpus(1, dry_run), junit=junit['suite']),
        Step('cuda-tests', 'tests/test_cuda.py (pytest -m cuda)',
             [sys.executable, '-m', 'pytest', '-m', 'cuda', 'tests/test_cuda.py', '-p', 'no:cacheprovider', '-q',
              '-rA', '--junitxml', junit['cuda-tests']], 180, junit=junit['cuda-tests']),
        Step('table3', 'WF-T vs DeiT-T (timm, fused attention): throughput and peak memory',
             tool('inference', '--models', WF_T, DEIT_T, *table3, '--plot', osp.join(out, 'benchmark.png')),
             90),
        Step('table3-compiled', 'the same, both models compiled (torch.compile, default mode), fp32',
             tool('inference', '--models', WF_T, DEIT_T, *table3, *compiled), 150),
        Step('train-imagenet-compiled', f'ImageNet classifier training step, batch {cls_batch} at {cls_size}, AMP, '
             'both models compiled', tool('train', '--part', 'classifier', '--batch', cls_batch, '--size', cls_size,
                                          '--amp', '--device', dev, *rounds, '--iters', 1 if dry_run else 3,
                                          *compiled), 150),
        Step('table3-bf16', 'the same, both models compiled, bf16 autocast',
             tool('inference', '--models', WF_T, DEIT_T, *table3, *compiled, '--dtype', 'bf16'), 150),
        Step('table3-unfused', 'DeiT-T with unfused attention (TIMM_FUSED_ATTN=0), as DeiT computed it',
             tool('inference', '--models', DEIT_T, *table3), 90, env=dict(TIMM_FUSED_ATTN='0')),
        Step('train-imagenet', f'ImageNet classifier training step, batch {cls_batch} at {cls_size}, AMP',
             tool('train', '--part', 'classifier', '--batch', cls_batch, '--size', cls_size,
                  '--amp', '--device', dev, *rounds, '--iters', 1 if dry_run else 3), 60),
        Step('train-cascade-compiled', f'cascade backbone + SimpleFeaturePyramid training step, batch '
             f'{dense["cascade"][0]} at {dense["cascade"][1]}, AMP, backbone and pyramid compiled',
             tool('train', '--part', 'backbone+pyramid', '--batch', dense['cascade'][0], '--size',
                  dense['cascade'][1], '--amp', '--device', dev, *rounds, '--iters', 1 if dry_run else 3,
                  *compiled), 150),
        *[Step(f'train-{family}', f'{family} backbone + SimpleFeaturePyramid training step, batch {b} at {s}, AMP',
               tool('train', '--part', 'backbone+pyramid', '--batch', b, '--size', s, '--amp',
                    '--device', dev, *rounds, '--iters', 1 if dry_run else 3), 60)
          for family, (b, s) in dense.items()],
        *[Step(f'train-wf-dit-{amp}', f'WF-DiT vs DiT {dit} training step, {amp} autocast (the *_{amp} configs)',
               tool('generation', '--archs', dit, '--modes', 'train',
                    '--amp', amp, *gen, *gen_no_memory), 60)
          for amp in ('bf16', 'fp16')],
        Step('generation', f"WF-DiT vs DiT, S/2{'' if dry_run else ' and B/2'}, fp32 training and sampling steps at "
             "Table 7's per-GPU batch",
             tool('generation', '--archs', 'S/2', *([] if dry_run else ['B/2']), '--modes', 'train',
                  'sample', *gen, *gen_no_memory), 90),
        Step('kernels', "the dynamic layers' evaluations timed, and the rule's pick",
             tool('kernels', '--models', WF_T, '--sizes', *sizes, '--batch', *batch,
                  *rounds, '--device', dev), 90),
        Step('triton', "WF-T with the dynamic layers' Triton kernels (+triton) beside WF-T and DeiT-T, eager fp32",
             tool('inference', '--models', WF_T, f'{WF_T}+triton', DEIT_T, *table3), 90,
             # a GPU in the dry run too: under Triton's interpreter these steps add a minute to the suite, and
             # tests/analysis and tests/models/layers check the variant and the kernels on the CPU
             need=need_gpus(1, dry_run)),
        Step('train-imagenet-triton', f'the ImageNet training step with the Triton kernels, batch {cls_batch} at '
             f'{cls_size}, AMP', tool('train', '--models', WF_T, f'{WF_T}+triton', 'deit_t_softmax', '--part',
                                      'classifier', '--batch', cls_batch, '--size', cls_size, '--amp', '--device',
                                      dev, *rounds, '--iters', 1 if dry_run else 3), 90,
             need=need_gpus(1, dry_run)),
        Step('profile', 'WF-DiT vs DiT S/2 training step by phase and operator group',
             tool('generation', '--profile', '--archs', 'S/2', '--modes', 'train', *gen), 60),
        Step('engine-split', "one block's token mixer against its channel mixer",
             tool('engine-split', '--device', dev, *rounds, '--plot', osp.join(out, 'engine_split.png'),
                  *(['--models', 'deit_t_softmax', WF_T, '--sizes', 64] if dry_run else [])), 90),
        *[Step(f'onnx-{precision}', f"ONNX Runtime's CUDA execution provider against eager PyTorch, {precision}",
               tool('onnx', '--device', 'cuda', '--models', WF_T, 'deit_t_softmax', '--sizes', 224, 1024,
                    *rounds, *(['--fp16'] if precision == 'fp16' else [])), 90,
               need_gpus(1, dry_run) if dry_run else need_onnx('CUDAExecutionProvider'))
          for precision in ('fp32', 'fp16')],
        Step('nccl', "two ranks under NCCL: the generation configs' per-rank seeds, TF32 and DDP",
             [sys.executable, '-m', 'torch.distributed.run', '--nproc_per_node', '2', '-m',
              'tests.engine.world_size_run', osp.join(out, 'nccl'), 'configs/generation/wf_dit_s_2_in256.py',
              'configs/generation/dit_s_2_in256.py'], 120, need_gpus(2, dry_run),
             more_tables=lambda: [nccl_table(osp.join(out, 'nccl'))]),
    ]


def nccl_table(folder: str) -> dict:
    """The ``nccl`` step's two ranks side by side: per config, each rank's backend, seed (the configs' rule: seed 5
    x world size + rank), first draw and TF32 flag during the run, and whether the parameters agree across ranks."""
    ranks = []
    for rank in (0, 1):
        with open(osp.join(folder, f'rank{rank}.json')) as f:
            ranks.append(json.load(f))
    rows = []
    for config in ranks[0]:
        same = ranks[0][config]['params'] == ranks[1][config]['params']
        for rank, seen in enumerate(ranks):
            row = seen[config]
            rows.append([config, row['backend'], str(rank), str(row['seed']), f'{row["draws"][0]:.6f}',
                         str(row['tf32']), str(same)])
    return dict(title='', columns=['config', 'backend', 'rank', 'seed', 'first draw', 'TF32 in the run',
                         'parameters equal across ranks'], rows=rows)


def environment() -> dict:
    import timm

    from mmwf.analysis.protocol import commit
    env = dict(commit=commit(), python=sys.version.split()[0], torch=torch.__version__, timm=timm.__version__,
               cuda=torch.version.cuda, cuda_devices=cuda_devices())
    if env['cuda_devices']:
        capability = '.'.join(map(str, torch.cuda.get_device_capability(0)))
        env.update(device=torch.cuda.get_device_name(0), capability=capability, cudnn=torch.backends.cudnn.version())
    try:
        import mmengine
        env['mmengine'] = mmengine.__version__
    except ImportError:
        env['mmengine'] = None
    return env


def cell(row: dict, column: str) -> float | None:
    try:
        return float(row[column].rstrip('x'))
    except (KeyError, ValueError):
        return None


# the inference steps whose ratio is set beside the paper's: the step -> how its DeiT-T ran (WF-T's row of
# table3-unfused is table3's)
PAPER_STEPS = {'table3': 'DeiT-T', 'table3-unfused': 'DeiT-T (unfused)',
               'table3-compiled': 'DeiT-T, both compiled', 'table3-bf16': 'DeiT-T, both compiled, bf16'}


def paper_comparison(results: list[dict]) -> list[dict]:
    """The paper's GPU claims (Table 3 and Section 5.5, from the metafiles) beside the ratios measured by the
    inference steps (:data:`PAPER_STEPS`): WF-T over DeiT-T throughput at each size, and the peak memory WF-T saves
    at 1248 (eager)."""
    from mmwf.configs import metafile_models
    models = metafile_models()
    paper = {name: models[config]['Results'][0]['Metrics'] for name, config in
             ((WF_T, 'weightformer_t_in1k'), (DEIT_T, 'deit_t_softmax_in1k'))}
    rows: dict[str, dict] = {}
    for result in results:
        if result['name'] in PAPER_STEPS and result['tables']:
            table = result['tables'][0]
            rows[result['name']] = {(row['model'], int(row['input'])): row
                                    for row in (dict(zip(table['columns'], values)) for values in table['rows'])}

    def pair(step: str, size: int) -> tuple[dict | None, dict | None]:
        ours = rows.get('table3' if step == 'table3-unfused' else step, {}).get((WF_T, size))
        return ours, rows.get(step, {}).get((DEIT_T, size))
    claims = []
    for size in TABLE3['sizes']:
        wf, deit = (paper[m].get(f'Throughput {size} (img/s)') for m in (WF_T, DEIT_T))
        claim = (wf / deit if wf and deit else
                 paper[WF_T].get(f'Throughput vs DeiT-T at {size} (x)'))
        for step, label in PAPER_STEPS.items():
            ours, theirs = pair(step, size)
            measured = (cell(ours, 'img/s') / cell(theirs, 'img/s')
                        if ours and theirs and cell(theirs, 'img/s') else None)
            claims.append(dict(claim=f'WF-T / {label} throughput at {size}', paper=claim, measured=measured))
    saving = paper[WF_T].get('Memory saved vs DeiT-T at 1248 (%)')
    for step in ('table3', 'table3-unfused'):
        ours, theirs = pair(step, 1248)
        measured = (100 * (1 - cell(ours, 'peak MB') / cell(theirs, 'peak MB'))
                    if ours and theirs and cell(ours, 'peak MB') and cell(theirs, 'peak MB') else None)
        claims.append(dict(claim=f'peak memory WF-T saves against {PAPER_STEPS[step]} at 1248 (%)', paper=saving,
                           measured=measured))
    return claims


def number(value: float | None, digits: int = 2) -> str:
    return '-' if value is None else f'{value:.{digits}f}'


def markdown(report: dict) -> str:
    env = report['environment']
    lines = [f'# CUDA check{" (dry run)" if report["dry_run"] else ""}', '',
             f'commit {env["commit"]}, {env.get("device", "no CUDA device")}, torch {env["torch"]} '
             f'(CUDA {env["cuda"]}), timm {env["timm"]}, mmengine {env["mmengine"]}, Python {env["python"]}; '
             f'{report["started"]}, {report["seconds"]:.0f} s in all. Steps of python forked from one '
             f'interpreter that imported mmwf: {report["fork_server"]}.',
             '', '| step | what | status | s | started |', '|---|---|---|---|---|']
    for step in report['steps']:
        status = step['status'] + (f': {step["reason"]}' if step.get('reason') else '')
        lines.append(f'| {step["name"]} | {step["what"]} | {status} | {step["seconds"]:.0f} | '
                     f'{step.get("started", "-")} |')
    lines += ['', '## Against the paper', '', '| claim | paper | measured |', '|---|---|---|']
    lines += [f'| {c["claim"]} | {number(c["paper"])} | {number(c["measured"])} |' for c in report['paper']]
    for title, cases in (('Suite', report.get('suite_tests', [])), ('CUDA tests', report['tests'])):
        failed = [t for t in cases if t['outcome'] in ('failure', 'error')]
        outcomes = {o: sum(t['outcome'] == o for t in cases) for o in ('passed', 'failure', 'error', 'skipped')}
        summary = ', '.join(f'{n} {o}' for o, n in outcomes.items()) if cases else 'not run'
        if cases and not outcomes['passed']:
            summary += ': not run (no test passed)'
        lines += ['', f'## {title}', '', summary]
        lines += [f'- {t["name"]}: {t["outcome"]}: {t["message"]}' for t in failed]
    for step in report['steps']:
        if step['tables']:
            lines += ['', f'## {step["name"]}', '', f'`{step["command"].replace(ROOT + "/", "")}`']
            for table in step['tables']:
                lines += ['', *([table['title'], ''] if table['title'] else []),
                          '| ' + ' | '.join(table['columns']) + ' |', '|---' * len(table['columns']) + '|']
                lines += ['| ' + ' | '.join(row) + ' |' for row in table['rows']]
    return '\n'.join(lines) + '\n'


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--out', default='work_dirs/cuda_check', help='folder for the results. Defaults to '
                        'work_dirs/cuda_check')
    parser.add_argument('--dry-run', action='store_true', help='every step at tiny sizes on the CPU')
    parser.add_argument('--budget', type=float, default=600, help='seconds for all steps; a step is not started '
                        'with less than 20 s left. Defaults to 600')
    parser.add_argument('--steps', nargs='+', help='only these steps (names as in results.md)')
    parser.add_argument('--no-fork', action='store_true', help='start every step in a fresh interpreter; by '
                        'default a step of python is forked from one that has imported mmwf (about 5 s saved each)')
    args = parser.parse_args()
    out = osp.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    if not args.dry_run and not cuda_devices():
        raise SystemExit('error: no CUDA device here (torch.cuda.is_available() is False, torch '
                         f'{torch.__version__}, CUDA {torch.version.cuda}): every step of this run needs one, and '
                         'none ran. Run it on a CUDA machine, or with --dry-run for the steps\' wiring on the CPU')
    for stale in (*JUNIT.values(), 'benchmark.png', 'engine_split.png', 'results.json', 'results.md'):
        if osp.isfile(osp.join(out, stale)):
            os.remove(osp.join(out, stale))
    plan = steps(out, args.dry_run)
    unknown = set(args.steps or []) - {s.name for s in plan}
    if unknown:
        raise SystemExit(f'error: no step named {", ".join(sorted(unknown))}; the steps: '
                         f'{", ".join(s.name for s in plan)}')
    started, clock = time.strftime('%Y-%m-%d %H:%M:%S %Z'), time.perf_counter()
    server = None if args.no_fork else step_server(ROOT)
    forking = ('off (--no-fork)' if server is None
               else f'refused: {server.refused}' if server.refused else 'on')
    print(f'steps forked from one interpreter: {forking}', flush=True)
    results = []
    with open(osp.join(out, 'log.txt'), 'w') as log:
        for step in plan:
            if args.steps and step.name not in args.steps:
                continue
            left = args.budget - (time.perf_counter() - clock)
            if left < 20:
                results.append(dict(name=step.name, what=step.what, command=' '.join(step.argv), status='skipped',
                                    reason=f'out of the run\'s {args.budget:.0f} s', seconds=0.0, tables=[]))
            else:
                results.append(run_step(step, min(step.timeout, left), log, ROOT, server))
            last = results[-1]
            print(f'{last["name"]}: {last["status"]}{" (" + last["reason"] + ")" if last.get("reason") else ""}, '
                  f'{last["seconds"]:.0f} s', flush=True)
    if server is not None:
        server.close()
    report = dict(started=started, seconds=time.perf_counter() - clock, dry_run=args.dry_run,
                  environment=environment(), fork_server=forking, steps=results,
                  tests=junit_tests(osp.join(out, JUNIT['cuda-tests'])),
                  suite_tests=junit_tests(osp.join(out, JUNIT['suite'])), paper=paper_comparison(results))
    with open(osp.join(out, 'results.json'), 'w') as f:
        json.dump(report, f, indent=1)
    with open(osp.join(out, 'results.md'), 'w') as f:
        f.write(markdown(report))
    print(f'wrote {osp.join(out, "results.md")} and results.json')


if __name__ == '__main__':
    main()
