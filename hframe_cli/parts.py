"""Splitting an ordered list into the contiguous parts of a job array, balanced by weight: the
one rule ``pack --shard-of`` (sources, by bytes) and ``verify --shard-of`` (packs, by bytes)
share, so every task computes the same split from the same list."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["balanced_part"]


def balanced_part(weights: Sequence[int], i: int, n: int) -> tuple[int, int]:
    """The [lo, hi) of part ``i`` of ``n``: contiguous, every item in exactly one part, each part
    ending where the running weight first reaches its share (so parts weigh about the same;
    equal weights give counts that differ by at most one)."""
    total = sum(weights)
    bounds = [0]
    run, k = 0, 0
    for j in range(1, n):
        goal = total * j / n
        while k < len(weights) and run + weights[k] / 2 <= goal:
            run += weights[k]
            k += 1
        bounds.append(max(k, bounds[-1]))
    bounds.append(len(weights))
    return bounds[i], bounds[i + 1]
