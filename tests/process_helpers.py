"""Processes a test started, found through Linux /proc (shared by test_serve_ray.py and test_signals.py)."""

from __future__ import annotations

import contextlib
from pathlib import Path


def descendants(pid: int) -> set[int]:
    """Every live process below ``pid`` (Linux /proc): a Ray instance's GCS, raylet, workers."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, ValueError, IndexError):
                stat = (entry / "stat").read_text()
                ppid = int(stat.rsplit(")", 1)[1].split()[1])
                children.setdefault(ppid, []).append(int(entry.name))
    found: set[int] = set()
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found
