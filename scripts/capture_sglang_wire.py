"""Record what a real SGLang version sends into the mock's wire file for that version.

    python scripts/capture_sglang_wire.py 0.5.23            # starts the version's CPU server
    python scripts/capture_sglang_wire.py 0.5.9 --url http://127.0.0.1:31009   # one running

The server runs the tiny model on a CPU (``pytest_kimi.testing.realsglang``: the version's venv,
its CPU flags and the conformance flags). The script sends the conformance probe's traffic
(``pytest_kimi.testing.wireprobe``) and writes ``pytest_kimi/mock/wire/sglang-<version>.json``:
``/get_server_info`` and ``/get_model_info`` as answered, and every ``/metrics`` family with
its type, help text, label names, the label sets it shows once ready and by the end, its
histogram buckets and a gauge's values at start-up, and every flag the version's own parser
(``ServerArgs.add_cli_args``) takes: the mock refuses the others as SGLang does; and, read
from the version's collector source, the scheduler's families a unified server never shows
(the KV-transfer histograms of a disaggregated prefill) (``--flags-only`` records just these
two, without a server). Label values that belong to the run
(``model_name``, ``pid``, ``engine_type``, ``num_pages``, ``page_size``) become placeholders
the mock fills in. Nothing is edited by hand: rerun this when a version's wire changes, and
``tests/conformance/test_mock_vs_sglang.py`` says whether the mock still matches.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pytest_kimi.mock.wire import VERSIONS, wire_file  # noqa: E402
from pytest_kimi.testing.wireprobe import Transcript, run_probe  # noqa: E402

PLACEHOLDERS = ("model_name", "pid", "engine_type", "num_pages", "page_size")
SAMPLE_SUFFIXES = ("_bucket", "_sum", "_count", "_total", "_created")


def _labels(labels: dict[str, str], histogram: bool) -> dict[str, str]:
    """A sample's labels with run-specific values as ``{name}``; a histogram's without its
    bucket's ``le`` (a gauge may have a label of that name: SGLang's routing-key counts)."""
    return {k: (f"{{{k}}}" if k in PLACEHOLDERS else v) for k, v in sorted(labels.items())
            if not (histogram and k == "le")}  # fmt: skip


def _families(text: str) -> dict[str, dict[str, Any]]:
    """Exposition name -> type, help, label names, label sets, buckets, gauge values."""
    out: dict[str, dict[str, Any]] = {}
    for family in text_string_to_metric_families(text):
        # the parser drops a counter's ``_total``; SGLang's exposition names carry it
        name = family.name + "_total" if family.type == "counter" else family.name
        sets: list[dict[str, str]] = []
        names: set[str] = set()
        buckets: list[str] = []
        values: list[float] = []
        histogram = family.type == "histogram"
        for sample in family.samples:
            names |= set(sample.labels) - ({"le"} if histogram else set())
            if histogram and "le" in sample.labels and sample.labels["le"] not in buckets:
                buckets.append(sample.labels["le"])
            labels = _labels(sample.labels, histogram)
            if labels not in sets:
                sets.append(labels)
                if family.type == "gauge":
                    values.append(sample.value)
        out[name] = {"name": name, "type": family.type, "help": family.documentation,
                     "labels": sorted(names), "sets": sets, "buckets": buckets,
                     "values": values}  # fmt: skip
    return out


def metric_families(ready: str, final: str) -> list[dict[str, Any]]:
    """Every family of the last scrape (and any only the first had), in the server's order."""
    first, last = _families(ready), _families(final)
    out = []
    for name in [*last, *(n for n in first if n not in last)]:
        fam = last.get(name) or first[name]
        at_start = first.get(name)
        entry = {"name": name, "type": fam["type"], "help": fam["help"],
                 "labels": sorted(set(fam["labels"]) | set((at_start or {}).get("labels", []))),
                 "ready": at_start["sets"] if at_start else [], "seen": fam["sets"]}  # fmt: skip
        if fam["buckets"]:
            entry["buckets"] = fam["buckets"]
        if fam["type"] == "gauge" and at_start:
            entry["values"] = at_start["values"]
        out.append(entry)
    return out


