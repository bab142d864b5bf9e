"""Crop-window merging in near-linear time in the number of holes.

:func:`gantool.inference.inpainter.crop_windows` grows each hole's box to a window of at
least the train size and merges windows while any two overlap. Comparing every pair
until nothing changes costs about n^3 for n holes (19 s for 1,331 holes); here each
window is registered in the cells of a grid as coarse as the smallest window, so only
windows that share a cell are compared, and union-find keeps the groups. A pass that
merges nothing proves that no two windows overlap (two that overlap share a cell).
"""

from __future__ import annotations

from collections.abc import Sequence

Box = tuple[int, int, int, int]  # top, left, bottom, right (exclusive)


def _overlap(a: Box, b: Box) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def _union(a: Box, b: Box) -> Box:
    return min(a[0], b[0]), min(a[1], b[1]), max(a[2], b[2]), max(a[3], b[3])


def _merge_pass(boxes: Sequence[Box], cell: int) -> list[Box]:
    parent = list(range(len(boxes)))
    extent = list(boxes)

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    grid: dict[tuple[int, int], list[int]] = {}
    for index, box in enumerate(boxes):
        for row in range(box[0] // cell, (box[2] - 1) // cell + 1):
            for col in range(box[1] // cell, (box[3] - 1) // cell + 1):
                members = grid.setdefault((row, col), [])
                # The cell keeps pairwise disjoint groups (few: each is at least a cell
                # wide and high), so one box is compared with a handful, not with all.
                root = find(index)
                changed = True
                while changed:
                    changed = False
                    kept = []
                    for other in {find(m) for m in members}:
                        if other != root and _overlap(extent[other], extent[root]):
                            parent[other] = root
                            extent[root] = _union(extent[root], extent[other])
                            changed = True
                        elif other != root:
                            kept.append(other)
                    members[:] = kept
                members.append(root)
    return [extent[i] for i in range(len(boxes)) if find(i) == i]


def merge_overlapping(boxes: Sequence[Box], cell: int) -> list[Box]:
    """``boxes`` merged (bounding box of each group) until no two overlap; sorted.

    ``cell``: at most the smallest box's height and width (keeps each grid cell's
    disjoint groups few); any positive value gives the same result, only slower.
    """
    current = sorted(set(boxes))
    cell = max(1, cell)
    while True:
        merged = _merge_pass(current, cell)
        if len(merged) == len(current):
            return sorted(merged)
        current = merged
