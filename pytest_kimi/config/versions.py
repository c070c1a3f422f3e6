"""The SGLang and router releases pytest-kimi supports, and what differs between them.

One place says, per SGLang version range, which server flags exist, which metrics and
meta_info keys a server gives and how to read them; and, per router package (``smg``, the
maintained one, and its predecessor ``sglang-router`` 0.3), how it is launched, which settings
make it a plain benchmark router, and how its version is read. Bring-up asks the nodes which
versions they run and builds every command line from the profile found
(:mod:`pytest_kimi.deploy.versionprobe`); a dry run, which asks nothing, assumes
``--kimi-sglang-version`` or ``server.sglang_version`` (default: the newest profile).

Every fact below was read from the release itself (``pip download --no-deps sglang==X``: its
``server_args.py``, ``metrics/collector.py``; the routers' ``router_args.py``), and the
conformance tests parse the plan's command lines with each version's real parser.
Pure data and functions: standard library and ``packaging`` only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from packaging.version import InvalidVersion, Version

OLDEST_SGLANG = "0.5.9"
"""Older releases are refused: their answers and metrics were never read by us."""

MOCK_SGLANG_VERSIONS = ("0.5.9", "0.5.23")
"""The versions the mock impersonates (its recordings in ``pytest_kimi/mock/wire``; a test
keeps the two lists equal); the newest is the mock's and a dry run's default."""

NEWEST_SGLANG = MOCK_SGLANG_VERSIONS[-1]

# The first release of each change, read from every release in between (pip download
# --no-deps; each release's own argparse parser built and dumped; docs/real-sglang.md's table).
PD_SHAPE_FLAGS_GONE = Version("0.5.10")  # --disaggregation-decode-tp / -decode-dp / -prefill-pp
PD_QUEUE_STAGES_GONE = Version("0.5.10")  # prefill_waiting / prefill_prepare only traced
KV_TRANSFER_HISTOGRAMS = Version("0.5.10")  # kv_transfer_* gauges became histograms
SPEC_KEYS_INTERIM = Version("0.5.11")  # spec_accept_token_num -> spec_accepted_drafts, ...
SPEC_KEYS_RENAMED = Version("0.5.12")  # ... -> spec_num_correct_drafts, ...; num_retractions
MOONCAKE_TCP = Version("0.5.13")  # --disaggregation-transfer-backend mooncake_tcp
CUDA_GRAPH_BACKENDS = Version("0.5.14")  # --cuda-graph-backend-{decode,prefill}
IS_STREAMING_LABEL = Version("0.5.17")  # counters and TTFT/E2E histograms: is_streaming label

TRANSFER_BACKENDS = ("mooncake", "nixl", "ascend", "fake", "mori", "mooncake_tcp")
"""Every release's choices of ``--disaggregation-transfer-backend`` (``mooncake_tcp`` from
0.5.13: :attr:`SGLangProfile.transfer_backends`)."""


@dataclass(frozen=True)
class SGLangProfile:
    """What one SGLang release accepts and gives, as far as pytest-kimi builds or reads it."""

    version: str  # the release served (or assumed)
    source: str = "assumed"  # where the version came from: probed, cluster file, option, ...

    @property
    def parsed(self) -> Version:
        """The release without pre/dev/post/local parts: 0.5.10rc0 has 0.5.10's flags."""
        return Version(Version(self.version).base_version)

    @property
    def pd_shape_flags(self) -> bool:
        """``--disaggregation-decode-tp`` (prefill side) and ``--disaggregation-prefill-pp``
        (decode side) exist; later releases learn the other side's shape through the bootstrap
        server and refuse both flags ("unrecognized arguments")."""
        return self.parsed < PD_SHAPE_FLAGS_GONE

    @property
    def pd_queue_stages(self) -> bool:
        """The prefill side observes ``prefill_prepare`` and ``prefill_waiting`` in
        ``sglang:per_stage_req_latency_seconds``."""
        return self.parsed < PD_QUEUE_STAGES_GONE

    @property
    def kv_transfer_histograms(self) -> bool:
        """``sglang:kv_transfer_speed_gb_s`` / ``_latency_ms`` are histograms, observed per
        transfer (earlier: gauges, exported and never set)."""
        return self.parsed >= KV_TRANSFER_HISTOGRAMS

    @property
    def spec_keys(self) -> Mapping[str, str]:
        """meta_info's speculative-decoding keys: our name -> this release's (the product
        reads ``spec_verify_ct`` and the completion tokens, unchanged in every release)."""
        if self.parsed < SPEC_KEYS_INTERIM:
            return SPEC_KEYS_0_5_9
        if self.parsed < SPEC_KEYS_RENAMED:
            return SPEC_KEYS_0_5_11
        return SPEC_KEYS_0_5_12

    @property
    def transfer_backends(self) -> tuple[str, ...]:
        """The ``--disaggregation-transfer-backend`` choices of this release."""
        if self.parsed < MOONCAKE_TCP:
            return tuple(b for b in TRANSFER_BACKENDS if b != "mooncake_tcp")
        return TRANSFER_BACKENDS

    @property
    def cuda_graph_flags(self) -> tuple[str, ...]:
        """The flags that switch CUDA graphs off (``--disable-cuda-graph`` is accepted in
        every release; from 0.5.14 deprecated, with a warning, beside the per-phase ones)."""
        if self.parsed < CUDA_GRAPH_BACKENDS:
            return ("--disable-cuda-graph",)
        return ("--cuda-graph-backend-decode=disabled", "--cuda-graph-backend-prefill=disabled")

    @property
    def is_streaming_label(self) -> bool:
        """Request counters and the TTFT / E2E histograms carry an ``is_streaming`` label
        (sum over it when reading them)."""
        return self.parsed >= IS_STREAMING_LABEL

    @property
    def mock_wire(self) -> str:
        """The recorded release the mock answers as for this one: the newest recording not
        newer than it."""
        return max((v for v in MOCK_SGLANG_VERSIONS if Version(v) <= self.parsed), key=Version)

    def describe(self) -> str:
        return f"SGLang {self.version} ({self.source})"


