"""Architecture settings shared by the backbones and the denoisers: a named or custom ``arch``, and which blocks of a
stack are dynamic."""
from __future__ import annotations

from collections.abc import Sequence


def resolve_arch(arch: str | dict, table: dict[str, dict], family: str) -> dict:
    """``arch`` as a new dict: a name of ``table`` (in any case), or a custom dict with exactly the keys of the
    table's entries (all of them required, no other allowed).

    Args:
        arch (str | dict): a name of ``table`` or a custom dict.
        table (dict[str, dict]): the family's named archs, every entry with the same keys.
        family (str): the family's name, for the errors.
    """
    required = sorted(next(iter(table.values())))
    if isinstance(arch, str):
        names = {name.lower(): name for name in table}
        if arch.lower() not in names:
            raise ValueError(f'unknown {family} arch {arch!r}; choose from {sorted(table)} or pass a dict with '
                             f'{", ".join(required)}')
        return dict(table[names[arch.lower()]])
    missing, unknown = sorted(set(required) - set(arch)), sorted(set(arch) - set(required))
    if missing or unknown:
        faults = [f'lacks {missing}'] if missing else []
        faults += [f'has unknown keys {unknown}'] if unknown else []
        raise ValueError(f'custom {family} arch {dict(arch)} {" and ".join(faults)}; a custom arch needs exactly '
                         f'{", ".join(required)}, e.g. {table[next(iter(table))]}')
    return dict(arch)


def dynamic_block_ids(spec: dict | Sequence[int], depth: int) -> set[int]:
    """The dynamic blocks of a ``depth``-block network: ``dict(every=k, offset=o)`` (block i when i % k == o; the
    release's classifiers and DiTs: every=3, offset=1) or a list of block indices (negative ones from the end)."""
    if isinstance(spec, dict):
        every = spec.get('every')
        if set(spec) - {'every', 'offset'} or not isinstance(every, int) or every < 1:
            raise ValueError(f'dynamic_blocks={dict(spec)}: give dict(every=k, offset=o) with k >= 1 (block i is '
                             'dynamic when i % k == o; the release: every=3, offset=1) or a list of block indices')
        return {i for i in range(depth) if i % every == spec.get('offset', 0)}
    ids = {i % depth for i in spec}
    if any(not -depth <= i < depth for i in spec):
        raise ValueError(f'dynamic_blocks {list(spec)} out of range for depth {depth}')
    return ids
