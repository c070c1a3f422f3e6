"""Run-wide state and the work of one layout: bring-up, measured run, teardown, results.

The pytest glue (:mod:`pytest_kimi.plugin`) only decides *when*; this module does the work,
so the same steps can run outside pytest. Everything a run produces lands in the result
directory as soon as it exists: a failed run still leaves its logs, records and a report
saying why.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import shlex
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from pytest_kimi import baseline as baseline_mod
from pytest_kimi import slo as slo_mod
from pytest_kimi.config import ClusterConfig, ConfigError, Layout, load_cluster
from pytest_kimi.deploy.deployment import Deployment
from pytest_kimi.deploy.envinfo import node_environment
from pytest_kimi.deploy.executor import Executor, LocalExecutor
from pytest_kimi.deploy.plan import (
    MOCK_MODULE,
    DeploymentPlan,
    plan_deployment,
    resolve_model_path,
)
from pytest_kimi.deploy.ssh import SSHExecutor
from pytest_kimi.metrics import per_request_ms, summarize
from pytest_kimi.mock.perfmodel import Profile
from pytest_kimi.report.comparison import (
    LayoutResult,
    build_comparison,
    incomplete_reasons,
    render_markdown,
)
from pytest_kimi.report.dataquality import notes as quality_notes
from pytest_kimi.report.dataquality import replica_split, scan_logs
from pytest_kimi.report.html import render_html
from pytest_kimi.report.resultdir import (
    client_environment,
    make_run_dir,
    new_run_id,
    write_json,
    write_text,
)
from pytest_kimi.report.routermetrics import counters as router_counters
from pytest_kimi.report.routermetrics import notes as router_notes
from pytest_kimi.report.saved import load_layout
from pytest_kimi.workload.client import (
    ClientOptions,
    RequestSpec,
    close_unfinished,
    run_requests,
)
from pytest_kimi.workload.dataset import DatasetError, Workload, load_workload, resolve_dataset
from pytest_kimi.workload.records import RecordJournal, RequestRecord, write_records

BASELINE_METRICS = (
    "ttft_mean", "ttft_median", "ttft_p95", "ttft_p99",
    "tpot_mean", "tpot_median", "tpot_p95", "tpot_p99",
    "e2e_mean", "e2e_median", "e2e_p95", "e2e_p99",
    "input_throughput", "output_throughput", "total_throughput", "request_throughput",
    "success_rate", "goodput",
)  # fmt: skip


class UsageProblem(ValueError):
    """Bad input found before anything started: shown as pytest's usage error."""


@dataclass(frozen=True)
class Options:
    """The ``--layout`` / ``--cluster`` / ``--kimi-*`` options, resolved."""

    cluster_path: Path
    layouts: tuple[str, ...]  # empty: every layout of the cluster
    report_dir: Path
    slo_overrides: tuple[str, ...] = ()
    endpoint: str | None = None
    save_baseline: Path | None = None
    baseline: Path | None = None
    fail_thresholds: str = ""