SPEC_KEYS_0_5_9: Mapping[str, str] = {
    "accept_length": "spec_accept_length",
    "accepted": "spec_accept_token_num",
    "drafted": "spec_draft_token_num",
    "histogram": "spec_accept_histogram",
    "verify_steps": "spec_verify_ct",
}
SPEC_KEYS_0_5_11: Mapping[str, str] = {
    **SPEC_KEYS_0_5_9,
    "accepted": "spec_accepted_drafts",
    "drafted": "spec_proposed_drafts",
}
SPEC_KEYS_0_5_12: Mapping[str, str] = {  # 0.5.12-0.5.20 also send 0.5.11's names as aliases
    **SPEC_KEYS_0_5_9,
    "accepted": "spec_num_correct_drafts",
    "drafted": "spec_num_proposed_drafts",
    "histogram": "spec_correct_drafts_histogram",
}


class VersionError(ValueError):
    """A version outside what pytest-kimi supports, or not a version at all."""


def sglang_profile(version: str, source: str = "assumed") -> tuple[SGLangProfile, list[str]]:
    """The profile of ``version`` and the notes to show: a release newer than the newest we
    read runs on the newest profile, with a note; one older than :data:`OLDEST_SGLANG`, or
    no version at all, is a :class:`VersionError` naming the supported range."""
    try:
        parsed = Version(version)
    except InvalidVersion:
        raise VersionError(
            f"SGLang version {version!r} ({source}) is not a version; supported: "
            f"{OLDEST_SGLANG} and newer"
        ) from None
    if parsed < Version(OLDEST_SGLANG):
        raise VersionError(
            f"SGLang {version} ({source}) is older than pytest-kimi supports: "
            f"{OLDEST_SGLANG} and newer (its flags, metrics and answers were never read)"
        )
    notes = []
    if parsed.release[:3] > Version(NEWEST_SGLANG).release[:3]:
        notes.append(
            f"SGLang {version} ({source}) is newer than the newest release pytest-kimi has "
            f"read ({NEWEST_SGLANG}): its command lines and metrics are read as "
            f"{NEWEST_SGLANG}'s"
        )
    return SGLangProfile(version, source), notes


def mock_version(version: str) -> str | None:
    """Why the mock cannot impersonate ``version``, or None."""
    if version in MOCK_SGLANG_VERSIONS:
        return None
    return (
        f"the mock answers as SGLang {' or '.join(MOCK_SGLANG_VERSIONS)} (its recordings in "
        f"pytest_kimi/mock/wire), not {version}"
    )


# -- routers ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Setting:
    """One benchmarking flag of a router: its value, the first release that has it, and why."""

    flag: str
    value: str | int | float | bool
    since: str  # the package's first release with the flag
    why: str


