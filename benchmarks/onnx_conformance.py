"""ONNX node conformance: every node test that ships with onnx through Tessera's import
and CPU kernels (float path), with passed/total per op.

    python benchmarks/onnx_conformance.py [--op Resize,Pad] [--jobs N] [--json FILE]
                                          [--markdown]

Each test (``onnx/backend/test/data/node/test_*``) runs as
``tests/compiler/cpu/conformance.py`` describes: import, CPU lowering of every node, the
kernels, outputs compared as onnx's backend runner does (rtol 1e-3, atol 1e-7; integers
and booleans exact). Tests run in a process pool (``--jobs``, default the usable cores);
a worker that dies (a kernel's segfault) is found by running what was left one by one,
and its test is reported as a crash.

Prints a table per op (an ``*_expanded`` test counts for the op it expands): whether the
op has a CPU lowering, passed/total, tests that import folded to constants, and the
failures by reason; then the totals and every crash. ``--markdown`` prints the page
docs/operators.md instead (``> docs/operators.md`` regenerates it). Exit status 1 on what
``tests/compiler/cpu/test_onnx_conformance.py`` would fail on: a crash, a claimed test
failing without being listed in its EXCEPTIONS, or a listed one that now passes or fails
for another reason (all printed). Kernels compile into a temporary cache unless
``TESSERA_CACHE`` is set.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections import Counter, defaultdict
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Callable, Iterable

import onnx

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from tessera.compiler.cpu.lower import cpu_supported_ops  # noqa: E402
from tests.compiler.cpu.conformance import (NODE_TEST_DIR, REASONS,  # noqa: E402
                                            NodeTestResult, node_test_names, ops_of_test,
                                            run_node_test)
from tests.compiler.cpu.test_onnx_conformance import EXCEPTIONS, claimed  # noqa: E402


# ----------------------------------------------------------------------- running
def _run(name: str) -> NodeTestResult:
    return run_node_test(NODE_TEST_DIR / name)


def run_tests(names: list[str], jobs: int,
              progress: Callable[[NodeTestResult], None]) -> dict[str, NodeTestResult]:
    """Every test's result. When a worker dies, what is left runs on one worker, in
    order, so the first test left unfinished is the one that killed it."""
    results: dict[str, NodeTestResult] = {}
    todo, serial = list(names), False
    while todo:
        broke = _run_pool(todo, 1 if serial else jobs, results, progress)
        todo = [name for name in todo if name not in results]
        if broke and serial:
            results[todo[0]] = NodeTestResult(
                todo[0], ops_of_test(todo[0]), "failed", "crash",
                "the process running it died (a signal: a kernel's segfault?)")
            progress(results[todo[0]])
            todo, serial = todo[1:], False
        else:
            serial = broke
    return results


def _run_pool(names: list[str], jobs: int, results: dict[str, NodeTestResult],
              progress: Callable[[NodeTestResult], None]) -> bool:
    """Run ``names`` on ``jobs`` workers into ``results``; True if a worker died. Results
    are taken in submission order: on one worker, every test before the one that killed
    it then has its result."""
    try:
        with ProcessPoolExecutor(jobs) as pool:
            futures = [(name, pool.submit(_run, name)) for name in names]
            for name, future in futures:
                results[name] = future.result()
                progress(results[name])
    except BrokenProcessPool:
        return True
    return False


def _progress_printer(total: int) -> Callable[[NodeTestResult], None]:
    start, done = time.monotonic(), [0]

    def show(result: NodeTestResult) -> None:
        done[0] += 1
        if done[0] % 100 == 0 or done[0] == total:
            print(f"  {done[0]}/{total} tests, {time.monotonic() - start:.0f} s",
                  file=sys.stderr, flush=True)
    return show


# ----------------------------------------------------------------------- tables
def by_op(results: Iterable[NodeTestResult]) -> dict[str, list[NodeTestResult]]:
    """Results grouped by the op each test tests, ops sorted by name."""
    groups: dict[str, list[NodeTestResult]] = defaultdict(list)
    for result in results:
        for op in result.ops:
            groups[op].append(result)
    return dict(sorted(groups.items()))


def _failures(results: list[NodeTestResult]) -> str:
    counts = Counter(r.reason for r in results if r.status == "failed")
    return ", ".join(f"{reason} {n}" for reason, n in counts.most_common())


def _count(results: list[NodeTestResult], status: str) -> int:
    return sum(r.status == status for r in results)


def print_table(results: dict[str, NodeTestResult]) -> None:
    supported = cpu_supported_ops("")
    rows = [(op, "yes" if op in supported else "-", f"{_count(rs, 'passed')}/{len(rs)}",
             str(_count(rs, "folded") or ""), _failures(rs))
            for op, rs in by_op(results.values()).items()]
    header = ("op", "CPU kernel", "passed", "folded", "failures by reason")
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(4)]
    for row in [header, *rows]:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths)) + "  " + row[4])


def print_totals(results: dict[str, NodeTestResult]) -> None:
    values = list(results.values())
    claimed_results = [r for r in values if claimed(r.name)]
    print(f"\n{len(values)} node tests: {_count(values, 'passed')} passed, "
          f"{_count(values, 'folded')} folded at import, {_count(values, 'failed')} failed "
          f"({_failures(values)})")
    print(f"claimed (every op of the model has a CPU lowering): "
          f"{_count(claimed_results, 'passed')}/{len(claimed_results)} passed, "
          f"{sum(r.name in EXCEPTIONS for r in claimed_results)} listed exceptions")
    for reason, meaning in REASONS.items():
        print(f"  {reason}: {meaning}")
    crashes = [r for r in values if r.reason == "crash"]
    print(f"\n{len(crashes)} crashes (defects)" + (":" if crashes else ""))
    for r in crashes:
        listed = " (listed)" if r.name in EXCEPTIONS else ""
        print(f"  {r.name}{listed}: {r.detail}")


def regressions(results: dict[str, NodeTestResult]) -> dict[str, list[NodeTestResult]]:
    """What test_onnx_conformance.py would fail on: unlisted crashes, claimed tests that
    fail without being listed, listed tests that pass or fail for another reason."""
    found: dict[str, list[NodeTestResult]] = defaultdict(list)
    for r in results.values():
        listed = EXCEPTIONS.get(r.name)
        if listed is not None and (r.passed or r.reason != listed[0]):
            found[f"STALE EXCEPTION (listed as {listed[0]})"].append(r)
        elif listed is None and r.reason == "crash":
            found["CRASH"].append(r)
        elif listed is None and claimed(r.name) and not r.passed:
            found["UNLISTED FAILURE of a claimed test"].append(r)
    return found


def print_markdown(results: dict[str, NodeTestResult], run: str) -> None:
    """docs/operators.md, whole: how the figures were made, the totals, the supported
    ops, the exceptions (grouped by why) and the ops without a CPU kernel."""
    values = list(results.values())
    claimed_results = [r for r in values if claimed(r.name)]
    print(_PAGE_HEAD.format(
        version=onnx.__version__, tests=len(values), run=run,
        passed=_count(values, "passed"), folded=_count(values, "folded"),
        failed=_count(values, "failed"), failures=_failures(values),
        claimed=len(claimed_results), claimed_passed=_count(claimed_results, "passed"),
        listed=sum(r.name in EXCEPTIONS for r in claimed_results),
        crashes=", ".join(f"`{r.name}`" for r in values if r.reason == "crash") or "none"))
    _print_supported(results)
    _print_exceptions()
    _print_unsupported(results)


def _print_supported(results: dict[str, NodeTestResult]) -> None:
    print("\n## Supported ops\n")
    print("| op | node tests passed | of which `_expanded` | listed exceptions |")
    print("|---|---|---|---|")
    groups = by_op(results.values())
    for op in sorted(cpu_supported_ops("")):
        rs = groups.get(op, [])
        expanded = [r for r in rs if "_expanded" in r.name]
        listed = sum(r.name in EXCEPTIONS for r in rs)
        print(f"| {op} | {_count(rs, 'passed')}/{len(rs)} | "
              f"{_count(expanded, 'passed')}/{len(expanded)} | {listed or ''} |")


def _print_exceptions() -> None:
    print("\n## Exceptions\n")
    print("Claimed node tests that fail, grouped by why (`EXCEPTIONS` in "
          "`tests/compiler/cpu/test_onnx_conformance.py`).\n")
    print("| reason | why | node tests |")
    print("|---|---|---|")
    groups: dict[tuple[str, str], list[str]] = defaultdict(list)
    for name, why in sorted(EXCEPTIONS.items()):
        groups[why].append(name)
    for (reason, why), names in sorted(groups.items()):
        print(f"| {reason} | {why} | {', '.join(f'`{n}`' for n in names)} |")


def _print_unsupported(results: dict[str, NodeTestResult]) -> None:
    supported = cpu_supported_ops("")
    others = {op: rs for op, rs in by_op(results.values()).items() if op not in supported}
    ranked = sorted(others.items(), key=lambda item: (-len(item[1]), item[0]))
    print("\n## Ops without a CPU kernel\n")
    print(f"The suite tests {len(others)} more ops; by number of node tests: "
          + ", ".join(f"{op} {len(rs)}" for op, rs in ranked) + ".")


_PAGE_HEAD = """# Operators: ONNX conformance of the CPU backend

