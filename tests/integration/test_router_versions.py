"""A router whose answers we do not understand fails the bring-up at once, naming its version.

The deploy layer brings up two mock replicas as usual, then a fake ``smg`` package (put first
on the router's PYTHONPATH through the cluster file, with its dist-info, so the product's own
version probe finds it, as it would find another release on a real node) whose
``launch_router`` answers ``/readiness`` or ``/metrics`` in a shape neither smg 1.x nor
sglang-router 0.3.x uses. The
start-up timeout is an hour: only a bring-up that gives up at once lets these tests finish.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_kimi.config import load_cluster
from pytest_kimi.deploy.deployment import Deployment
from pytest_kimi.deploy.executor import LocalExecutor
from pytest_kimi.deploy.plan import plan_deployment
from pytest_kimi.deploy.waits import BringUpError

pytestmark = pytest.mark.slow

FAKE_VERSION = "0.9.1"

FAKE_ROUTER = """
import argparse, json, os, threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

parser = argparse.ArgumentParser()
parser.add_argument("--host")
parser.add_argument("--port", type=int)
parser.add_argument("--prometheus-host")
parser.add_argument("--prometheus-port", type=int)
args, _ = parser.parse_known_args()
answers = {
    "/readiness": json.loads(os.environ["FAKE_READINESS"]),
    "/metrics": [200, "text/plain", os.environ["FAKE_METRICS"]],
}

class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        status, kind, body = answers.get(self.path, [404, "text/plain", ""])
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *a):
        pass

metrics = ThreadingHTTPServer((args.prometheus_host, args.prometheus_port), Handler)
threading.Thread(target=metrics.serve_forever, daemon=True).start()
ThreadingHTTPServer((args.host, args.port), Handler).serve_forever()
"""

READY = [200, "application/json", '{"status":"ready","healthy_workers":2,"total_workers":2}']
SMG = '# TYPE smg_worker_health gauge\nsmg_worker_health{worker="x"} 1\n'


def _bring_up(tmp_path: Path, readiness: list, metrics: str) -> tuple[str, Deployment]:
    package = tmp_path / "fakepkg" / "smg"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text('__version__ = "0.0.1"\n')  # metadata says the release
    (package / "launch_router.py").write_text(FAKE_ROUTER)
    info = package.parent / f"smg-{FAKE_VERSION}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: smg\nVersion: {FAKE_VERSION}\n")
    env = {
        "HF_ENDPOINT": "http://127.0.0.1:9",
        "PYTHONPATH": str(package.parent),
        "FAKE_READINESS": json.dumps(readiness),
        "FAKE_METRICS": metrics,
    }
    text = (Path(__file__).parent / "small_cluster.yaml").read_text()
    text = text.replace('  env: {HF_ENDPOINT: "http://127.0.0.1:9"}', f"  env: {json.dumps(env)}")
    text = text.replace("startup_timeout_s: 60", "startup_timeout_s: 3600")
    (tmp_path / "cluster.yaml").write_text(text)
    cluster = load_cluster(tmp_path / "cluster.yaml")
    plan = plan_deployment(cluster, cluster.layout("wide"))
    deployment = Deployment(plan, LocalExecutor(), tmp_path / "logs", timeout_s=3600)
    with pytest.raises(BringUpError) as caught, deployment:
        pass
    return str(caught.value), deployment


@pytest.mark.parametrize(
    ("readiness", "unexpected"),
    [
        ([200, "application/json", '{"ready": true, "workers": 2}'], '"ready": true'),
        ([200, "text/plain", "OK"], "not JSON"),
        ([503, "application/json", '{"healthy": 0}'], '"healthy": 0'),
        ([404, "text/plain", ""], "HTTP 404"),
    ],
    ids=["200-other-json", "200-text", "503-other-json", "no-endpoint"],
)
def test_an_unknown_readiness_answer_fails_at_once_naming_the_router_version(
    tmp_path: Path, readiness: list, unexpected: str
):
    message, deployment = _bring_up(tmp_path, readiness, SMG)
    wanted = f"smg {FAKE_VERSION} answered in a format we do not understand"
    assert wanted in message, message  # the whole message (a router's traceback) if not
    assert "/readiness" in message and unexpected in message
    assert "after 3600s" not in message  # not the deadline
    assert deployment.leftovers == []


def test_router_metrics_named_another_way_fail_at_once_naming_the_router_version(
    tmp_path: Path,
):
    old = "# TYPE sgl_router_requests_total counter\nsgl_router_requests_total 3\n"
    message, deployment = _bring_up(tmp_path, READY, old)
    assert f"smg {FAKE_VERSION} answered in a format" in message
    assert "/metrics has no smg_* metric" in message and "sgl_router_requests" in message
    assert deployment.leftovers == []
