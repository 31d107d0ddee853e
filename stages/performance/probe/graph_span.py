"""How many training steps an autograd graph holds, without walking it whole.

A graph's size cannot be counted past a few thousand nodes (frame_index.MAX_WALK_NODES: a
long chain of wrapped nodes overflows the stack when it is freed), so a running total over
a loop whose step builds 10,000 nodes looks like any one step's graph by its size. Its age
tells them apart: autograd numbers its nodes in creation order (`Node._sequence_nr()`), the
step clock notes the newest number at each step boundary, and a best-first descent from the
tensor's `grad_fn` that always expands the oldest node it has reached gets to the oldest
steps in a few nodes per step: `total = total + loss` is one `AddBackward` a step, chained.
The number of distinct steps the descent meets is the measure: one or two for the loss of
the step just taken (its graph, and a tensor made before training that it reads), one more
for every step a held graph keeps.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left
from typing import Any

# AccumulateGrad (a leaf's node) carries the largest sequence number: it was made by no step.
UNNUMBERED = 2**64 - 1
SPAN_BUDGET = 2_000  # nodes one descent expands at most


def sequence_number(node: Any) -> int:
    """The node's creation number, or -1 where this torch does not expose it."""
    try:
        return int(node._sequence_nr())
    except (AttributeError, RuntimeError, TypeError):
        return -1


def step_of(sequence: int, marks: list[int]) -> int:
    """The step (0-based) that made a node: the first whose newest-node mark is at or past
    it; len(marks) for the step in progress."""
    return bisect_left(marks, sequence)


def steps_held(tensor: Any, marks: list[int], budget: int = SPAN_BUDGET) -> int | None:
    """Distinct steps whose nodes the descent from `tensor.grad_fn` reaches within `budget`
    expanded nodes; None when the nodes carry no sequence numbers. `tensor` may be a list of
    tensors (a container's): every root counts its step, then the descent is shared."""
    tensors = tensor if type(tensor) is list else [tensor]
    roots = [root for t in tensors if (root := getattr(t, "grad_fn", None)) is not None]
    if not roots:
        return 0
    numbers = [sequence_number(root) for root in roots]
    if min(numbers) < 0:
        return None
    frontier: list[tuple[int, int, Any]] = [(n, i, root) for i, (n, root) in enumerate(zip(numbers, roots, strict=True))]
    heapq.heapify(frontier)
    # Every node reached stays referenced until the end: an id is only unique while its
    # wrapper lives.
    reached: dict[int, Any] = {id(root): root for root in roots}
    steps: set[int] = {step_of(n, marks) for n in numbers}
    try:
        for _ in range(budget):
            if not frontier:
                break
            sequence, _, node = heapq.heappop(frontier)
            steps.add(step_of(sequence, marks))
            for child, _ in getattr(node, "next_functions", ()):
                if child is None or id(child) in reached:
                    continue
                reached[id(child)] = child
                number = sequence_number(child)
                if 0 <= number < UNNUMBERED:
                    heapq.heappush(frontier, (number, len(reached), child))
        return len(steps)
    finally:
        frontier.clear()
        reached.clear()
