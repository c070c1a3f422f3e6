"""The cluster file as pydantic models: the single description of what the YAML may hold.

These models check each field on its own (types, ranges, names, unknown keys) and are the
source of the published JSON Schema (``python -m pytest_kimi.config.schema``). Checks that relate
fields to each other, or need the SLO/baseline/mock parsers, live in
:mod:`pytest_kimi.config.checks`; :mod:`pytest_kimi.config.load` turns a validated model into
the frozen records callers use.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from pytest_kimi.config.fields import (
    APIS,
    CLOCK_STARTS,
    Argv,
    Count,
    Env,
    EnvNames,
    FlagChanges,
    Flags,
    GpuSelection,
    LayoutMap,
    LayoutName,
    Mount,
    NodeList,
    NodeName,
    NonNegative,
    Percentiles,
    Port,
    RequestRate,
    Seconds,
    SecretName,
    ShellLines,
    Sweep,
    Text,
    TextValue,
    one_of,
)

PROMPT_MODES = ("raw", "chat_template", "chat_template_or_raw")  # workload.prompts.PROMPT_MODES
# pytest_kimi.config.versions.ROUTER_PACKAGES, and auto
ROUTER_PACKAGES = ("auto", "smg", "sglang-router")

PYTHON = "Interpreter on the node; 'current' means the one running pytest (local clusters)."
WRAPPER = "argv put before python (not a container runtime: use 'container')."
SETUP = (
    "Shell lines run on the node before the command, in the same shell (conda activate, "
    "module load, source a venv); the first that fails stops the start."
)
ENV_FROM_LOCAL = (
    "NAMES of variables copied from the environment of the machine running pytest "
    "(secrets such as HF_TOKEN: never written in this file or anything we write)."
)


class _Model(BaseModel):
    """Strict: no coercion ("8" is not 8), unknown keys rejected, values frozen."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


class Container(_Model):
    """Run the process inside a container: exec into a running one, or run one from an image.

    The process is started, watched and stopped inside the container (docs/containers.md)."""

    runtime: one_of("docker", "podman", "apptainer", "singularity") = Field(
        description="Container runtime on the nodes."
    )
    mode: one_of("exec", "run") = Field(
        "exec", description="exec: into a running container; run: start one from 'image'."
    )
    name: NodeName | None = Field(
        None, description="exec: the running container (required); run: default kimi-<proc>."
    )
    image: Text | None = Field(None, description="run mode: the image (required there).")
    mounts: list[Mount] = Field(
        default_factory=list, description="run mode: SRC:DST[:ro] bind mounts."
    )
    gpus: GpuSelection = Field(
        "all", description="run mode: 'all', 'none' or a list of GPU indexes."
    )
    args: Argv = Field(default_factory=list, description="run mode: extra runtime flags.")
    executable: Text | None = Field(
        None, description="The runtime's CLI on the nodes; default: the runtime's name."
    )


ARGS = "Command-line flags without leading dashes: flag-name: value (true = a bare flag)."
ROUTER_ARGS = (
    ARGS + " Added to the benchmarking defaults (docs/cluster-file.md#router); false removes "
    "one; any retry-* or cb-* flag given turns the matching disable-* default off."
)
SLOS = "SLO limits by metric, e.g. ttft_p95: 25s, tpot_mean: 150ms, success_rate: 0.99."


class SSH(_Model):
    """How to reach a node over SSH. Secrets are never values here, only where to find them.
    A node's own ssh block overrides the cluster-wide one field by field."""

    user: Text = Field("root", description="Login user.")
    port: Annotated[int, Field(ge=1, le=65535)] = Field(22, description="sshd port.")
    key: Text | None = Field(None, description="Private key file.")
    passphrase_env: SecretName | None = Field(
        None, description="NAME of the environment variable holding the key's passphrase."
    )
    known_hosts: Text | None = Field(None, description="Default: ~/.ssh/known_hosts.")
    check_host_keys: bool = Field(True, description="Check host keys against known_hosts.")
    jump_host: Text | None = Field(None, description="[user@]host[:port] to hop through.")
    connect_timeout_s: Seconds = Field(10.0, description="Seconds to wait for a connection.")
    command_timeout_s: Seconds = Field(120.0, description="Seconds one remote command may take.")
    reconnect_s: Seconds = Field(
        60.0,
        description="While bringing up and running: how long a node that stopped answering is "
        "retried (reconnects with back-off 0.5, 1, 2 ... 8 s) before it is lost.",
    )
    teardown_reconnect_s: Seconds = Field(
        300.0,
        description="At teardown: how long a node that stopped answering is retried before "
        "its processes are reported unverifiable (a blip must not leave its GPUs serving).",
    )


