"""How many concurrent streams one mock SGLang server process serves on time.

Usage (from the repository root)::

    python benchmarks/mock_capacity.py [--quick] [--json out.json] [--py-spy DIR]

For each N in a rising sequence this starts a fresh mock server (one process, TP32, its own
process group), sends exactly N streaming ``/generate`` requests at once (concurrency N, short
prompts, a decode-dominated workload) with this project's client
(:func:`pytest_kimi.workload.client.run_requests`, in this process), then reads the server's
``GET /kimi/ground_truth``:

* ``lateness_ms``: how late (wall ms) the mock's scheduler ran each event after its deadline,
  i.e. the mock's own timing error;
* every request's model-side token times (cluster seconds; divided by the time scale for wall).

The capacity is the largest N (with every smaller N passing too) whose lateness p99 is at most
1 ms and whose requests all succeeded. The goal is N >= 256.

Caveats printed with the results: the client runs on the same 2 cores as the server, so it
competes with it for CPU; a client that falls behind shows up as client-side TPOT error and
delivery delay larger than the server's lateness, and is reported as such. Wall-clock figures
depend on the machine and on whatever else runs on it (the load average is recorded per run).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import datetime
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx

from pytest_kimi.deploy.ports import free_port
from pytest_kimi.deploy.procgroup import sigterm_as_interrupt
from pytest_kimi.mock.tokenizer_files import vocabulary
from pytest_kimi.results.records import RequestRecord
from pytest_kimi.testing.processes import Proc, mock_argv
from pytest_kimi.workload.client import ClientOptions, RequestSpec, run_requests

FULL_NS = (8, 16, 32, 64, 128, 256, 384, 512)
QUICK_NS = (8, 64)
GOAL_N = 256
LATENESS_LIMIT_MS = 1.0
TIME_SCALE = 20.0  # TP32 decode step 57-202 ms cluster -> 2.8-10 ms wall
OUTPUT_TOKENS = 256
PROMPT_WORDS = 64
TP_SIZE = 32
GPUS_PER_NODE = 8  # TP32 spans 4 nodes, as in clusters/local.yaml: inter-node all-reduces
CLIENT_TIMEOUT_S = 300.0


@dataclass
class Row:
    """One N: the server's timing error and what the client saw."""

    n: int
    ok: int
    steps: int
    late_count: int
    late_mean_ms: float
    late_p99_ms: float
    late_max_ms: float
    decode_step_ms: float  # median model interval between a request's tokens, wall ms
    model_tpot_ms: float  # mean over requests, from ground truth, wall ms
    client_tpot_ms: float  # mean over requests, from the client's chunk times, wall ms
    tpot_err_pct: float
    delivery_mean_ms: float  # client arrival - model deadline, relative to the fastest chunk
    delivery_p99_ms: float
    server_cpu_pct: float  # of one CPU, over the client's run
    client_cpu_pct: float
    server_us_per_token: float  # CPU per streamed token (one SSE chunk each)
    client_us_per_token: float
    wall_s: float
    load_avg_before: float

    def passed(self, limit_ms: float = LATENESS_LIMIT_MS) -> bool:
        return self.ok == self.n and self.late_p99_ms <= limit_ms

    @property
    def limit(self) -> str:
        """Who missed: the server's scheduler, the client, or neither."""
        if self.ok < self.n:
            return "failures"
        client_err_ms = abs(self.client_tpot_ms - self.model_tpot_ms)
        if self.late_p99_ms <= LATENESS_LIMIT_MS:
            return "client" if client_err_ms > LATENESS_LIMIT_MS else "ok"
        if abs(self.tpot_err_pct) < 1.0:
            return "server late"  # late wake-ups or bursts, but it keeps pace on average
        return "server behind"  # its per-step work exceeds the step: tokens come out slower


# -- server process ------------------------------------------------------------------------


