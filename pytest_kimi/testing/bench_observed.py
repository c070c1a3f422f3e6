"""Run SGLang's benchmark client unmodified, keeping what its ``calculate_metrics`` is given.

Usage (with the peer's interpreter): ``python bench_observed.py OUT.json <bench_serving args>``.

bench_serving's output file has per-request TTFTs and ITLs but not when each request started
or ended (``start_time``, ``latency``), nor the duration it divides by before rounding. A
conformance test needs them to place each of its requests on the server's clock, so this runs
bench_serving's own module source (the peer's installed file, read at run time:
``sglang.benchmark.serving`` from SGLang 0.5.15, where ``sglang.bench_serving`` became a shim
that imports it; ``sglang.bench_serving`` before), with one
change: ``calculate_metrics`` is wrapped so that, before it runs, its inputs are written to
``OUT.json`` with the instant of the call (its duration ends just before). Every figure
bench_serving prints or writes is computed by its own code.

Standard library only: this runs in the peer's venv, which has no pytest-kimi.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import inspect
import json
import sys
import time
import types
from pathlib import Path

MAIN_GUARD = '\nif __name__ == "__main__":'
MODULES = ("sglang.benchmark.serving", "sglang.bench_serving")  # newer first
KEPT = ("start_time", "latency", "ttft", "itl", "success", "output_len", "prompt_len", "error")


def _find() -> importlib.machinery.ModuleSpec:
    """The module that holds the benchmark client's code in this interpreter's SGLang."""
    for name in MODULES:
        try:
            spec = importlib.util.find_spec(name)
        except ModuleNotFoundError:  # its package (sglang.benchmark) is not in this release
            continue
        if spec is not None and spec.origin is not None:
            return spec
    raise SystemExit(f"none of {', '.join(MODULES)} is installed in this interpreter")


def main() -> None:
    out = Path(sys.argv[1])
    spec = _find()
    source = Path(spec.origin).read_text(encoding="utf-8")
    body, guard, entry = source.partition(MAIN_GUARD)
    if not guard:
        raise SystemExit(f"{spec.origin}: no main guard; this bench_serving is not one we know")
    # as ``python -m sglang.bench_serving`` runs it (runpy): a module named __main__, with
    # the module's spec, registered in sys.modules (pickling and lookups find its classes)
    module = types.ModuleType("__main__")
    module.__file__, module.__spec__, module.__loader__ = spec.origin, spec, spec.loader
    module.__package__ = spec.parent
    sys.modules["__main__"] = module
    namespace = module.__dict__
    exec(compile(body, spec.origin, "exec"), namespace)
    calculate = namespace["calculate_metrics"]
    signature = inspect.signature(calculate)

    def observed(*args: object, **kwargs: object) -> object:
        # called right after it reads its duration's end: stamp it (perf_counter, as it)
        called = time.perf_counter()
        given = signature.bind(*args, **kwargs).arguments
        outputs = [{k: getattr(o, k, None) for k in KEPT} for o in given["outputs"]]
        out.write_text(json.dumps({"dur_s": given["dur_s"], "called": called, "outputs": outputs}))
        return calculate(*args, **kwargs)

    namespace["calculate_metrics"] = observed
    sys.argv = [spec.origin, *sys.argv[2:]]
    # the main block as written, indented under a guard that holds, on the same line numbers
    entry_code = "\n" * (body.count("\n") + 1) + "if True:" + entry
    exec(compile(entry_code, spec.origin, "exec"), namespace)


if __name__ == "__main__":
    main()