class Slurm(_Model):
    """executor: slurm: one allocation per layout (salloc), each node's server a step in it
    (srun). Flags the cluster needs that are not fields here go in salloc_args / srun_args."""

    partition: Text | None = Field(None, description="--partition of the allocation.")
    account: Text | None = Field(None, description="--account to charge.")
    time: Text = Field("04:00:00", description="--time: the allocation's limit (it ends it).")
    gres: Text | None = Field(None, description="--gres per node, e.g. gpu:8.")
    gpus_per_node: Annotated[int, Field(ge=1)] | None = Field(
        None, description="--gpus-per-node (instead of gres on clusters that count GPUs so)."
    )
    constraint: Text | None = Field(None, description="--constraint (node features).")
    reservation: Text | None = Field(None, description="--reservation to run in.")
    exclusive: bool = Field(True, description="--exclusive: whole nodes, nobody else's jobs.")
    job_name: Text = Field("pytest-kimi", description="Job name prefix (the layout is added).")
    salloc_args: Argv = Field(default_factory=list, description="More salloc flags, as argv.")
    srun_args: Argv = Field(default_factory=list, description="More srun flags, as argv.")
    router: one_of("node", "submit_host") = Field(
        "node",
        description="node: the router runs as a step on router.node (a node of the layout); "
        "submit_host: here, on the machine running pytest, outside the allocation.",
    )
    queue_timeout_s: Seconds | None = Field(
        None,
        description="Seconds the allocation may wait in the queue (salloc --immediate) before "
        "the layout fails (default: startup_timeout_s); the wait is reported apart from "
        "bring-up time, which startup_timeout_s bounds once the nodes are ours.",
    )


class NodeModel(_Model):
    """One machine of the cluster (a local process group on the mock)."""

    model_config = ConfigDict(title="Node")

    name: NodeName = Field(description="Unique plain name (letters, digits, . _ -).")
    host: Text = Field(description="SSH target: address, host name or ~/.ssh/config alias.")
    addr: Text | None = Field(
        None,
        description="Data-network address: servers bind it and peers, the router and the "
        "client connect to it. Default: resolved on the node at bring-up (network.interface's "
        "IPv4 address, else what the node's hostname resolves to there); loopback is refused.",
    )
    gpus: Count = Field(description="GPUs on the node; the same on every deployed node.")
    ssh: SSH = Field(default_factory=SSH, description="Overrides of the cluster's ssh defaults.")
    env: Env = Field(default_factory=dict, description="This node's extra server environment.")


class Deployment(_Model):
    """How the nodes form replicas: the first replicas x nodes_per_replica nodes are used."""

    replicas: Count = Field(description="Data-parallel replicas behind the router.")
    nodes_per_replica: Count = Field(description="Nodes one replica spans.")


class LayoutRouter(_Model):
    """The router of one layout: what differs from ``router``."""

    node: NodeName | None = Field(None, description="Node the router runs on; default router.node.")
    policy: Text | None = Field(None, description="Load-balancing policy; default router.policy.")
    args: FlagChanges = Field(
        default_factory=dict,
        description="Router flags merged over router.args; a value of null removes one.",
    )


# every supported release's choices (pytest_kimi.config.versions: which release has which, checked
# against the release the nodes run at bring-up)
TRANSFER_BACKENDS = ("mooncake", "nixl", "ascend", "fake", "mori", "mooncake_tcp")
ROUTER_POLICIES = ("random", "round_robin", "passthrough", "cache_aware", "power_of_two",
                   "least_load", "manual", "consistent_hashing", "prefix_hash")  # fmt: skip


