"""The cluster file's machines as pydantic models: ``nodes``, ``ssh``, ``slurm``, ``deployment``.

Where the servers run and how they are reached (SSH, or steps of a Slurm allocation), and how
the nodes form the default deployment's replicas. Part of the file's shape
(:mod:`pytest_kimi.config.models`).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import ConfigDict, Field

from pytest_kimi.config.fields import Argv, Count, Env, NodeName, Seconds, SecretName, Text, one_of
from pytest_kimi.config.strictmodel import StrictModel


class SSH(StrictModel):
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


class Slurm(StrictModel):
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


class NodeModel(StrictModel):
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


class Deployment(StrictModel):
    """How the nodes form replicas: the first replicas x nodes_per_replica nodes are used."""

    replicas: Count = Field(description="Data-parallel replicas behind the router.")
    nodes_per_replica: Count = Field(description="Nodes one replica spans.")
