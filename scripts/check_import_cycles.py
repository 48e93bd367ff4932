"""Fail on any import cycle between the modules of a package, inside one layer too.

import-linter's contracts (pyproject.toml) hold the order between layers and between the siblings they name, but
none of its contract types forbids a cycle among modules a contract does not name, so this check runs beside it in
`make lint`. Imports under TYPE_CHECKING count: a cycle of types is a cycle in the design."""

from __future__ import annotations

import argparse
import sys

import grimp


def find_cycles(package: str) -> list[tuple[str, ...]]:
    """One shortest cycle per set of modules that import each other round, from its first module back to it."""
    graph = grimp.build_graph(package, cache_dir=None)  # no cache: always the tree as it is now
    seen: set[frozenset[str]] = set()
    cycles: list[tuple[str, ...]] = []
    for importer in sorted(graph.modules):
        for imported in sorted(graph.find_modules_directly_imported_by(importer)):
            back = graph.find_shortest_chain(importer=imported, imported=importer)
            if back is not None and frozenset(back) not in seen:
                seen.add(frozenset(back))
                cycles.append((importer, *back))
    return cycles


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("packages", nargs="*", default=["gpushare"], help="importable packages (default: gpushare)")
    args = parser.parse_args(argv)
    found = [cycle for package in args.packages for cycle in find_cycles(package)]
    for cycle in found:
        print("import cycle: " + " -> ".join(cycle), file=sys.stderr)
    if found:
        print(f"{len(found)} import cycle(s): move what both sides need into a module below them", file=sys.stderr)
        return 1
    print(f"no import cycles in {', '.join(args.packages)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