@dataclass
class KimiSession:
    """Validated inputs plus the results gathered so far."""

    options: Options
    cluster: ClusterConfig
    layouts: tuple[Layout, ...]
    slos: dict[str, dict[str, slo_mod.Slo]]  # layout name -> SLO name -> SLO
    workload: Workload | None  # None only for a dry run
    say: Callable[[str], None] = print
    thresholds: dict[str, float] = field(default_factory=dict)  # regression gate, per metric
    baseline: dict | None = None
    results: dict[str, LayoutResult] = field(default_factory=dict)
    stopped_early: str = ""  # why the session stopped before every test ran (Ctrl-C, -x)
    selected: frozenset[str] | None = None  # layouts with tests selected (-k may drop some)
    _run_dir: Path | None = None
    _plans: dict[str, DeploymentPlan] = field(default_factory=dict)  # what each layout runs

    # -- inputs ----------------------------------------------------------------------------
    @classmethod
    def load(
        cls, options: Options, say: Callable[[str], None] = print, dry_run: bool = False
    ) -> KimiSession:
        """Validate everything up front; problems raise :class:`UsageProblem`.

        A dry run reads no dataset: it prints commands for a cluster whose data may only
        exist there."""
        try:
            cluster = load_cluster(options.cluster_path)
            names = options.layouts or tuple(cluster.layouts)
            layouts = tuple(cluster.layout(name) for name in names)
            if cluster.mock is not None:
                _check_profile(cluster)
            slos = _layout_slos(cluster, layouts, options.slo_overrides)
            wl = cluster.workload
            for key, value in wl.goodput.items():
                slo_mod.parse_duration_ms(value, f"{cluster.path} workload.goodput.{key}")
            workload = None
            if not dry_run:
                workload = load_workload(
                    resolve_dataset(wl.dataset, cluster.path.parent),
                    num_requests=wl.num_requests + wl.warmup_requests,
                    seed=wl.seed,
                    category=wl.category,
                )
            thresholds = {
                **baseline_mod.DEFAULT_THRESHOLDS,
                **baseline_mod.parse_thresholds(
                    ",".join(f"{k}:{v}" for k, v in cluster.regression.items()),
                    f"{cluster.path} regression",
                ),
                **baseline_mod.parse_thresholds(options.fail_thresholds, "--kimi-fail"),
            }
            baseline = baseline_mod.load(options.baseline) if options.baseline else None
        except (ConfigError, DatasetError, slo_mod.SloError, baseline_mod.BaselineError) as exc:
            raise UsageProblem(str(exc)) from None
        if options.endpoint and len(layouts) != 1:
            raise UsageProblem(
                "--kimi-endpoint attaches to one running deployment: pass one --layout"
            )
        return cls(options, cluster, layouts, slos, workload, say, thresholds, baseline)

    @property
    def goodput_limits_ms(self) -> dict[str, float]:
        source = f"{self.cluster.path} workload.goodput"
        return {
            k: slo_mod.parse_duration_ms(v, f"{source}.{k}")
            for k, v in self.cluster.workload.goodput.items()
        }

    @property
    def backend(self) -> str:
        if self.options.endpoint:
            return "attached"
        return "mock" if self.cluster.server.module == MOCK_MODULE else "sglang"

    @property
    def time_scale(self) -> float:
        return self.cluster.time_scale if self.backend == "mock" else 1.0

    @property
    def run_dir(self) -> Path:
        if self._run_dir is None:
            run_id = new_run_id(self.cluster.name, self.cluster.replicas)
            self._run_dir = make_run_dir(self.options.report_dir, run_id)
        return self._run_dir

    def use_run_dir(self, path: Path) -> None:
        """Write into a folder someone else made (the xdist controller, for its workers)."""
        path.mkdir(parents=True, exist_ok=True)
        self._run_dir = path

    def load_results_from_disk(self) -> None:
        """Results measured by other processes (xdist workers), read back from the run folder."""
        if self._run_dir is None:
            return
        for layout in self.layouts:
            folder = self._run_dir / layout.name
            if (folder / "summary.json").exists():
                self.results[layout.name], _ = load_layout(folder)

    def layout_dir(self, layout: Layout) -> Path:
        path = self.run_dir / layout.name
        (path / "logs").mkdir(parents=True, exist_ok=True)
        return path

    def plan(self, layout: Layout) -> DeploymentPlan:
        return plan_deployment(self.cluster, layout)

    # -- one layout --------------------------------------------------------------------------
    @contextlib.contextmanager
    def deployment(self, layout: Layout) -> Iterator[str]:
        """Bring the layout up (unless attached), yield the router URL, always tear down."""
        out = self.layout_dir(layout)
        result = self.results.setdefault(layout.name, LayoutResult(layout.name, layout.label))
        result.result_dir = str(out)
        if self.options.endpoint:
            self._write_manifest(layout, None)
            yield self.options.endpoint
            return
        plan = self._plans[layout.name] = self.plan(layout)
        self._write_manifest(layout, plan)
        executor = self._executor(layout)
        dep = Deployment(
            plan,
            executor,
            out / "logs",
            timeout_s=self.cluster.startup_timeout_s,
            progress=lambda m: self.say(f"[kimi {layout.name}] {m}"),
        )
        with _sigterm_as_interrupt(), self._teardown(dep, layout, result):
            self.say(f"[kimi {layout.name}] bringing up {layout.label} x{self.cluster.replicas}")
            dep.start()
            self._write_manifest(layout, plan, self._node_environments(executor, plan))
            result.notes.extend(self._router_model_notes(executor, plan))
            self._warm_replicas(plan)
            yield plan.endpoint

    def _executor(self, layout: Layout) -> Executor:
        if self.cluster.executor == "ssh":
            return SSHExecutor(self.cluster.work_dir, f"{self.run_dir.name}/{layout.name}")
        return LocalExecutor()

    def _node_environments(self, executor: Executor, plan: DeploymentPlan) -> list[dict]:
        """Per node: hostname, Python, SGLang, GPUs, driver, the variables we set."""
        seen: dict[str, dict] = {}
        for spec in plan.processes:
            if spec.node.name in seen:
                continue
            cfg = self.cluster.router if spec.role == "router" else self.cluster.server
            python = (*cfg.wrapper, cfg.python)
            seen[spec.node.name] = node_environment(executor, spec.node, python, spec.env)
        return list(seen.values())

    def _router_model_notes(self, executor: Executor, plan: DeploymentPlan) -> list[str]:
        """The router loads each worker's tokenizer from its model path: is it there?"""
        path = self.cluster.router.model_mount or resolve_model_path(self.cluster.server.model_path)
        code, _ = executor.run(plan.router.node, f"test -d {shlex.quote(path)}", 30)
        if code == 0:
            return []
        return [
            f"router host {plan.router.node.name} has no {path}: the router cannot load the "
            "workers' tokenizer (harmless for round_robin); mount the model read-only there"
        ]

    @contextlib.contextmanager
    def _teardown(self, dep: Deployment, layout: Layout, result: LayoutResult) -> Iterator[None]:
        """Whatever happens inside: record why it failed, stop everything, write the summary.
        A Ctrl-C held during a clean teardown is delivered once everything is stopped."""
        failing = False
        try:
            yield
        except BaseException as exc:
            failing = True
            if not result.error:
                result.error = f"{type(exc).__name__}: {exc}"
            raise
        finally:
            leftovers = dep.stop()
            self.say(f"[kimi {layout.name}] torn down; logs in {dep.log_dir}")
            split = replica_split(result.records) if result.records else {}
            findings = scan_logs(dep.log_dir, dep.log_marks)
            result.notes.extend(quality_notes(findings, split, self.cluster.replicas))
            if leftovers:
                result.notes.append(
                    "processes left running after teardown: " + ", ".join(leftovers)
                )
            self._write_summary(layout)
            if dep.held_signal is not None and not failing:
                raise KeyboardInterrupt(f"signal {signal.Signals(dep.held_signal).name}")

    def _warm_replicas(self, plan: DeploymentPlan) -> None:
        """One short request per replica, straight to rank 0 (not through the router)."""
        body = {"text": "warm up", "sampling_params": {"max_new_tokens": 4, "temperature": 0.0}}
        with httpx.Client(timeout=600.0, trust_env=False) as http:
            for spec in plan.rank0():
                response = http.post(spec.url + "/generate", json=body)
                response.raise_for_status()

    def measure(self, layout: Layout, endpoint: str) -> LayoutResult:
        """Run the workload through ``endpoint`` once per layout (later calls return the
        first run's result); write records and summary."""
        result = self.results.setdefault(layout.name, LayoutResult(layout.name, layout.label))
        if result.summary is not None:
            return result
        out = self.layout_dir(layout)
        wl = self.cluster.workload
        prompts = [RequestSpec(p.id, p.text, wl.input_len) for p in self.workload.prompts]
        warmup, measured = prompts[: wl.warmup_requests], prompts[wl.warmup_requests :]
        options = ClientOptions(
            api=wl.api,
            output_len=wl.output_len,
            concurrency=wl.concurrency,
            request_rate=wl.request_rate * self.time_scale,
            timeout_s=wl.request_timeout_s / self.time_scale,
            model=self.cluster.server.model_path,
            seed=wl.seed,
        )
        started: list[RequestRecord] = []
        completed: set[int] = set()  # id() of records whose request ran to its end
        journal = RecordJournal(out / "records.partial.jsonl")

        done = 0

        def finished(record: RequestRecord) -> None:
            nonlocal done
            completed.add(id(record))
            journal.add(record)
            if record.warmup:
                return
            done += 1
            if done % 10 == 0 or done == len(measured):
                self.say(f"[kimi {layout.name}] {done}/{len(measured)} requests done")

        router_before = self._router_counters(layout)
        began = time.monotonic()
        try:
            records = asyncio.run(
                run_requests(endpoint, measured, options, warmup=warmup,
                             on_start=started.append, on_done=finished)
            )  # fmt: skip
            write_records(out / "records.jsonl", records)
            result.records = records
            result.notes.extend(prompt_length_notes(records, wl.input_len))
            result.summary = summarize(
                records,
                time_scale=self.time_scale,
                percentiles=sorted(
                    {*wl.percentiles, *slo_mod.percentiles_needed(self.slos[layout.name].values())}
                ),
                goodput_limits_ms=self.goodput_limits_ms,
            )
            result.verdicts = [
                slo_mod.evaluate(s, result.summary) for s in self.slos[layout.name].values()
            ]
        except BaseException as exc:
            self._keep_interrupted_run(layout, result, started, completed, exc, len(measured))
            journal.discard()  # records.jsonl now holds everything it had
            raise
        journal.discard()
        result.notes.extend(self._router_notes(layout, router_before))
        self.say(
            f"[kimi {layout.name}] measured {len(measured)} requests in "
            f"{time.monotonic() - began:.1f}s wall"
        )
        self._write_summary(layout)
        return result

    def _router_counters(self, layout: Layout) -> Counter[tuple[str, str]] | None:
        """The router's retry and upstream counters now (None: not ours, or unreachable)."""
        plan = self._plans.get(layout.name)
        url = plan.router_metrics_url if plan is not None else None
        if url is None:
            return None
        try:
            response = httpx.get(url, timeout=5.0, trust_env=False)
            response.raise_for_status()
            return router_counters(response.text)
        except (httpx.HTTPError, ValueError):
            return None

    def _router_notes(self, layout: Layout, before: Counter[tuple[str, str]] | None) -> list[str]:
        if before is None:
            return []
        after = self._router_counters(layout)
        if after is None:
            return ["router metrics unavailable after the run: retries were not checked"]
        return router_notes(before, after)

    def _keep_interrupted_run(
        self,
        layout: Layout,
        result: LayoutResult,
        started: list[RequestRecord],
        completed: set[int],
        exc: BaseException,
        wanted: int,
    ) -> None:
        """A run stopped part-way (Ctrl-C, SIGTERM, a crash in the client): keep every record,
        the unfinished ones marked, and say in the summary how far it got."""
        why = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        unfinished = [r for r in started if id(r) not in completed]
        close_unfinished(unfinished, f"interrupted before completion ({why})")
        write_records(self.layout_dir(layout) / "records.jsonl", started)
        result.records, result.summary, result.verdicts = started, None, []
        measured = [r for r in started if not r.warmup]
        finished = sum(1 for r in measured if id(r) in completed)
        in_flight = len(measured) - finished
        result.error = (
            f"run interrupted after {finished} of {wanted} requests finished "
            f"({in_flight} in flight, kept as failed records): {why}"
        )
        self._write_summary(layout)

    # -- files -------------------------------------------------------------------------------
    def _write_manifest(
        self, layout: Layout, plan: DeploymentPlan | None, nodes: list[dict] | None = None
    ) -> None:
        manifest: dict[str, Any] = {
            "run_id": self.run_dir.name,
            "layout": {"name": layout.name, "tp": layout.tp, "pp": layout.pp, "ep": layout.ep},
            "cluster": {"name": self.cluster.name, "file": str(self.cluster.path)},
            "backend": self.backend,
            "time_scale": self.time_scale,
            "replicas": self.cluster.replicas,
            "nodes_per_replica": self.cluster.nodes_per_replica,
            "workload": {
                **{
                    k: getattr(self.cluster.workload, k)
                    for k in (
                        "num_requests",
                        "input_len",
                        "output_len",
                        "concurrency",
                        "warmup_requests",
                        "api",
                        "seed",
                        "category",
                        "request_timeout_s",
                    )
                },
                "request_rate": str(self.cluster.workload.request_rate),
                "dataset": self.workload.manifest() if self.workload else None,
            },
            "slo": {name: s.describe() for name, s in self.slos[layout.name].items()},
            "client": client_environment(),
            "endpoint": self.options.endpoint,
        }
        if plan is not None:
            manifest["processes"] = [
                {
                    "name": p.name,
                    "node": p.node.name,
                    "host": p.node.host,
                    "role": p.role,
                    "replica": p.replica,
                    "rank": p.rank,
                    "command": p.command_line(redact=True),
                }
                for p in plan.processes
            ]
            manifest["router_url"] = plan.endpoint
        if nodes is not None:
            manifest["nodes"] = nodes
        write_json(self.layout_dir(layout) / "manifest.json", manifest)

    def _write_summary(self, layout: Layout) -> None:
        result = self.results[layout.name]
        data: dict[str, Any] = {
            "layout": layout.name,
            "label": layout.label,
            "backend": self.backend,
            "time_scale": self.time_scale,
            "complete": result.summary is not None and not result.error,
            "error": result.error,
            "notes": result.notes,
        }
        if result.summary is not None:
            data.update(result.summary.to_dict())
            data["slo"] = [
                {
                    "name": v.slo.name,
                    "limit": v.slo.limit,
                    "unit": v.slo.unit,
                    "upper_bound": v.slo.upper,
                    "source": v.slo.source,
                    "measured": None if math.isnan(v.measured) else v.measured,
                    "passed": v.passed,
                    "message": v.message(),
                }
                for v in result.verdicts
            ]
        write_json(self.layout_dir(layout) / "summary.json", data)

    # -- regression gate ---------------------------------------------------------------------
    def baseline_entry(self, result: LayoutResult) -> dict[str, Any]:
        """What a baseline keeps of one layout: its metrics and per-request samples."""
        assert result.summary is not None
        names = sorted({*BASELINE_METRICS, *self.thresholds})
        return {
            "label": result.label,
            "metrics": baseline_mod.metrics_of(result.summary, names),
            "samples": per_request_ms(result.records, time_scale=self.time_scale),
        }

    def judge(self, layout: Layout, metric: str) -> baseline_mod.Judgement:
        """This run's ``metric`` on ``layout`` against the loaded baseline."""
        assert self.baseline is not None
        result = self.results[layout.name]
        saved = self.baseline["layouts"].get(layout.name)
        if saved is None:
            known = ", ".join(self.baseline["layouts"]) or "none"
            raise baseline_mod.BaselineError(
                f"the baseline has no layout {layout.name!r} (it has: {known}); save one with "
                "--kimi-save-baseline"
            )
        return baseline_mod.judge(
            layout.name, metric, self.thresholds[metric], saved, self.baseline_entry(result)
        )

    def save_baseline(self) -> Path | None:
        """Save this run as the baseline, unless it is incomplete: a partial run must never
        become the reference that later nights are judged against."""
        path = self.options.save_baseline
        if path is None:
            return None
        reasons = incomplete_reasons(self._report_results(), self.stopped_early)
        if reasons:
            why = "; ".join(reasons)
            self.say(f"[kimi] baseline NOT saved to {path}: the run is incomplete ({why})")
            return None
        measured = {name: self.baseline_entry(r) for name, r in self.results.items() if r.summary}
        if not measured:
            return None
        meta = {"cluster": self.cluster.name, "backend": self.backend,
                "time_scale": self.time_scale, "run_id": self.run_dir.name}  # fmt: skip
        baseline_mod.save(path, baseline_mod.snapshot(measured, meta))
        return path

    def _report_results(self) -> list[LayoutResult]:
        """The layouts run so far, in ``--layout`` order; when the session stopped early, the
        selected layouts it never reached are added as not run (the report is incomplete)."""
        results = []
        for layout in self.layouts:
            result = self.results.get(layout.name)
            wanted = self.selected is None or layout.name in self.selected
            if result is None and self.stopped_early and self.results and wanted:
                result = LayoutResult(
                    layout.name, layout.label, error=f"not run: {self.stopped_early}"
                )
            if result is not None:
                results.append(result)
        return results

    def comparison(self) -> dict[str, Any] | None:
        """The report model over :meth:`_report_results`."""
        results = self._report_results()
        if not results:
            return None
        return build_comparison(
            results,
            run_id=self.run_dir.name,
            backend=self.backend,
            time_scale=self.time_scale,
            stopped_early=self.stopped_early,
        )

    def write_comparison(self) -> dict[str, Any] | None:
        model = self.comparison()
        if model is not None:
            write_json(self.run_dir / "comparison.json", model)
            write_text(self.run_dir / "comparison.md", render_markdown(model))
            records = {r.name: r.records for r in self.results.values()}
            write_text(self.run_dir / "report.html", render_html(model, records))
        return model