class PDSideModel(_Model):
    """One side of a prefill/decode disaggregated layout: its servers run with SGLang's
    ``--disaggregation-mode prefill`` (or ``decode``), with their own parallel sizes, replicas,
    nodes and flags. The prefill side's replicas take the layout's first nodes, in order."""

    model_config = ConfigDict(title="PD side")

    tp: Count = Field(description="Tensor-parallel size of this side's replicas.")
    pp: Count = Field(1, description="Pipeline-parallel size.")
    ep: Count = Field(1, description="Expert-parallel size; must divide tp.")
    replicas: Count = Field(1, description="Replicas of this side behind the router.")
    nodes_per_replica: Count = Field(description="Nodes one of its replicas spans.")
    args: FlagChanges = Field(
        default_factory=dict,
        description="Server flags of this side, over server.args and the layout's args; "
        "a value of null removes one.",
    )
    env: Env = Field(default_factory=dict, description="Environment over the layout's.")
    policy: one_of(*ROUTER_POLICIES, "bucket") | None = Field(
        None,
        description="The router's policy for this side (--prefill-policy / --decode-policy; "
        "bucket: prefill only); default: the layout's router.policy, else router.policy.",
    )
    bootstrap_port: Port | None = Field(
        None,
        description="prefill: the port of each replica's KV bootstrap server "
        "(--disaggregation-bootstrap-port); default SGLang's 8998 on an ssh cluster, 'auto' on "
        "a local one (its replicas share one host).",
    )


class LayoutModel(_Model):
    """One configuration to measure: a parallel layout of one replica (TP x PP must equal the
    replica's GPUs) and whatever else differs from the cluster's defaults; or, with
    ``prefill`` and ``decode`` instead of ``tp``, a prefill/decode disaggregated deployment."""

    model_config = ConfigDict(
        title="Layout",
        json_schema_extra={"anyOf": [{"required": ["tp"]}, {"required": ["prefill", "decode"]}]},
    )

    tp: Count | None = Field(
        None, description="Tensor-parallel size (required, unless prefill and decode are set)."
    )
    pp: Count = Field(1, description="Pipeline-parallel size.")
    ep: Count = Field(1, description="Expert-parallel size; must divide tp.")
    prefill: PDSideModel | None = Field(
        None, description="Prefill side of a disaggregated layout (with decode, not tp)."
    )
    decode: PDSideModel | None = Field(
        None, description="Decode side of a disaggregated layout (with prefill, not tp)."
    )
    transfer_backend: one_of(*TRANSFER_BACKENDS) = Field(
        "mooncake",
        description="Disaggregated layouts: the KV transfer backend of both sides "
        "(--disaggregation-transfer-backend).",
    )
    slo: dict[str, TextValue] = Field(
        default_factory=dict, description="SLOs for this layout only (override the cluster's)."
    )
    args: FlagChanges = Field(
        default_factory=dict,
        description="Server flags merged over server.args; a value of null removes one.",
    )
    env: Env = Field(default_factory=dict, description="Server environment over server.env.")
    nodes: Annotated[list[NodeName], NodeList] | None = Field(
        None, description="Names of the nodes this layout runs on, in order; default: all."
    )
    replicas: Count | None = Field(None, description="Replicas; default deployment.replicas.")
    nodes_per_replica: Count | None = Field(
        None, description="Nodes one replica spans; default deployment.nodes_per_replica."
    )
    router: LayoutRouter = Field(default_factory=LayoutRouter, description=LayoutRouter.__doc__)


class Server(_Model):
    """How to start one SGLang server process on a node."""

    python: Text = Field("python3", description=PYTHON)
    module: Text = Field("sglang.launch_server", description="Module run with python -m.")
    model_path: Text = Field(description="Model directory on the nodes (--model-path).")
    sglang_version: Text | None = Field(
        None,
        description="The SGLang release the servers run, e.g. 0.5.23: what a dry run builds "
        "command lines for and the release the mock answers as (0.5.9 or 0.5.23); bring-up "
        "asks the nodes and says so where they run another. Default: the newest supported.",
    )
    wrapper: Argv = Field(default_factory=list, description=WRAPPER)
    port: Port = Field("auto", description="HTTP port; 'auto' picks a free one (local only).")
    dist_init_port: Port = Field("auto", description="torch.distributed init port, or 'auto'.")
    args: Flags = Field(default_factory=dict, description=ARGS)
    env: Env = Field(default_factory=dict, description="Extra environment of every server.")
    env_from_local: EnvNames = Field(default_factory=list, description=ENV_FROM_LOCAL)
    setup: ShellLines = Field(default_factory=list, description=SETUP)
    container: Container | None = Field(None, description=Container.__doc__)