class MockServer(Proc):
    """One mock server in its own process group; :meth:`stop` ends the whole group (TERM,
    KILL after 10 s) and fails if any of it is left."""

    def __init__(self, n: int, time_scale: float, log_path: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        flags = [
            "--tp-size", str(TP_SIZE), "--mock-gpus-per-node", str(GPUS_PER_NODE),
            "--chunked-prefill-size", "8192", "--disable-radix-cache",
            "--max-running-requests", str(max(n, 1)),
            "--mock-time-scale", f"{time_scale:g}",
        ]  # fmt: skip
        super().__init__(mock_argv(self.port, *flags), log_path)

    def wait_ready(self, timeout_s: float = 30.0) -> None:
        self.wait_http(self.url + "/health", timeout_s)

    def cpu_seconds(self) -> float:
        """User + system CPU time of the server process, from /proc."""
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# -- one measurement -----------------------------------------------------------------------


def _specs(n: int, prompt_words: int) -> list[RequestSpec]:
    vocab = vocabulary()
    specs = []
    for i in range(n):
        words = [vocab[(i * 131 + 7 * j) % len(vocab)] for j in range(prompt_words)]
        specs.append(RequestSpec(f"cap{i}", " ".join(words), prompt_words))
    return specs


def _percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank on the sorted values, as the server computes its lateness p99."""
    ordered = sorted(values)
    return ordered[int(q * (len(ordered) - 1))] if ordered else 0.0


def _client_tpot_ms(record: RequestRecord) -> float | None:
    if record.first_token_time is None or not record.chunks or record.output_tokens < 2:
        return None
    return (record.chunks[-1].time - record.first_token_time) * 1000 / (record.output_tokens - 1)


def _analyse(
    n: int,
    records: list[RequestRecord],
    truth: dict[str, Any],
    cpu: tuple[float, float],
    wall_s: float,
    load: float,
) -> Row:
    scale = float(truth["time_scale"])
    by_rid = {r["rid"]: r for r in truth["requests"]}
    ok = [r for r in records if r.success and r.request_id in by_rid]
    model_tpot, client_tpot, intervals, offsets = [], [], [], []
    for record in ok:
        times = by_rid[record.request_id]["token_times"]
        if len(times) >= 2:
            model_tpot.append((times[-1] - times[0]) * 1000 / scale / (len(times) - 1))
            intervals.extend(b - a for a, b in itertools.pairwise(times))
        tpot = _client_tpot_ms(record)
        if tpot is not None:
            client_tpot.append(tpot)
        seen = 0
        for chunk in record.chunks:  # chunk k carries token(s) up to cumulative count `seen`
            seen += chunk.tokens
            if seen <= len(times):
                offsets.append(chunk.time - times[seen - 1] / scale)
    base = min(offsets) if offsets else 0.0
    delivery = [(o - base) * 1000 for o in offsets]
    late = truth["lateness_ms"]
    tokens = sum(r.output_tokens for r in records if r.success)
    model_mean = statistics.fmean(model_tpot) if model_tpot else 0.0
    client_mean = statistics.fmean(client_tpot) if client_tpot else 0.0
    return Row(
        n=n,
        ok=len(ok),
        steps=int(truth["steps"]),
        late_count=int(late["count"]),
        late_mean_ms=float(late["mean"]),
        late_p99_ms=float(late["p99"]),
        late_max_ms=float(late["max"]),
        decode_step_ms=statistics.median(intervals) * 1000 / scale if intervals else 0.0,
        model_tpot_ms=model_mean,
        client_tpot_ms=client_mean,
        tpot_err_pct=100 * (client_mean - model_mean) / model_mean if model_mean else 0.0,
        delivery_mean_ms=statistics.fmean(delivery) if delivery else 0.0,
        delivery_p99_ms=_percentile(delivery, 0.99),
        server_cpu_pct=100 * cpu[0] / wall_s,
        client_cpu_pct=100 * cpu[1] / wall_s,
        server_us_per_token=1e6 * cpu[0] / tokens if tokens else 0.0,
        client_us_per_token=1e6 * cpu[1] / tokens if tokens else 0.0,
        wall_s=wall_s,
        load_avg_before=load,
    )


def _py_spy(pid: int, out: Path) -> subprocess.Popen[bytes] | None:
    """Sample the server with py-spy (collapsed stacks); it stops when the server exits."""
    argv = [
        "py-spy", "record", "--pid", str(pid), "--format", "raw", "--nolineno",
        "--nonblocking", "--rate", "200", "--output", str(out),
    ]  # fmt: skip
    try:
        return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    except FileNotFoundError:
        print("py-spy not found (pip install py-spy); not profiling", file=sys.stderr)
        return None


def measure(n: int, args: argparse.Namespace, log_dir: Path, profile_to: Path | None = None) -> Row:
    """Fresh server, N streams at once, ground truth; the server is stopped in any case."""
    load = os.getloadavg()[0]
    server = MockServer(n, args.time_scale, log_dir / f"mock-n{n}.log")
    spy: subprocess.Popen[bytes] | None = None
    try:
        server.wait_ready()
        if profile_to is not None:
            spy = _py_spy(server.pid, profile_to)
            time.sleep(0.5)  # let py-spy attach before the load starts
        options = ClientOptions(
            api="generate",
            output_len=args.output_len,
            concurrency=n,
            timeout_s=CLIENT_TIMEOUT_S,
        )
        specs = _specs(n, args.prompt_words)
        server_cpu0, client_cpu0, t0 = server.cpu_seconds(), time.process_time(), time.monotonic()
        records = asyncio.run(run_requests(server.url, specs, options))
        wall_s = time.monotonic() - t0
        cpu = (server.cpu_seconds() - server_cpu0, time.process_time() - client_cpu0)
        response = httpx.get(server.url + "/kimi/ground_truth", timeout=120.0, trust_env=False)
        response.raise_for_status()
        truth = response.json()
        if "lateness_ms" not in truth or "steps" not in truth:
            raise RuntimeError("/kimi/ground_truth has no lateness_ms/steps: mock too old")
        failed = [r.error for r in records if not r.success]
        if failed:
            print(f"  N={n}: {len(failed)} request(s) failed, e.g. {failed[0]}", file=sys.stderr)
        return _analyse(n, records, truth, cpu, wall_s, load)
    finally:
        server.stop()
        if spy is not None:
            try:
                spy.wait(30)
            except subprocess.TimeoutExpired:
                spy.kill()
                spy.wait()


# -- report --------------------------------------------------------------------------------

HEADER = (
    "| N | ok | steps | lateness mean / p99 / max (ms) | decode step (ms) | model TPOT (ms) "
    "| client TPOT (ms) | error | delivery mean / p99 (ms) | CPU server / client "
    "| CPU us/token server / client | limit |"
)


def table(rows: Sequence[Row]) -> str:
    lines = [HEADER, "|" + "---:|" * 11 + "---|"]
    for r in rows:
        lines.append(
            f"| {r.n} | {r.ok} | {r.steps} "
            f"| {r.late_mean_ms:.3f} / {r.late_p99_ms:.3f} / {r.late_max_ms:.2f} "
            f"| {r.decode_step_ms:.2f} | {r.model_tpot_ms:.3f} | {r.client_tpot_ms:.3f} "
            f"| {r.tpot_err_pct:+.2f}% | {r.delivery_mean_ms:.2f} / {r.delivery_p99_ms:.2f} "
            f"| {r.server_cpu_pct:.0f}% / {r.client_cpu_pct:.0f}% "
            f"| {r.server_us_per_token:.0f} / {r.client_us_per_token:.0f} | {r.limit} |"
        )
    return "\n".join(lines)


def capacity(rows: Sequence[Row], limit_ms: float = LATENESS_LIMIT_MS) -> int:
    """Largest N such that it and every smaller N measured passed (0: none did)."""
    best = 0
    for r in sorted(rows, key=lambda r: r.n):
        if not r.passed(limit_ms):
            break
        best = r.n
    return best


def _spin(seconds: float, out: Any) -> None:
    end, count = time.monotonic() + seconds, 0
    while time.monotonic() < end:
        count += 1
    out.put(count)


def cpu_parallelism(seconds: float = 0.5) -> float:
    """Throughput of two busy processes together, relative to one alone (2.0: two free CPUs)."""
    import multiprocessing

    def run(k: int) -> int:
        queue: Any = multiprocessing.Queue()
        procs = [multiprocessing.Process(target=_spin, args=(seconds, queue)) for _ in range(k)]
        for proc in procs:
            proc.start()
        counts = [queue.get() for _ in procs]
        for proc in procs:
            proc.join()
        return sum(counts)

    one = run(1)
    return run(2) / one if one else 0.0


def summarise_profile(path: Path, top: int = 12) -> str:
    """Self and inclusive time per function from py-spy's collapsed stacks."""
    own: collections.Counter[str] = collections.Counter()
    incl: collections.Counter[str] = collections.Counter()
    total = 0
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = stack.split(";")
        samples = int(count)
        total += samples
        own[frames[-1]] += samples
        for frame in set(frames):
            incl[frame] += samples
    if not total:
        return "(no samples)"
    out = [f"{total} busy samples; self time:"]
    out += [f"  {100 * c / total:5.1f}%  {f}" for f, c in own.most_common(top)]
    out.append("inclusive time:")
    out += [f"  {100 * c / total:5.1f}%  {f}" for f, c in incl.most_common(top + 8)]
    return "\n".join(out)


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    add = p.add_argument
    add("--quick", action="store_true", help=f"N in {QUICK_NS} only (< 60 s)")
    add("--ns", type=_ints, default=None, help="comma-separated N values (default: 8..512)")
    add("--time-scale", type=float, default=TIME_SCALE, help="cluster s per wall s")
    add("--output-len", type=int, default=OUTPUT_TOKENS, help="output tokens per request")
    add("--prompt-words", type=int, default=PROMPT_WORDS, help="prompt length in words")
    add("--json", type=Path, default=None, help="write the rows and the verdict here")
    add("--py-spy", type=Path, default=None, metavar="DIR", help="profile the largest N")
    add("--log-dir", type=Path, default=None, help="keep the server logs here")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    # SIGTERM unwinds like Ctrl-C, so the `finally` that stops the server still runs
    with sigterm_as_interrupt():
        return _main(args)


def _main(args: argparse.Namespace) -> int:
    ns = sorted(args.ns or (QUICK_NS if args.quick else FULL_NS))
    parallel = cpu_parallelism()
    print(
        f"mock capacity: TP{TP_SIZE} ({GPUS_PER_NODE} GPUs/node), "
        f"time scale 1:{args.time_scale:g}, {args.prompt_words}-word prompts, "
        f"{args.output_len} output tokens, N requests at once (concurrency N)\n"
        f"{os.cpu_count()} CPUs, shared by the server and the client (this process); two busy "
        f"processes get {parallel:.2f}x the throughput of one"
    )
    rows: list[Row] = []
    profile_path: Path | None = None
    with tempfile.TemporaryDirectory(prefix="mock-capacity-") as tmp:
        log_dir = args.log_dir or Path(tmp)
        log_dir.mkdir(parents=True, exist_ok=True)
        for n in ns:
            profile = None
            if args.py_spy is not None and n == ns[-1]:
                args.py_spy.mkdir(parents=True, exist_ok=True)
                profile = profile_path = args.py_spy / f"server-n{n}.txt"
            row = measure(n, args, log_dir, profile)
            rows.append(row)
            print(
                f"  N={n:4d}: lateness p99 {row.late_p99_ms:.3f} ms, client TPOT error "
                f"{row.tpot_err_pct:+.2f}%, {row.wall_s:.1f} s, load {row.load_avg_before:.2f}",
                flush=True,
            )
    cap = capacity(rows)
    steps = [r.decode_step_ms for r in rows]
    verdict = "MET" if cap >= GOAL_N else "NOT MET"
    if cap < GOAL_N and not any(r.n >= GOAL_N for r in rows):
        verdict = f"not measured (largest N run: {ns[-1]})"
    print()
    print(table(rows))
    loads = ", ".join(f"{r.load_avg_before:.2f}" for r in rows)
    print(f"\n1-min load average before each N (other processes share the CPUs): {loads}")
    print(
        f"decode step wall time used: {min(steps):.2f}-{max(steps):.2f} ms "
        f"(time scale 1:{args.time_scale:g}; the model's step grows with the batch)"
    )
    print(f"capacity: {cap} concurrent streams with lateness p99 <= {LATENESS_LIMIT_MS:g} ms")
    print(f"goal (>= {GOAL_N} streams): {verdict}")
    for looser in (2.0, 5.0):
        print(f"  (for reference, not the goal: lateness p99 <= {looser:g} ms -> "
              f"{capacity(rows, looser)} streams)")  # fmt: skip
    beyond = [r.n for r in rows if r.passed() and r.n > cap]
    if beyond:
        print(f"note: N={beyond} passed too, above a failing smaller N (noisy machine?)")
    client = [r.n for r in rows if r.limit == "client"]
    if client:
        print(
            f"client-limited at N={client}: the server's lateness is within "
            f"{LATENESS_LIMIT_MS:g} ms but the client's TPOT is off by more"
        )
    print(
        "note: the client runs in this process on the same CPUs as the server and competes with "
        "it for CPU (see the CPU columns)"
    )
    if profile_path is not None and profile_path.exists():
        print(f"\npy-spy profile of the server at N={ns[-1]} ({profile_path}):")
        print(summarise_profile(profile_path))
    if args.json is not None:
        report = {
            "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
            "cpus": os.cpu_count(),
            "two_process_throughput": parallel,
            "time_scale": args.time_scale,
            "tp_size": TP_SIZE,
            "gpus_per_node": GPUS_PER_NODE,
            "output_len": args.output_len,
            "prompt_words": args.prompt_words,
            "lateness_limit_ms": LATENESS_LIMIT_MS,
            "rows": [{**asdict(r), "passed": r.passed(), "limit": r.limit} for r in rows],
            "capacity": cap,
            "goal": GOAL_N,
            "goal_met": cap >= GOAL_N,
        }
        args.json.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM: the server was stopped on the way
        print(f"interrupted ({exc or 'SIGINT'})", file=sys.stderr)
        sys.exit(130)