@dataclass(frozen=True)
class RouterPackage:
    """One router package: how it starts, which of its versions we read, and the settings
    that make it route every request once, in turn, and reject none (docs/deployment.md)."""

    name: str  # the distribution: what pip installs and importlib.metadata reads
    module: str  # run with python -m
    import_name: str
    supported: str  # PEP 440 specifier of the versions whose answers and metrics we read
    newest: str  # the newest release we read: what a plan assumes before the node is asked
    policies: tuple[str, ...] = ()  # --policy / --decode-policy choices (prefill: and bucket)
    settings: tuple[Setting, ...] = ()
    # a file that tunes any flag with one of these prefixes asked for the feature: the
    # matching benchmark setting (the value) is dropped
    tuned_by: Mapping[str, str] = field(default_factory=dict)

    def describe(self, version: str | None) -> str:
        return f"{self.name} {version}" if version else f"{self.name} (version unknown)"

    def benchmark_args(self, version: str | None = None) -> dict[str, str | int | float | bool]:
        """The settings ``version`` has (None: the newest we read), as router.args values."""
        try:
            have = Version(version or self.newest)
        except InvalidVersion:
            have = Version(self.newest)
        return {s.flag: s.value for s in self.settings if have >= Version(s.since)}


# Both packages, every release: no retries and no circuit breaker (a failure is counted as
# one, not hidden in a slower success or a silently smaller deployment); a health-check
# timeout (60 s) longer than SGLang's own 20 s (its /health generates a token and waits, and
# answers late behind 16K-token prefills) and 10 failed checks in a row before a worker is
# dropped; no admission bound; a worker registered a second after it answers (smg's default
# check interval, 30 s, delayed every bring-up by up to that); a stop that does not wait
# three minutes for a request stuck in a dead worker.
_COMMON = (
    Setting("disable-retries", True, "0", "a failed request is one failure, not a retry"),
    Setting("disable-circuit-breaker", True, "0", "no worker is cut off after failures"),
    Setting("health-check-timeout-secs", 60, "0", "longer than SGLang's own 20 s /health"),
    Setting("health-failure-threshold", 10, "0", "a busy worker is not dropped"),
    Setting("max-concurrent-requests", 0, "0", "no admission bound (smg 1.13: 4096 by default)"),
    Setting("worker-startup-check-interval", 1, "0", "workers registered within a second"),
    Setting("shutdown-grace-period-secs", 5, "0", "teardown waits 5 s, not 180, for requests"),
)
_COMMON_TUNED_BY = {"retry-": "disable-retries", "cb-": "disable-circuit-breaker",
                    # a file asking for a rate limit or a queue asked for an admission bound
                    "rate-limit-": "max-concurrent-requests",
                    "queue-": "max-concurrent-requests"}  # fmt: skip

SGLANG_ROUTER = RouterPackage(
    name="sglang-router",
    module="sglang_router.launch_router",
    import_name="sglang_router",
    supported=">=0.3.2,<0.4",
    newest="0.3.2",
    policies=("random", "round_robin", "cache_aware", "power_of_two", "manual"),
    settings=_COMMON,
    tuned_by=_COMMON_TUNED_BY,
)

# smg also leaves a worker out of the rotation when it looks busy or quiet: from 1.12 over 8
# waiting requests or 0.8 of its KV cache (overload protection, on by default), a worker with
# requests in flight and no token for 3 s ("wedged"), no contact for 2 s after a transport
# failure ("stalled"), no load record for 15 s (1.13, "stale"); 1.13 closes a client
# connection idle for 90 s and writes keep-alive comments into a stream silent for 15 s. Each
# would make "round robin" something else under a benchmark's 16K prefills, or a long prefill
# a broken stream. PD admission (1.11+) holds a request while the decode side's running window
# is full and answers 503 after --pd-admission-wait-secs (30 s); it has no off switch: the
# wait is made as long as the request timeout, so a full decode side queues as SGLang's own
# queue would.
SMG = RouterPackage(
    name="smg",
    module="smg.launch_router",
    import_name="smg",
    supported=">=1.1,<2",
    newest="1.13.0",
    policies=("random", "round_robin", "passthrough", "cache_aware", "power_of_two", "least_load",
              "manual", "consistent_hashing", "prefix_hash"),
    settings=(
        *_COMMON,
        Setting("disable-worker-overload-protection", True, "1.12",
                "no worker leaves the rotation for its queue or KV use"),
        Setting("worker-wedge-secs", 0, "1.12", "no worker left out for 3 s without a token"),
        Setting("worker-stall-secs", 86400, "1.12", "0 would veto at once: a day instead"),
        Setting("pd-admission-wait-secs", 1800, "1.11", "no 503 before the request timeout"),
        Setting("worker-stale-secs", 0, "1.13", "no worker left out for a quiet load stream"),
        Setting("idle-connection-timeout-secs", 0, "1.13", "idle client connections kept"),
        Setting("sse-keepalive-secs", 0, "1.13", "no comment frames in a silent stream"),
    ),
    tuned_by=_COMMON_TUNED_BY,
)