class Router(_Model):
    """How to start the SGLang Router in front of the replicas."""

    python: Text = Field("python3", description=PYTHON)
    package: one_of(*ROUTER_PACKAGES) = Field(
        "auto",
        description="The router package: smg (maintained) or sglang-router (0.3, its "
        "predecessor); auto: whichever the router node's Python has, smg first.",
    )
    module: Text | None = Field(
        None, description="Module run with python -m; default: the package's launcher."
    )
    node: NodeName | None = Field(None, description="Node the router runs on; default: the first.")
    port: Port = Field("auto", description="HTTP port clients use, or 'auto' (local only).")
    prometheus_port: Port = Field("auto", description="Router metrics port, or 'auto'.")
    policy: Text = Field("round_robin", description="Load-balancing policy (--policy).")
    args: Flags = Field(default_factory=dict, description=ROUTER_ARGS)
    env: Env = Field(default_factory=dict, description="Extra environment of the router.")
    wrapper: Argv = Field(default_factory=list, description=WRAPPER)
    model_mount: Text | None = Field(
        None, description="The model dir the router reads its tokenizer from."
    )
    env_from_local: EnvNames = Field(default_factory=list, description=ENV_FROM_LOCAL)
    setup: ShellLines = Field(default_factory=list, description=SETUP)
    container: Container | None = Field(None, description=Container.__doc__)
    allow_unknown_version: bool = Field(
        False,
        description="Start a router outside the versions whose /readiness and /metrics we "
        "read (a note says so) instead of refusing before launch.",
    )


class Goodput(_Model):
    """Per-request limits for goodput (vLLM --goodput): a request counts if it meets all."""

    ttft: TextValue | None = Field(None, description="Time to first token, e.g. 30s.")
    tpot: TextValue | None = Field(None, description="Time per output token, e.g. 200ms.")
    e2e: TextValue | None = Field(None, description="End-to-end latency, e.g. 60s.")


_SWEEP = "; a list sweeps it: one workload point per value (docs/cluster-file.md)."


class Workload(_Model):
    """The benchmark workload: SPEED-Bench rows, lengths, concurrency."""

    dataset: Text = Field(
        description="SPEED-Bench data (relative to this file): a .jsonl or .parquet file, a "
        "local snapshot directory of nvidia/SPEED-Bench, or builtin:NAME."
    )
    speedbench_config: Text = Field(
        "throughput_16k",
        description="Config read from a snapshot directory, as its dataset card's configs: "
        "name them (qualitative, throughput_1k .. throughput_32k).",
    )
    prompt: one_of(*PROMPT_MODES) = Field(
        "raw",
        description="What is sent: raw (the first turn as is) or chat_template (the first turn "
        "in the served model's chat template, as SGLang's SPEED-Bench loader); "
        "chat_template_or_raw falls back to raw when the tokenizer has no template.",
    )
    num_requests: Sweep[Count] = Field(description="Measured requests per layout" + _SWEEP)
    input_len: Sweep[Count] = Field(description="Nominal prompt length in tokens" + _SWEEP)
    output_len: Sweep[Count] = Field(description="Tokens generated per request" + _SWEEP)
    concurrency: Sweep[Count] = Field(description="Requests in flight at once" + _SWEEP)
    warmup_requests: NonNegative = Field(1, description="Unmeasured requests sent first.")
    api: Sweep[one_of(*APIS)] = Field(
        "generate", description="Server API the client calls" + _SWEEP
    )
    clock_start: one_of(*CLOCK_STARTS) = Field(
        "request",
        description="Where TTFT and E2E start: request (before the request is issued, "
        "connecting included: sglang.bench_serving's definition) or send (when its first byte "
        "is written, once connected).",
    )
    seed: NonNegative = Field(0, description="Seed of row selection and arrivals.")
    category: Sweep[Text] | None = Field(
        None, description="Only SPEED-Bench rows of this category" + _SWEEP
    )
    request_timeout_s: Seconds = Field(3600.0, description="Seconds one request may take.")
    request_rate: Sweep[RequestRate] = Field(
        "inf",
        description="Requests/s (Poisson arrivals); 'inf': as fast as concurrency allows" + _SWEEP,
    )
    percentiles: Percentiles = Field(
        default_factory=lambda: [50.0, 90.0, 95.0, 99.0], description="Percentiles reported."
    )
    goodput: Goodput = Field(default_factory=Goodput, description=Goodput.__doc__)


