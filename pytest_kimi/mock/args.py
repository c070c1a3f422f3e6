"""``sglang.launch_server``'s command line, as the mock understands it.

The flags that shape behaviour are parsed with SGLang's names and defaults; any other flag
the impersonated release takes is accepted and recorded (``unknown``), so a real cluster's
command line runs unchanged with only the module swapped. A flag that release does not take
(its parser's flags are recorded in ``pytest_kimi/mock/wire``) is refused as SGLang refuses it:
"unrecognized arguments", exit 2. Flags starting ``--mock-`` belong to the mock alone.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_kimi.mock.speculative import ALGORITHMS, DEFAULT_MAX_RUNNING, Speculation
from pytest_kimi.mock.wire import DEFAULT_VERSION, VERSIONS, recording


@dataclass(frozen=True)
class MockArgs:
    """Parsed server arguments plus what the mock did not recognise."""

    values: dict[str, Any]
    unknown: list[str] = field(default_factory=list)

    def __getattr__(self, name: str) -> Any:
        try:
            return self.values[name]
        except KeyError:
            raise AttributeError(name) from None

    @property
    def profile(self) -> dict[str, Any]:
        """The performance profile: inline JSON or a path to a JSON/YAML file."""
        spec = self.values.get("mock_profile")
        if not spec:
            return {}
        if spec.lstrip().startswith("{"):
            return json.loads(spec)
        text = Path(spec).read_text(encoding="utf-8")
        if spec.endswith((".yaml", ".yml")):
            import yaml

            return yaml.safe_load(text) or {}
        return json.loads(text)

    @property
    def speculation(self) -> Speculation | None:
        """Speculative decoding as resolved at parse time (``None``: off)."""
        return Speculation.from_args(self.values)

    def server_info(self) -> dict[str, Any]:
        """The parsed server arguments under SGLang's key names (every parsed flag is a
        ``ServerArgs`` field; the ``--mock-*`` ones are left out). ``/get_server_info`` lays
        them over the version's recorded answer (:mod:`pytest_kimi.mock.wire.info`)."""
        return {k: v for k, v in self.values.items() if not k.startswith("mock_")}

    @property
    def wire(self) -> str:
        """The SGLang version whose answers the mock gives (``--mock-sglang-version``)."""
        return str(self.values["mock_sglang_version"])


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="pytest_kimi.mock.launch_server", allow_abbrev=False)
    add = p.add_argument
    add("--model-path", "--model", dest="model_path", required=True)
    add("--tokenizer-path", default=None)
    add("--served-model-name", default=None)
    add("--host", default="127.0.0.1")
    add("--port", type=int, default=30000)
    add("--tp-size", "--tp", dest="tp_size", type=int, default=1)
    add("--pp-size", "--pp", dest="pp_size", type=int, default=1)
    add("--ep-size", "--ep", dest="ep_size", type=int, default=1)
    add("--dp-size", "--dp", dest="dp_size", type=int, default=1)
    add("--nnodes", type=int, default=1)
    add("--node-rank", type=int, default=0)
    add("--dist-init-addr", default=None)
    add("--dist-timeout", type=int, default=None)
    add("--chunked-prefill-size", type=int, default=8192)
    add("--max-running-requests", type=int, default=None)
    add("--max-prefill-tokens", type=int, default=16384)
    add("--context-length", type=int, default=131072)
    add("--disable-radix-cache", action="store_true")
    add("--enable-cache-report", action="store_true")
    add("--enable-mixed-chunk", action="store_true")
    add("--kv-cache-dtype", default="auto")
    add("--moe-runner-backend", default="auto")
    add("--moe-a2a-backend", default="none")
    add("--enable-metrics", action="store_true")
    add("--trust-remote-code", action="store_true")
    add("--mem-fraction-static", type=float, default=None)
    add("--log-level", default="info")
    add("--random-seed", type=int, default=None)
    add("--api-key", default=None)
    add("--disaggregation-mode", default="null", choices=("null", "prefill", "decode"))
    add("--disaggregation-transfer-backend", default="mooncake")
    add("--disaggregation-bootstrap-port", type=int, default=8998)
    add("--disaggregation-decode-tp", type=int, default=None)  # prefill side; default its tp
    add("--disaggregation-decode-dp", type=int, default=None)
    add("--disaggregation-prefill-pp", type=int, default=1)  # decode side
    add("--decode-log-interval", type=int, default=40)
    add("--max-total-tokens", type=int, default=None)
    add("--skip-server-warmup", action="store_true")
    add("--speculative-algorithm", default=None, choices=ALGORITHMS)
    add("--speculative-draft-model-path", "--speculative-draft-model",
        dest="speculative_draft_model_path", default=None)  # fmt: skip
    add("--speculative-num-steps", type=int, default=None)
    add("--speculative-eagle-topk", type=int, default=None)
    add("--speculative-num-draft-tokens", type=int, default=None)
    _mock_flags(p)
    return p