ROUTER_PACKAGES: Mapping[str, RouterPackage] = {"smg": SMG, "sglang-router": SGLANG_ROUTER}
"""In the order ``router.package: auto`` tries them on the router's node."""


def router_args(
    package: RouterPackage,
    given: Mapping[str, str | int | float | bool],
    version: str | None = None,
) -> dict[str, str | int | float | bool]:
    """The router's flags: the package's benchmark settings for ``version`` (None: the newest
    we read), then what the file gives (which wins; ``false`` removes a flag). A file that
    tunes a feature the settings switch off (any ``retry-*`` flag: retries) asked for it: that
    setting is dropped."""
    args = package.benchmark_args(version)
    for prefix, flag in package.tuned_by.items():
        if any(name.startswith(prefix) for name in given):
            args.pop(flag, None)
    args.update(given)
    return args


def version_problem(package: RouterPackage, version: str | None) -> str | None:
    """Why ``version`` of ``package`` is outside what we read (None: inside)."""
    from packaging.specifiers import SpecifierSet

    if version is None:
        return f"{package.name} is not installed for the router's Python"
    try:
        if Version(version) in SpecifierSet(package.supported):
            return None
    except InvalidVersion:
        pass
    return (
        f"it is {package.name} {version}, outside the versions whose /readiness and /metrics "
        f"we read ({package.name}{package.supported})"
    )


# -- what a deployment runs ------------------------------------------------------------------


@dataclass(frozen=True)
class Versions:
    """The SGLang profile and router package a plan is built for: assumed before bring-up
    (:func:`assumed`), then what the nodes answered (:mod:`pytest_kimi.deploy.versionprobe`)."""

    sglang: SGLangProfile
    router: RouterPackage
    router_version: str | None = None  # package metadata on the router's node; None: assumed
    router_source: str = "assumed"
    notes: tuple[str, ...] = ()

    def describe(self) -> str:
        """One line for dry runs, manifests and the terminal."""
        router = self.router.describe(self.router_version).replace(" (version unknown)", "")
        return f"{self.sglang.describe()}; router {router} ({self.router_source})"

    def to_dict(self) -> dict[str, object]:
        return {
            "sglang": self.sglang.version,
            "sglang_source": self.sglang.source,
            "router_package": self.router.name,
            "router_version": self.router_version,
            "router_source": self.router_source,
            "notes": list(self.notes),
        }


def package_of_module(module: str | None) -> str | None:
    """The router package a ``python -m`` module belongs to (``smg.launch_router``: smg), or
    None for another module (a site's own wrapper)."""
    top = (module or "").split(".")[0]
    return next((p.name for p in ROUTER_PACKAGES.values() if p.import_name == top), None)


def assumed(
    sglang_version: str | None, package: str, source: str = "", module: str | None = None
) -> Versions:
    """What a plan is built for before anything is asked: ``sglang_version`` (from ``source``:
    the option or field that gave it) or the newest profile; ``package``, or for auto the one
    ``module`` belongs to, else smg."""
    notes: list[str] = []
    if sglang_version is None:
        profile = SGLangProfile(NEWEST_SGLANG, "the newest profile")
    else:
        profile, notes = sglang_profile(sglang_version, source or "assumed")
    if package == "auto":
        named = package_of_module(module)
        if named is not None:
            return Versions(profile, ROUTER_PACKAGES[named], notes=tuple(notes),
                            router_source=f"router.module {module}")  # fmt: skip
        return Versions(profile, SMG, router_source="router.package: auto, smg assumed",
                        notes=tuple(notes))  # fmt: skip
    return Versions(profile, ROUTER_PACKAGES[package], router_source=f"router.package: {package}",
                    notes=tuple(notes))  # fmt: skip
