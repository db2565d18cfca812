"""A stable topological order of nodes given as dependency sets."""

from __future__ import annotations

import heapq

__all__ = ["topological_order"]


def topological_order(deps: list[set[int]]) -> tuple[list[int], list[int]]:
    """Kahn's algorithm over nodes ``0..len(deps)-1``, where ``deps[i]`` holds the nodes
    ``i`` reads from; among the nodes ready at once the lowest index goes first, so an
    order that is already topological is kept.

    :return: ``(order, stuck)``: the order, and the nodes left out of it because they
        sit on or after a cycle (empty when there is none).
    """
    dependents: list[list[int]] = [[] for _ in deps]
    indeg = [len(d) for d in deps]
    for i, d in enumerate(deps):
        for j in d:
            dependents[j].append(i)
    ready = [i for i, k in enumerate(indeg) if k == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for j in dependents[i]:
            indeg[j] -= 1
            if indeg[j] == 0:
                heapq.heappush(ready, j)
    return order, [i for i, k in enumerate(indeg) if k > 0]
