"""What installing pytest-kimi costs a pytest run that does not use it.

Runs a one-test unrelated suite (in a temporary folder outside any project) in fresh
interpreters, alternating with and without ``-p no:kimi`` so drift hits both sides alike, and
reports the median of the per-pair wall-time ratios and peak memory. A ratio, from one run, on
one machine: the figure to quote is "within N %", not seconds.

    python benchmarks/plugin_overhead.py [--pairs 9]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHILD = (
    "import resource, sys, pytest\n"
    "code = pytest.main(sys.argv[1:])\n"
    "print('MAXRSS_KIB', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)\n"
    "sys.exit(code)\n"
)


def one_run(folder: Path, *extra: str) -> tuple[float, int]:
    """Wall seconds and peak RSS (KiB) of ``pytest -q`` in a fresh interpreter."""
    argv = [sys.executable, "-c", CHILD, "-q", "-p", "no:cacheprovider", *extra]
    began = time.perf_counter()
    done = subprocess.run(argv, cwd=folder, capture_output=True, text=True, timeout=120)
    wall = time.perf_counter() - began
    if done.returncode != 0:
        raise SystemExit(f"pytest failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    rss = int(done.stdout.rsplit("MAXRSS_KIB", 1)[1].split()[0])
    return wall, rss


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=9, help="with/without pairs (default 9)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="kimi-overhead-") as tmp:
        folder = Path(tmp)
        (folder / "test_plain.py").write_text("def test_one():\n    assert 1 + 1 == 2\n")
        one_run(folder)  # warm the file cache for both sides
        one_run(folder, "-p", "no:kimi")
        ratios, with_rss, without_rss, with_s, without_s = [], [], [], [], []
        for n in range(args.pairs):
            order = [(), ("-p", "no:kimi")] if n % 2 == 0 else [("-p", "no:kimi"), ()]
            timed = {extra: one_run(folder, *extra) for extra in order}
            (w, w_rss), (o, o_rss) = timed[()], timed[("-p", "no:kimi")]
            ratios.append(w / o)
            with_s.append(w)
            without_s.append(o)
            with_rss.append(w_rss)
            without_rss.append(o_rss)
    print(f"pairs: {args.pairs}")
    print(f"median wall, plugin loaded:  {statistics.median(with_s) * 1000:.0f} ms")
    print(f"median wall, -p no:kimi:     {statistics.median(without_s) * 1000:.0f} ms")
    print(f"median ratio (loaded / not): {statistics.median(ratios):.3f}")
    extra_mib = (statistics.median(with_rss) - statistics.median(without_rss)) / 1024
    print(f"peak RSS difference:         {extra_mib:+.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
