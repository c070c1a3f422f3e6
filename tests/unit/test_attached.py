"""What is behind ``--kimi-endpoint`` (pytest_kimi/deploy/attached.py) and how the manifest
describes it (pytest_kimi/run/manifest.py ``attached_layout``), against a small loopback server
that answers as a router and its workers do."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import pytest

from pytest_kimi.deploy.attached import Attached, Worker, discover, redacted
from pytest_kimi.run.manifest import attached_layout

SECRETS = {"api_key": "sk-live-1", "admin_api_key": "adm-2", "ssl_keyfile_password": "pw-3",
           "watermark_key": "wm-4"}  # fmt: skip


class _Answers(BaseHTTPRequestHandler):
    routes: ClassVar[dict[str, tuple[int, object]]] = {}

    def do_GET(self) -> None:
        status, body = self.routes.get(self.path, (404, {"detail": "Not Found"}))
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        return None


@pytest.fixture
def endpoint() -> Iterator[tuple[str, dict]]:
    """A loopback server; the test fills ``routes`` (path -> (status, JSON body))."""
    routes: dict[str, tuple[int, object]] = {}
    handler = type("Handler", (_Answers,), {"routes": routes})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", routes
    finally:
        server.shutdown()
        server.server_close()


def _info(**over: object) -> dict:
    return {"version": "0.5.23", "tp_size": 1, "pp_size": 1, "ep_size": 1, "dp_size": 1,
            "model_path": "/m", "device": "cpu", **over}  # fmt: skip


def test_server_info_secrets_never_reach_the_manifest(endpoint) -> None:
    url, routes = endpoint
    command = "python -m sglang.launch_server --api-key sk-live-1 --admin-api-key=adm-2 --port 1"
    routes["/server_info"] = (200, _info(**SECRETS, launch_command=command,
                                         internal_states=[{"api_key": "sk-live-1"}]))  # fmt: skip
    attached = discover(url)
    assert attached.kind == "server" and attached.workers[0].version == "0.5.23"
    text = json.dumps(attached.to_dict())
    for secret in SECRETS.values():
        assert secret not in text
    info = attached.workers[0].info
    assert info["launch_command"].endswith("--api-key *** --admin-api-key=*** --port 1")
    assert info["tp_size"] == 1 and info["model_path"] == "/m"  # the rest as answered


def test_redaction_leaves_unset_secrets_and_ordinary_arguments_alone() -> None:
    info = redacted({"api_key": None, "max_total_tokens": 5, "ssl_keyfile": "/k.pem"})
    assert info == {"api_key": None, "max_total_tokens": 5, "ssl_keyfile": "/k.pem"}


def test_a_pd_router_names_its_workers_by_side(endpoint) -> None:
    url, routes = endpoint
    workers = [{"url": f"{url}/p", "worker_type": "prefill"},
               {"url": f"{url}/d", "worker_type": "decode"}]  # fmt: skip
    routes["/workers"] = (200, {"workers": workers})
    routes["/p/server_info"] = routes["/d/server_info"] = (200, _info())
    attached = discover(url)
    assert attached.kind == "router"
    assert [(w.name, w.url) for w in attached.workers] == [("prefill0", f"{url}/p"),
                                                          ("decode0", f"{url}/d")]  # fmt: skip


def test_a_dp_aware_router_lists_one_server_once(endpoint) -> None:
    url, routes = endpoint
    routes["/workers"] = (200, {"workers": [{"url": f"{url}/s@0"}, {"url": f"{url}/s@1"}]})
    routes["/s/server_info"] = (200, _info(dp_size=2))
    attached = discover(url)
    assert [(w.name, w.url) for w in attached.workers] == [("replica0", f"{url}/s")]


def test_an_unreachable_worker_is_named_and_left_out_of_the_counters(endpoint) -> None:
    url, routes = endpoint
    routes["/workers"] = (200, {"workers": [{"url": f"{url}/a"}, {"url": "http://127.0.0.1:9"}]})
    routes["/a/server_info"] = (200, _info())
    attached = discover(url)
    assert list(attached.worker_urls()) == ["replica0"]
    assert any(n.startswith("replica1 (http://127.0.0.1:9) could not be asked") for n in
               attached.notes)  # fmt: skip
    layout = attached_layout(attached, "tp1")
    assert layout["replicas"] == 2 and layout["layout"]["gpus"] is None  # one did not say


def _layout(*infos: dict) -> dict:
    workers = tuple(Worker(f"replica{i}", f"http://w{i}", info) for i, info in enumerate(infos))
    return attached_layout(Attached("http://r", "router", workers), "x")


def test_gpus_count_dp_ranks_inside_tp_under_dp_attention() -> None:
    assert _layout(_info(tp_size=8, dp_size=8, enable_dp_attention=True))["layout"]["gpus"] == 8
    assert _layout(_info(tp_size=8, dp_size=2))["layout"]["gpus"] == 16
    assert _layout(_info(tp_size=4, pp_size=2), _info(tp_size=4, pp_size=2))["layout"]["gpus"] == 16


def test_odd_sizes_are_unknown_and_zero_is_a_value() -> None:
    odd = _layout(_info(tp_size="8"))
    assert odd["layout"]["gpus"] is None  # said, but not as a whole number
    args = _layout(_info(chunked_prefill_size=0, disable_radix_cache=False,
                         disaggregation_mode="null"))["layout"]["server_args"]  # fmt: skip
    assert args["chunked-prefill-size"] == 0
    assert "disable-radix-cache" not in args and "disaggregation-mode" not in args


def test_smg_states_its_release_and_sglang_router_does_not(endpoint) -> None:
    """smg answers /get_loads with its release (seen on 1.13.0); sglang-router 0.3.2 with the
    workers' loads only: no release is guessed for it."""
    url, routes = endpoint
    routes["/workers"] = (200, {"workers": [{"url": f"{url}/a"}]})
    routes["/a/server_info"] = (200, _info())
    routes["/get_loads"] = (200, {"timestamp": "2026-12-06T02:44:44Z", "version": "smg-1.13.0",
                                  "dp_rank_count": 0, "loads": []})  # fmt: skip
    assert discover(url).router == "smg 1.13.0"
    routes["/get_loads"] = (200, {"workers": [{"worker": f"{url}/a", "load": 0}]})
    assert discover(url).router is None
    del routes["/workers"]  # a server, not a router: not asked
    assert discover(url).router is None


def test_the_servers_release_is_read_against_the_supported_range(endpoint) -> None:
    url, routes = endpoint
    routes["/server_info"] = (200, _info(version="0.6.2"))
    [note] = discover(url).notes
    assert "SGLang 0.6.2 (stated by the servers) is newer than the newest release" in note
    routes["/server_info"] = (200, _info(version="0.5.8"))
    [note] = discover(url).notes
    assert "older than pytest-kimi supports: 0.5.9 and newer" in note
    routes["/server_info"] = (200, _info(version="0.5.23-kimi-mock"))
    assert discover(url).notes == ()  # the mock answers as 0.5.23