def _profile_schema(schema: dict[str, Any]) -> None:
    """List the mock profile's fields (from the dataclass the mock reads) for editors."""
    from dataclasses import MISSING, fields

    from pytest_kimi.config.profile import Profile

    schema["properties"] = {
        f.name: {"type": "integer" if f.type == "int" else "number", "minimum": 0}
        | ({"default": f.default} if f.default is not MISSING else {})
        for f in fields(Profile)
    }
    schema["additionalProperties"] = False


class Mock(_Model):
    """Embedded mock backend settings: time scale, seed and performance profile."""

    time_scale: Seconds = Field(1.0, description="Cluster seconds per wall second.")
    seed: NonNegative = Field(0, description="Seed of the mock's jitter and faults.")
    profile: dict[str, Any] = Field(
        default_factory=dict,
        description="Hardware and model numbers of the performance model (docs/mock.md).",
        json_schema_extra=_profile_schema,
    )


class Telemetry(_Model):
    """GPU telemetry during the measured run: nvidia-smi on every node, every interval_s."""

    enabled: bool = Field(True, description="Sample the nodes' GPUs into telemetry.jsonl.")
    interval_s: Seconds = Field(
        5.0, description="Wall seconds (on the machine running pytest) between samples."
    )


class Preflight(_Model):
    """GPU pre-flight: before anything starts, every node's GPUs are counted and must be idle."""

    enabled: bool = Field(True, description="Check every node's GPUs before launch.")
    busy_memory_mib: Annotated[float, Field(ge=0)] = Field(
        2048.0, description="A GPU with more memory used than this (MiB) is busy."
    )


class Network(_Model):
    """The data network: socket interface of Gloo/NCCL, and the pre-flight reachability check."""

    interface: Text | None = Field(
        None,
        description="Interface of the data network (e.g. eth0, ib0): sets GLOO_SOCKET_IFNAME "
        "and NCCL_SOCKET_IFNAME of every server (server.env / a node's env win), and is where "
        "an absent addr is read from.",
    )
    preflight: bool = Field(
        True, description="Check addresses and TCP reachability between the nodes before launch."
    )
    probe_timeout_s: Seconds = Field(3.0, description="Seconds one TCP probe may wait.")
    client: Literal["direct", "ssh_forward", "on_node"] = Field(
        "direct",
        description="How this machine reaches the nodes' HTTP ports (health, warm-up, metrics, "
        "the benchmark): direct, or ssh_forward (local port forwards over each node's SSH "
        "connection, through ssh.jump_host if set: for a bastion as the only way in), or "
        "on_node (the benchmark client runs on network.client_node and times the requests "
        "there, over the cluster network; everything else goes as with ssh_forward).",
    )
    client_node: NodeName | None = Field(
        None,
        description="With client: on_node, the node the benchmark client runs on; default: "
        "the router's node.",
    )
    client_python: Argv = Field(
        default_factory=list,
        description="With client: on_node, the Python that runs the client on that node (it "
        "needs 3.11+ with httpx and orjson, as SGLang's environment has); default: server.python. "
        "Required when the servers run in a container: the client runs on the node itself.",
    )


class Watchdog(_Model):
    """While a layout is measured: every node process's exit status and the router's worker
    count, polled; a lost worker stops the run at once, naming the node."""

    enabled: bool = Field(True, description="Watch the deployment while it is measured.")
    interval_s: Seconds = Field(
        15.0, description="Wall seconds (on the machine running pytest) between polls."
    )
    misses: Annotated[int, Field(ge=1)] = Field(
        2,
        description="Polls in a row a node or the router may go unanswered, or the router "
        "count a worker short, before the run is stopped (an exited process stops it at once).",
    )


class Locks(_Model):
    """A lock on every node (SSH clusters) held for a deployment's lifetime, so a second run
    on the same nodes is refused at once, naming who holds them."""

    enabled: bool = Field(True, description="Lock every node while a layout is deployed.")
    dir: Text | None = Field(
        None,
        description="Directory on each node for the lock files, one per machine "
        "(<hostname>.lock; default: <work_dir>/locks). Runs by different users exclude each "
        "other only if they share this directory (one all of them can write).",
    )