The ops the CPU backend runs, measured against the node tests that ship with onnx
{version} (`onnx/backend/test/data/node/`, {tests} tests: a one-node model, or an
`_expanded` one holding the op's function body, with inputs and expected outputs).
Each runs through the float path a user's model takes to the CPU: `import_onnx`,
`lower_node_to_cpu` for every node, the JIT-compiled kernels; outputs are compared as
onnx's backend runner does (same shape and dtype, rtol 1e-3, atol 1e-7), integers and
booleans exactly. Operands that fix shapes or kernel parameters (pads, axes, scales,
zero points, ...) are given as constants, as a real model carries them, the fewest that
import and lowering take (`tests/compiler/cpu/conformance.py`).

What we claim has one source of truth, the CPU lowering table
(`tessera.compiler.cpu.lower.cpu_supported_ops()`): a node test is claimed when every op
of its model has a CPU lowering. `tests/compiler/cpu/test_onnx_conformance.py` runs every
claimed test (three per op and every listed failure in the default test run, the rest
with `-m slow`): each passes, or is listed below with why it fails (and must keep
failing for that reason until fixed).

Figures: `python benchmarks/onnx_conformance.py --markdown > docs/operators.md`
(run in {run}). Without `--markdown` it prints passed/total and the failure
reasons of every op; `--op NAME` runs one op's tests, `--json FILE` writes every result.

- {tests} node tests: {passed} passed, {folded} folded to constants at import (no
  kernel ran: Shape, Size, Constant), {failed} failed:
  {failures}.
- Claimed: {claimed_passed}/{claimed} passed, {listed} listed exceptions.
- Crashes (an exception that is not a TesseraError): {crashes}."""


# ------------------------------------------------------------------------- main
def _selected(ops: str | None) -> list[str]:
    names = node_test_names()
    if not ops:
        return names
    wanted = {op.strip() for op in ops.split(",")}
    return [name for name in names if wanted & set(ops_of_test(name))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--op", help="only the tests of these ops (comma-separated)")
    parser.add_argument("--jobs", type=int, default=len(os.sched_getaffinity(0)),
                        help="worker processes (default: the usable cores)")
    parser.add_argument("--json", metavar="FILE", help="write every result to FILE")
    parser.add_argument("--markdown", action="store_true",
                        help="print docs/operators.md's tables instead of the report")
    args = parser.parse_args(argv)
    os.environ.setdefault("TESSERA_CACHE", tempfile.mkdtemp(prefix="tessera-conformance-"))
    names = _selected(args.op)
    if not names:
        parser.error(f"no node test tests op(s) {args.op}")
    start = time.monotonic()
    jobs = max(1, args.jobs)
    results = run_tests(names, jobs, _progress_printer(len(names)))
    results = {name: results[name] for name in names}
    run = f"{time.monotonic() - start:.0f} s on {jobs} workers"
    print(f"{len(names)} node tests of onnx in {run}", file=sys.stderr)
    if args.json:
        with open(args.json, "w") as f:
            json.dump([r.to_dict() for r in results.values()], f, indent=1)
    if args.markdown:
        print_markdown(results, run)
    else:
        print_table(results)
        print_totals(results)
    return _report_regressions(results, sys.stderr if args.markdown else sys.stdout)


def _report_regressions(results: dict[str, NodeTestResult], out) -> int:
    """Print what test_onnx_conformance.py would fail on; the exit status."""
    found = regressions(results)
    for kind, rs in found.items():
        for r in rs:
            print(f"{kind} {r.name}: {r.status} {r.reason}: {r.detail}", file=out)
    return 1 if found else 0

if __name__ == "__main__":
    sys.exit(main())