def _layout_slos(
    cluster: ClusterConfig, layouts: tuple[Layout, ...], overrides: tuple[str, ...]
) -> dict[str, dict[str, slo_mod.Slo]]:
    """Per layout: the cluster's SLOs, then the layout's own, then ini/CLI overrides
    (``NAME=VALUE`` for every layout, ``LAYOUT:NAME=VALUE`` for one)."""
    parsed = [slo_mod.parse_assignment(text, "--kimi-slo") for text in overrides]
    for layout_name, slo in parsed:
        if layout_name is not None and layout_name not in cluster.layouts:
            known = ", ".join(cluster.layouts)
            raise slo_mod.SloError(
                f"--kimi-slo {layout_name}:{slo.name}: unknown layout {layout_name!r} ({known})"
            )
    out = {}
    for layout in layouts:
        own = slo_mod.from_mapping(dict(layout.slo), f"{cluster.path} layouts.{layout.name}")
        cli = [slo for name, slo in parsed if name in (None, layout.name)]
        out[layout.name] = slo_mod.merge(
            slo_mod.from_mapping(cluster.slo, str(cluster.path)), own, cli
        )
    return out


def prompt_length_notes(
    records: list[RequestRecord], nominal: int, tolerance: float = 0.10
) -> list[str]:
    """Warn where the server counted a prompt more than ``tolerance`` off its nominal length.

    SPEED-Bench pads prompts with tiktoken's o200k_base, so "16K" is nominal for the served
    model's tokenizer; a large gap means the workload is not the one the table claims.
    """
    off = [
        r
        for r in records
        if not r.warmup
        and r.prompt_tokens is not None
        and abs(r.prompt_tokens - nominal) > tolerance * nominal
    ]
    if not off:
        return []
    worst = max(off, key=lambda r: abs(r.prompt_tokens - nominal))
    return [
        f"{len(off)} of {sum(not r.warmup for r in records)} prompts differ from the nominal "
        f"{nominal} input tokens by more than {tolerance:.0%} as counted by the server "
        f"(worst: {worst.prompt_id} with {worst.prompt_tokens})"
    ]


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """Let SIGTERM unwind like Ctrl-C, so teardown runs and no server is orphaned."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _check_profile(cluster: ClusterConfig) -> None:
    assert cluster.mock is not None
    try:
        Profile.from_mapping(cluster.mock.profile)
    except ValueError as exc:
        key = str(exc).split(":", 1)[0]
        raise cluster.source.error(f"mock.profile.{key}", str(exc).split(": ", 1)[-1]) from None