class Logs(_Model):
    """Process logs: fetched capped at max_mib (head and tail kept), old run folders pruned."""

    max_mib: Annotated[float, Field(gt=0)] = Field(
        64.0,
        description="Largest log fetched per process (MiB); a longer one keeps its first and "
        "last halves with a line saying how much was cut.",
    )
    keep_runs: NonNegative = Field(
        10, description="Run folders kept in work_dir on each node; older ones removed at start."
    )
    tail_report_s: Annotated[float, Field(ge=0)] = Field(
        60.0,
        description="While a layout is measured: wall seconds (on the machine running pytest) "
        "between reports of each process's last log line, shown only when it changed since "
        "the previous report; 0 turns them off.",
    )


class ClusterFile(_Model):
    """A pytest-kimi cluster file: nodes, how to start SGLang and the router, the layouts,
    the workload and the SLOs. See docs/cluster-file.md."""

    model_config = ConfigDict(title="pytest-kimi cluster file")

    name: Text = Field(description="Cluster name, shown in reports.")
    executor: one_of("local", "ssh", "slurm") = Field(
        "local",
        description="local: processes on this machine; ssh: on the nodes over SSH; slurm: "
        "steps of a Slurm allocation (salloc, srun) on the nodes.",
    )
    work_dir: Text = Field(
        "/var/tmp/pytest-kimi",
        description="On each node: logs and exit codes of our processes (/var/tmp survives a "
        "reboot; /tmp may not).",
    )
    ssh: SSH = Field(default_factory=SSH, description="SSH defaults for every node.")
    slurm: Slurm | None = Field(None, description=Slurm.__doc__)
    nodes: Annotated[list[NodeModel], NodeList] = Field(
        description="The machines, in order.", json_schema_extra={"minItems": 1}
    )
    deployment: Deployment = Field(description=Deployment.__doc__)
    layouts: Annotated[dict[LayoutName, LayoutModel], LayoutMap] = Field(
        description="Parallel layouts by name (the --layout choices).",
        json_schema_extra={"minProperties": 1},
    )
    server: Server = Field(description=Server.__doc__)
    router: Router = Field(description=Router.__doc__)
    workload: Workload = Field(description=Workload.__doc__)
    slo: dict[str, TextValue] = Field(default_factory=dict, description=SLOS)
    regression: dict[str, TextValue] = Field(
        default_factory=dict,
        description="Regression gate thresholds by metric, e.g. ttft_p95: 10% (or 0.1).",
    )
    history: Text | None = Field(
        None,
        description="History file (SQLite) every run is appended to, relative to this file; "
        "--kimi-history overrides it. Read it with python -m pytest_kimi.judge.history.",
    )
    mock: Mock | None = Field(None, description="Present for the embedded mock backend.")
    startup_timeout_s: Seconds = Field(900.0, description="Seconds a deployment may take to start.")
    startup_stall_s: Seconds = Field(
        600.0,
        description="A process still starting whose log has not grown for this many seconds "
        "(while it runs) fails the bring-up as stalled.",
    )
    startup_report_s: Seconds = Field(
        60.0, description="Seconds between bring-up reports (each process's state, last log line)."
    )
    logs: Logs = Field(default_factory=Logs, description=Logs.__doc__)
    deployment_max_s: Seconds = Field(
        43200.0,
        description="SSH: the longest any process on the nodes may live (a dead man's switch: "
        "coreutils timeout on each node, TERM then KILL 30 s later), so a killed harness cannot "
        "leave the cluster busy for ever. Size it above bring-up plus the longest run.",
    )
    telemetry: Telemetry = Field(default_factory=Telemetry, description=Telemetry.__doc__)
    preflight: Preflight = Field(default_factory=Preflight, description=Preflight.__doc__)
    network: Network = Field(default_factory=Network, description=Network.__doc__)
    watchdog: Watchdog = Field(default_factory=Watchdog, description=Watchdog.__doc__)
    locks: Locks = Field(default_factory=Locks, description=Locks.__doc__)
    nvidia_smi: Argv = Field(
        default_factory=list,
        description="The nvidia-smi to run on the nodes, as argv (default: [nvidia-smi]; "
        "ignored on the embedded mock, which ships a stand-in).",
    )
