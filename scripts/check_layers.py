#!/usr/bin/env python3
"""Checks the folder graph of the C++ sources (docs/DESIGN.md, "Layers").

The graph is derived from the ``#include`` lines of csrc/, allocator/, ops/,
include/ and python_bindings/csrc/: a folder depends on another when one of its
files includes a file of the other. It fails (exit 1, naming the files) when

- the graph has a cycle between folders,
- a core folder (csrc/<part>) includes a torch header (ATen, c10, torch, caffe2),
- a core folder includes a folder outside the core (allocator/, ops/, ...),
- a source file in csrc/, ops/, allocator/ or python_bindings/ is longer than
  MAX_LINES lines: past that a reader no longer takes a file in at once, and it
  is split by concern (docs/DESIGN.md, "Layers").

``--print`` lists the graph's edges. ``--root DIR`` checks another tree (the
script's own tests use it). Standard library only: it runs before any build.
"""
import argparse
import os
import re
import sys
from collections import defaultdict
from typing import Dict, List, Optional, Set, Tuple

SOURCE_ROOTS = ("csrc", "allocator", "ops", "include", "python_bindings/csrc")
TORCH_PREFIXES = ("ATen/", "c10/", "torch/", "caffe2/")
EXTENSIONS = (".h", ".hpp", ".cpp", ".cc", ".cu")
# Where a file's length is checked, and which files count as source there.
SIZED_ROOTS = ("csrc", "ops", "allocator", "python_bindings")
SIZED_EXTENSIONS = EXTENSIONS + (".py",)
MAX_LINES = 600
INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]')


def folder_of(path: str) -> Optional[str]:
    """The folder a file (relative to the root) belongs to: csrc/<part> for the
    core, include for the public headers, else the source root itself."""
    parts = path.split("/")
    if parts[0] == "csrc":
        return "/".join(parts[:2]) if len(parts) > 2 else None
    if parts[0] == "include":
        return "include"
    if path.startswith("python_bindings/csrc/"):
        return "python_bindings/csrc"
    if parts[0] in ("allocator", "ops"):
        return parts[0]
    return None


def target_of(spelled: str, angle: bool, root: str) -> Optional[str]:
    """The folder an include names, or None for a header outside the tree."""
    if angle:
        # The public headers are spelled <pins/...> (include/ is on the path).
        return "include" if spelled.startswith("pins/") else None
    if os.path.isfile(os.path.join(root, spelled)):
        return folder_of(spelled)
    return None


def scan(root: str) -> Tuple[Dict[str, Dict[str, List[str]]], List[str]]:
    """The edges (folder -> folder -> the files that make the edge) and the core
    files that include torch."""
    edges: Dict[str, Dict[str, List[str]]] = defaultdict(lambda: defaultdict(list))
    torch_in_core: List[str] = []
    for top in SOURCE_ROOTS:
        base = os.path.join(root, top)
        for dirpath, _, names in os.walk(base):
            for name in sorted(names):
                if not name.endswith(EXTENSIONS):
                    continue
                rel = os.path.relpath(os.path.join(dirpath, name), root).replace(os.sep, "/")
                src = folder_of(rel)
                if src is None:
                    continue
                with open(os.path.join(root, rel), encoding="utf-8", errors="replace") as f:
                    for number, line in enumerate(f, 1):
                        m = INCLUDE.match(line)
                        if not m:
                            continue
                        angle, spelled = m.group(1) == "<", m.group(2)
                        where = f"{rel}:{number} includes {spelled}"
                        if src.startswith("csrc/") and angle and spelled.startswith(TORCH_PREFIXES):
                            torch_in_core.append(where)
                        dst = target_of(spelled, angle, root)
                        if dst is not None and dst != src:
                            edges[src][dst].append(where)
    return edges, torch_in_core


def find_cycle(edges: Dict[str, Dict[str, List[str]]]) -> Optional[List[str]]:
    """One cycle of the graph as a list of folders (first == last), or None."""
    state: Dict[str, int] = {}  # 1: on the stack, 2: done
    stack: List[str] = []

    def visit(node: str) -> Optional[List[str]]:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges.get(node, {})):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(edges):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def long_files(root: str, limit: int = MAX_LINES) -> List[Tuple[str, int]]:
    """The source files under SIZED_ROOTS with more than `limit` lines, and their
    line counts."""
    found: List[Tuple[str, int]] = []
    for top in SIZED_ROOTS:
        for dirpath, dirnames, names in os.walk(os.path.join(root, top)):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and d != "__pycache__")
            for name in sorted(names):
                if not name.endswith(SIZED_EXTENSIONS):
                    continue
                path = os.path.join(dirpath, name)
                with open(path, encoding="utf-8", errors="replace") as f:
                    lines = sum(1 for _ in f)
                if lines > limit:
                    found.append((os.path.relpath(path, root).replace(os.sep, "/"), lines))
    return found


def check(root: str, show: bool = False) -> List[str]:
    """The problems of the tree at `root`, each a line; empty when it is sound."""
    edges, torch_in_core = scan(root)
    if show:
        for src in sorted(edges):
            print(f"{src} -> {', '.join(sorted(edges[src]))}")
    problems = [f"core folder includes torch: {w}" for w in torch_in_core]
    for src in sorted(edges):
        if not src.startswith("csrc/"):
            continue
        for dst in sorted(edges[src]):
            if not dst.startswith("csrc/"):
                problems.append(f"core folder {src} includes {dst}: {edges[src][dst][0]}")
    cycle = find_cycle(edges)
    if cycle:
        steps = [f"{a} -> {b} ({edges[a][b][0]})" for a, b in zip(cycle, cycle[1:])]
        problems.append("folder cycle: " + "; ".join(steps))
    for path, lines in long_files(root):
        problems.append(f"{path} has {lines} lines, over {MAX_LINES}: split it by concern")
    return problems


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                    help="the tree to check (default: this checkout)")
    ap.add_argument("--print", dest="show", action="store_true", help="list the folder graph")
    args = ap.parse_args(argv)
    problems = check(args.root, args.show)
    for p in problems:
        print(f"check_layers: {p}", file=sys.stderr)
    if not problems:
        print(f"check_layers: no folder cycle, no torch header in the core, no source file over {MAX_LINES} lines")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
