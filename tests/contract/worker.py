"""A gpushare process under an address-space limit, fed one command line per input line (JSON), answering each
with the exit code, the output and the memory peak (JSON). Run by tests/contract; not part of the package.

The heavy libraries gpushare may load (numpy, HiGHS, matplotlib, the Pulumi SDK) are imported first; the limit
(argv[1], bytes) is then set on the whole address space, so a command that tries to build something huge fails
here the way it would take down a CI runner."""

from __future__ import annotations

import contextlib
import io
import json
import os
import resource
import sys
import traceback

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MPLBACKEND", "Agg")
os.environ.setdefault("COLUMNS", "160")

import highspy  # noqa: E402,F401 - reserved before the limit, as in a real run
import matplotlib.pyplot  # noqa: E402,F401
import numpy  # noqa: E402,F401
import pulumi  # noqa: E402,F401

from gpushare.cli import main  # noqa: E402


def _status(field: str) -> int:
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def _clear_caches() -> None:
    """Files change between requests (a mutated guardrails.yaml): drop what gpushare memoises per path."""
    from gpushare.core import guardrails

    guardrails._load.cache_clear()


def serve(limit: int) -> None:
    after_imports = _status("VmSize")
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    reply = sys.__stdout__
    assert reply is not None
    reply.write(json.dumps({"ready": True, "vmsize_after_imports": after_imports, "limit": limit}) + "\n")
    reply.flush()
    for line in sys.stdin:
        request = json.loads(line)
        out, err = io.StringIO(), io.StringIO()
        code: int | str
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                main(request["args"])
                code = 0
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            except BaseException:  # noqa: BLE001 - whatever escapes gpushare's boundary is the finding
                traceback.print_exc()
                code = "escaped"
        _clear_caches()
        reply.write(json.dumps({"code": code, "stdout": out.getvalue()[-500_000:], "stderr": err.getvalue()[-20_000:],
                                "vmpeak": _status("VmPeak")}) + "\n")
        reply.flush()


if __name__ == "__main__":
    serve(int(sys.argv[1]))