def _mock_flags(p: argparse.ArgumentParser) -> None:
    """The mock's own flags (``--mock-*``): never SGLang's, never in its answers."""
    add = p.add_argument
    add(
        "--mock-sglang-version",
        default=DEFAULT_VERSION,
        choices=VERSIONS,
        help="the SGLang version whose wire the mock speaks: its responses, meta_info keys, "
        "errors, /get_server_info keys and /metrics families (pytest_kimi/mock/wire/)",
    )
    add("--mock-time-scale", type=float, default=1.0, help="cluster seconds per wall second")
    add("--mock-profile", default=None, help="performance profile: inline JSON or a file")
    add("--mock-seed", type=int, default=0)
    add(
        "--mock-clock",
        default=None,
        help="a shared cluster clock file (pytest_kimi/workload/sharedclock.py): a local run's "
        "processes and client keep one time, and wall overhead stays out of cluster time",
    )
    add("--mock-gpus-per-node", type=int, default=None)
    add("--mock-node", default=None, help="this node's name (the stand-in nvidia-smi's GPUs)")
    add(
        "--mock-gpu-state",
        default=None,
        metavar="DIR",
        help="the node's GPU state dir: this server's GPUs and load, for the stand-in nvidia-smi",
    )
    add("--mock-join-timeout", type=float, default=120.0, help="wall seconds for ranks to join")
    add("--mock-startup-delay", type=float, default=0.0, help="wall seconds before serving")
    add(
        "--mock-startup-stall",
        action="store_true",
        help="hang during start-up (after joining, before loading) writing nothing, until "
        "signalled: a node stuck the way a hung NCCL init or dead mount leaves one "
        "(also KIMI_MOCK_STARTUP_STALL=1 in the process's environment)",
    )
    add(
        "--mock-replica-header",
        action="store_true",
        help="name the replica (host:port) in an X-Kimi-Replica header and meta_info: "
        "SGLang sends neither, so it is off by default and the product never reads it",
    )
    add(
        "--mock-server-info-extras",
        action="store_true",
        help="add unrecognized_args and kimi_mock (time scale, profile) to /get_server_info: "
        "keys SGLang lacks, off by default",
    )
    add(
        "--mock-reasoning-tokens",
        type=int,
        default=0,
        metavar="N",
        help="chat streams send their first N tokens as delta.reasoning_content (a reasoning "
        "model behind SGLang's --reasoning-parser)",
    )
    add(
        "--mock-fault",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="fault knob, repeatable (see pytest_kimi/mock/faults.py)",
    )


def parse_args(argv: Sequence[str]) -> MockArgs:
    """Parse ``argv``; flags the release takes but the mock does not model (and their values)
    are kept, flags it does not take end the process as SGLang's parser ends it."""
    namespace, unknown = _parser().parse_known_args(list(argv))
    values = vars(namespace)
    refused = unrecognized(argv, values["mock_sglang_version"])
    if refused:
        import sys

        # argparse's own words and exit status, as SGLang's launch_server.py prints them
        print(f"launch_server.py: error: unrecognized arguments: {' '.join(refused)}",
              file=sys.stderr)  # fmt: skip
        raise SystemExit(2)
    if values["served_model_name"] is None:
        values["served_model_name"] = values["model_path"]
    if values["mock_gpus_per_node"] is None:
        gpus = values["tp_size"] * values["pp_size"]
        values["mock_gpus_per_node"] = max(1, gpus // max(1, values["nnodes"]))
    _resolve_speculative(values)
    return MockArgs(values, unknown)


def unrecognized(argv: Sequence[str], version: str) -> list[str]:
    """The flags of ``argv`` (with the values after each) that SGLang ``version``'s parser
    does not take; ``--mock-*`` flags are the mock's own. Empty where the recording lists no
    flags."""
    known = recording(version).server_flags
    out: list[str] = []
    taking = False  # the values after a refused flag are refused with it
    for token in argv:
        if token.startswith("--"):
            flag = token.split("=", 1)[0]
            # argparse (allow_abbrev, SGLang's default) takes a unique prefix: --mem-frac
            prefix = sum(1 for k in known if k.startswith(flag)) == 1
            taking = (bool(known) and not flag.startswith("--mock-") and flag not in known
                      and not prefix)  # fmt: skip
            if taking:
                out.append(token)
        elif taking:
            out.append(token)
    return out


def _resolve_speculative(values: dict[str, Any]) -> None:
    """What SGLang 0.5.9's ``ServerArgs`` makes of the speculative flags, so that
    ``/get_server_info`` shows the same: NEXTN is EAGLE, the steps and draft tokens resolved,
    48 running requests unless set, no mixed chunks. Raises :class:`SpeculativeError`."""
    spec = Speculation.from_args(values)
    if spec is None:
        return
    values["speculative_algorithm"] = spec.algorithm
    values["speculative_num_steps"] = spec.num_steps
    values["speculative_eagle_topk"] = spec.eagle_topk
    values["speculative_num_draft_tokens"] = spec.num_draft_tokens
    if values["max_running_requests"] is None:
        values["max_running_requests"] = DEFAULT_MAX_RUNNING
    values["enable_mixed_chunk"] = False