def _scrub(value: Any) -> Any:
    """This checkout's absolute paths as paths relative to it (no machine's paths shipped)."""
    if isinstance(value, str):
        return value.replace(str(ROOT) + "/", "")
    if isinstance(value, list):
        return [_scrub(v) for v in value]
    if isinstance(value, dict):
        return {k: _scrub(v) for k, v in value.items()}
    return value


def recording(version: str, transcript: Transcript, flags: Iterable[str]) -> dict[str, Any]:
    info = transcript.answers["info/get_server_info"].body
    if str(info.get("version")) != version:
        raise SystemExit(f"the server says it is SGLang {info.get('version')}, not {version}")
    return {
        "version": version,
        "captured_with": {"script": "scripts/capture_sglang_wire.py",
                          "model": "pytest_kimi/data/tiny-model", "flags": list(flags)},
        "server_info": _scrub(info),
        "model_info": _scrub(transcript.answers["info/get_model_info"].body),
        "metrics": metric_families(transcript.metrics["ready"], transcript.metrics["aborted"]),
    }  # fmt: skip


def _capture_live(version: str, url: str | None) -> tuple[Transcript, list[str]]:
    from pytest_kimi.deploy.ports import free_port
    from pytest_kimi.testing import realsglang

    flags = [*realsglang.CPU_FLAGS, *realsglang.CONFORMANCE_FLAGS]
    if url is not None:
        context = int(json_get(url + "/get_server_info")["context_length"])
        return run_probe(url, context), flags
    python = realsglang.venv_dir(version) / "bin" / "python"
    if not python.exists():
        raise SystemExit(f"no SGLang {version} venv at {python.parent.parent}: run "
                         f"scripts/install_real_sglang.sh {version}")  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        server = realsglang.RealServer(version, python, free_port(), Path(tmp) / "server.log",
                                       *realsglang.CONFORMANCE_FLAGS)  # fmt: skip
        try:
            server.wait_ready()
            context = int(json_get(server.url + "/get_server_info")["context_length"])
            transcript = run_probe(server.url, context)
        finally:
            server.stop()
        called = realsglang.standin_calls([server.log])
        if called:  # a server that ran a stand-in did not answer as SGLang: record nothing
            raise SystemExit(f"the server called import-only stand-ins: {called}")
        return transcript, flags


def server_flags(version: str) -> list[str]:
    """Every ``--flag`` the version's ``sglang.launch_server`` parser takes, read from it."""
    import subprocess

    from pytest_kimi.testing import realsglang

    python = realsglang.venv_dir(version) / "bin" / "python"
    script = ROOT / "scripts" / "real_sglang" / "parse_args.py"
    out = subprocess.run([str(python), str(script), "server", "--flags"], check=True,
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    return json.loads(out.stdout)


COLLECTORS = ("sglang/srt/observability/metrics_collector.py",  # 0.5.10 and later
              "sglang/srt/metrics/collector.py")  # 0.5.9  # fmt: skip
SCHEDULER_TEMPLATE = "sglang:num_running_reqs"  # a scheduler family: its labels are labels.keys()


def declared_families(version: str, recorded: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The scheduler's families a live unified server never shows (a histogram appears at its
    first observation: the KV-transfer ones only on a disaggregated prefill), read from the
    version's own collector source: ``SchedulerMetricsCollector``'s ``Gauge`` / ``Counter`` /
    ``Histogram(name=..., documentation=..., labelnames=labels.keys(), buckets=...)`` calls
    with literal arguments. Their labels are the scheduler's (those of
    :data:`SCHEDULER_TEMPLATE` in the recording)."""
    import ast

    from pytest_kimi.testing import realsglang

    site = next((realsglang.venv_dir(version) / "lib").glob("python*/site-packages"))
    source = next(site / path for path in COLLECTORS if (site / path).is_file())
    tree = ast.parse(source.read_text(encoding="utf-8"))
    [collector] = [n for n in ast.walk(tree)
                   if isinstance(n, ast.ClassDef) and n.name == "SchedulerMetricsCollector"]
    seen = {f["name"] for f in recorded}
    [template] = [f for f in recorded if f["name"] == SCHEDULER_TEMPLATE]
    out = []
    for call in ast.walk(collector):
        if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name)
                and call.func.id in ("Gauge", "Counter", "Histogram")):
            continue
        kw = {k.arg: k.value for k in call.keywords}
        try:
            name = ast.literal_eval(kw["name"])
            doc = ast.literal_eval(kw["documentation"])
            buckets = [str(float(b)) for b in ast.literal_eval(kw["buckets"])] if (
                "buckets" in kw) else []
        except (KeyError, ValueError):
            continue  # computed arguments: not read from source
        if name in seen or ast.unparse(kw.get("labelnames", ast.Constant(""))) != "labels.keys()":
            continue
        kind = call.func.id.lower()
        out.append({"name": name, "type": kind, "help": doc, "labels": template["labels"],
                    "ready": [], "seen": template["ready"][:1],
                    "buckets": [*buckets, "+Inf"] if kind == "histogram" else []})
    return out + _tokenizer_families(tree, recorded)


TOKENIZER_TEMPLATE = "sglang:num_aborted_requests_total"  # the tokenizer's labels.keys()


def _tokenizer_families(tree: Any, recorded: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The tokenizer manager's counters with a label of their own that a server without a
    prefix cache never shows: ``Counter(name=..., documentation=..., labelnames=
    list(labels.keys()) + ["cache_source"])`` (``sglang:cached_tokens_total``, first
    incremented by a request that found its prefix cached). Their labels are the tokenizer's
    (those of :data:`TOKENIZER_TEMPLATE`) and the extra ones, whose values the mock gives."""
    import ast

    seen = {f["name"] for f in recorded}
    [template] = [f for f in recorded if f["name"] == TOKENIZER_TEMPLATE]
    [collector] = [n for n in ast.walk(tree)
                   if isinstance(n, ast.ClassDef) and n.name == "TokenizerMetricsCollector"]
    out = []
    for call in ast.walk(collector):
        if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name)
                and call.func.id == "Counter"):
            continue
        kw = {k.arg: k.value for k in call.keywords}
        labelnames = kw.get("labelnames")
        if not (isinstance(labelnames, ast.BinOp) and isinstance(labelnames.op, ast.Add)
                and ast.unparse(labelnames.left) == "list(labels.keys())"):
            continue
        try:
            name = ast.literal_eval(kw["name"])
            doc = ast.literal_eval(kw["documentation"])
            extra = [str(x) for x in ast.literal_eval(labelnames.right)]
        except (KeyError, ValueError):
            continue
        if name in seen or name != "sglang:cached_tokens_total":
            continue  # only what the mock counts: a family it never writes is not recorded
        base = template["seen"][0]
        out.append({"name": name, "type": "counter", "help": doc,
                    "labels": sorted([*base, *extra]), "ready": [],
                    "seen": [{**base, **{k: "" for k in extra}}], "buckets": []})
    return out


def json_get(url: str) -> Any:
    import httpx

    return httpx.get(url, timeout=60, trust_env=False).json()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("version", choices=VERSIONS)
    parser.add_argument("--url", help="a running server of that version (started with "
                        "realsglang's CPU and conformance flags)")  # fmt: skip
    parser.add_argument("--out", type=Path, help="default: the mock's wire file")
    parser.add_argument("--flags-only", action="store_true",
                        help="record only the parser's flags into the existing file")  # fmt: skip
    args = parser.parse_args(argv)
    out = args.out or wire_file(args.version)
    if args.flags_only:
        data = json.loads(out.read_text(encoding="utf-8"))
    else:
        transcript, flags = _capture_live(args.version, args.url)
        data = recording(args.version, transcript, flags)
    data["server_flags"] = server_flags(args.version)
    data["declared"] = declared_families(args.version, data["metrics"])
    out.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {out}: {len(data['server_info'])} server_info keys, "
          f"{len(data['metrics'])} metric families")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
