"""The offline twin of a cluster file's benchmark: same prompts, same deployment, same figures.

:func:`pytest_kimi.mock.twin.simulate` takes bare numbers; this module takes them from a
cluster file the way a run does, so the calibration tool (:mod:`pytest_kimi.mock.calibrate`)
and tests predict exactly what the mission's command on the mock would measure:

* prompt lengths are the real token counts of the run's prompts: the workload's dataset,
  seed, category and prompt construction (:func:`pytest_kimi.workload.dataset.load_workload`,
  as :func:`pytest_kimi.config.inputs.load_inputs` calls it), counted by the mock's tokenizer as the
  mock server counts them; the first ``warmup_requests`` prompts are the warm-up and are not
  measured (the twin starts from an idle, warmed deployment, as the measured part does);
* parallelism from ``layouts:``, replicas from ``deployment:``, GPUs per node from ``nodes:``,
  chunk size from ``server.args``, concurrency and lengths from ``workload:``;
* figures through :func:`pytest_kimi.results.metrics.summarize`, the product's own definitions, on
  records built from the simulation's ground truth (send = arrival, with ``reaction_s`` 0).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from pytest_kimi.config import ClusterConfig
from pytest_kimi.mock.args import MockArgs
from pytest_kimi.mock.perfmodel import Profile
from pytest_kimi.mock.speculative import Speculation
from pytest_kimi.mock.twin import Side, TwinRun, simulate, simulate_pd
from pytest_kimi.results.metrics import summarize
from pytest_kimi.results.records import Chunk, RequestRecord
from pytest_kimi.results.summary import Summary


@dataclass(frozen=True)
class Deployment:
    """What the twin needs of one layout's deployment and workload."""

    tp: int
    pp: int
    ep: int
    gpus_per_node: int
    replicas: int
    num_requests: int
    output_len: int
    concurrency: int
    chunk_size: int
    seed: int
    spec: Speculation | None = None  # the layout's speculative decoding, as its servers get it
    max_running: int | None = None  # --max-running-requests as resolved (None: the profile's)


def server_flags(cluster: ClusterConfig, layout: str) -> MockArgs:
    """The flags ``layout``'s servers get, parsed and resolved as the mock server does
    (SGLang's defaults: speculative decoding's parameters and running-request limit)."""
    from pytest_kimi.config.serverargs import flags
    from pytest_kimi.mock.args import parse_args

    lay = cluster.layout(layout)
    argv = ["--model-path", "-", "--tp-size", str(lay.tp), "--pp-size", str(lay.pp),
            *flags(cluster.server_args(lay))]  # fmt: skip
    return parse_args(argv)


def unified_layouts(cluster: ClusterConfig) -> list[str]:
    """The layouts a run measures by default whose replicas serve requests whole (what the
    seed measured, and what :func:`deployment` describes); a disaggregated one is
    :func:`pd_sides`'s, one run only when named (``default: false``) is left out."""
    return [name for name, lay in cluster.layouts.items()
            if lay.default and not lay.disaggregated]  # fmt: skip


def pd_sides(cluster: ClusterConfig, layout: str) -> tuple[Side, Side]:
    """A disaggregated layout's prefill and decode sides, for :func:`simulate_pd`."""
    lay = cluster.layout(layout)
    if not lay.disaggregated:
        raise ValueError(f"{layout}: not a disaggregated layout")
    gpus = min(n.gpus for n in cluster.used_nodes(lay))
    prefill, decode = (Side(s.tp, s.pp, s.ep, s.nodes_per_replica, s.replicas, gpus)
                       for s in lay.sides)  # fmt: skip
    return prefill, decode


def simulate_pd_layout(cluster: ClusterConfig, layout: str, input_lens: Sequence[int]) -> TwinRun:
    """A disaggregated layout's measured run, offline (as the live mock plays it)."""
    prefill, decode = pd_sides(cluster, layout)
    wl, lay = cluster.workload, cluster.layout(layout)
    chunk = cluster.server_args(lay, lay.sides[0]).get("chunked-prefill-size", 8192)
    return simulate_pd(
        profile_of(cluster), prefill=prefill, decode=decode, num_requests=wl.num_requests,
        input_lens=input_lens, output_len=wl.output_len, concurrency=wl.concurrency,
        chunk_size=int(chunk), seed=cluster.mock.seed if cluster.mock else 0,
    )  # fmt: skip


def deployment(cluster: ClusterConfig, layout: str) -> Deployment:
    """``layout``'s deployment as the cluster file describes it (KeyError names known ones)."""
    lay = cluster.layout(layout)
    if lay.disaggregated:
        raise ValueError(f"{layout}: the mock's twin has no model of prefill/decode "
                         "disaggregation (a KV hand-off between servers)")  # fmt: skip
    wl = cluster.workload
    chunk = cluster.server_args(lay).get("chunked-prefill-size", 8192)
    flags = server_flags(cluster, layout)
    return Deployment(
        tp=lay.tp,
        pp=lay.pp,
        ep=lay.ep,
        gpus_per_node=min(n.gpus for n in cluster.used_nodes(lay)),
        replicas=cluster.replicas_of(lay),
        num_requests=wl.num_requests,
        output_len=wl.output_len,
        concurrency=wl.concurrency,
        chunk_size=int(chunk),
        seed=cluster.mock.seed if cluster.mock else 0,
        spec=flags.speculation,
        max_running=flags.max_running_requests,
    )


def profile_of(cluster: ClusterConfig) -> Profile:
    """The cluster file's ``mock.profile`` (defaults where it has none)."""
    return Profile.from_mapping(cluster.mock.profile if cluster.mock else {})


def mission_input_lens(cluster: ClusterConfig) -> list[int]:
    """Prompt token counts of the measured requests, in the order they are sent, counted as
    the mock server counts a ``/generate`` text or a chat turn (whitespace-split words of its
    tokenizer)."""
    from pytest_kimi.mock.tokenizer_files import count_tokens

    return [count_tokens(text) for text in mission_prompts(cluster)]


def mission_prompts(cluster: ClusterConfig) -> list[str]:
    """The measured requests' prompts as sent, in order: the same selection and construction
    as a run (``load_inputs``)."""
    from pytest_kimi.config.serverargs import resolve_model_path
    from pytest_kimi.workload.dataset import load_workload, resolve_dataset

    wl = cluster.workload
    tokenizer = cluster.server.args.get("tokenizer-path")
    tokenizer = tokenizer if isinstance(tokenizer, str) else cluster.server.model_path
    workload = load_workload(
        resolve_dataset(wl.dataset, cluster.path.parent),
        num_requests=wl.num_requests + wl.warmup_requests,
        seed=wl.seed,
        category=wl.category,
        config=wl.speedbench_config,
        prompt=wl.prompt,
        api=wl.api,
        tokenizer_dir=Path(resolve_model_path(tokenizer)).expanduser(),
    )
    return [p.text for p in workload.prompts[wl.warmup_requests :]]


def simulate_deployment(
    profile: Profile, dep: Deployment, input_lens: Sequence[int], *, reaction_s: float = 0.0,
    prompts: Sequence[str] = (),
) -> TwinRun:  # fmt: skip
    """One layout's measured run, offline; ``prompts`` (as sent) set speculative decoding's
    acceptance where the layout speculates."""
    return simulate(
        profile,
        tp=dep.tp,
        pp=dep.pp,
        ep=dep.ep,
        gpus_per_node=dep.gpus_per_node,
        replicas=dep.replicas,
        num_requests=dep.num_requests,
        input_lens=input_lens,
        output_len=dep.output_len,
        concurrency=dep.concurrency,
        chunk_size=dep.chunk_size,
        seed=dep.seed,
        reaction_s=reaction_s,
        spec=dep.spec,
        prompts=prompts,
        max_running=dep.max_running,
    )


def twin_records(run: TwinRun, *, chunks: bool = True) -> list[RequestRecord]:
    """The records a perfect client (no network, no turnaround) would have written: send at
    arrival, one chunk per token at its cluster time (time scale 1). ``chunks=False`` leaves
    the per-token chunks out (ITL then unmeasured; every other figure is the same, faster)."""
    records = []
    for i, req in enumerate(sorted(run.requests, key=lambda r: (r.arrival, r.rid))):
        records.append(
            RequestRecord(
                index=i,
                prompt_id=req.rid,
                nominal_input_tokens=req.prompt_tokens,
                max_output_tokens=req.max_new_tokens,
                send_time=req.arrival,
                start_time=req.arrival,
                first_token_time=req.first_token_at,
                end_time=req.finished_at,
                chunks=_chunks(req.token_times) if chunks else [],
                prompt_tokens=req.prompt_tokens,
                completion_tokens=req.generated,
                success=req.finished_at is not None,
                first_answer_time=req.first_token_at,
                spec_verify_ct=req.drafts.verify_ct if req.drafts is not None else None,
            )
        )
    return records


def _chunks(token_times: Sequence[float]) -> list[Chunk]:
    """One chunk per instant tokens came out (several at once under speculative decoding)."""
    return [Chunk(t, len(list(group))) for t, group in itertools.groupby(token_times)]


def summarize_twin(
    run: TwinRun, percentiles: Sequence[float] = (50, 90, 95, 99), *, itl: bool = True
) -> Summary:
    """The run's :class:`~pytest_kimi.results.summary.Summary`, by the product's own definitions
    (``Summary.to_dict()`` gives bench_serving's keys: ``mean_ttft_ms``, ``p95_tpot_ms``...).
    ``itl=False``: inter-token latencies left unmeasured (a fit's inner loop does not need them)."""
    records = twin_records(run, chunks=itl)
    return summarize(records, time_scale=1.0, percentiles=percentiles)


def simulate_sessions_layout(cluster: ClusterConfig, layout: str, workload: str) -> list:
    """A session workload (``workloads:`` name) on ``layout``, offline: the same sessions,
    warm-up, think times and chat template as a run, the layout's router policy, and each
    replica's prefix cache as its flags set it (``--disable-radix-cache``,
    ``--max-total-tokens``); its measured turns (``sessiontwin.TwinTurn``)."""
    from pytest_kimi.config.cluster import merged
    from pytest_kimi.config.options import Options
    from pytest_kimi.config.pointdata import dataset_path, session_workload
    from pytest_kimi.mock.perfmodel import CostModel
    from pytest_kimi.mock.prefixreuse import PrefixReuse
    from pytest_kimi.mock.routermodel import router_model
    from pytest_kimi.mock.scheduler import ReplicaSim
    from pytest_kimi.mock.sessiontwin import SessionPlan, simulate_sessions
    from pytest_kimi.mock.wire.info import max_total_tokens
    from pytest_kimi.workload.sessions import ThinkTime
    from pytest_kimi.workload.specs import ClientOptions

    wl, lay = cluster.named_workload(workload), cluster.layout(layout)
    dep = deployment(cluster, layout)
    options = Options(cluster_path=cluster.path, layouts=(layout,), report_dir=Path("."))
    loaded = session_workload(options, cluster, wl, dataset_path(options, cluster))
    render = ClientOptions(chat_template=loaded.chat_template).render
    n = wl.warmup_requests
    plan = SessionPlan(sessions=loaded.sessions[n:], render=render, output_len=wl.output_len,
                       warmup=[render(s.messages(0, [])) for s in loaded.sessions[:n]],
                       concurrency=wl.concurrency, seed=wl.seed,
                       think=ThinkTime(wl.think_time_s, wl.think_time_kind))  # fmt: skip
    flags, profile = server_flags(cluster, layout), profile_of(cluster)
    sims = [
        ReplicaSim(CostModel(profile, tp=dep.tp, pp=dep.pp, ep=dep.ep,
                             gpus_per_node=dep.gpus_per_node), chunk_size=dep.chunk_size,
                   max_running=dep.max_running or profile.max_running_requests,
                   seed=dep.seed + i, jitter=profile.jitter, spec=dep.spec,
                   cache=None if flags.disable_radix_cache else PrefixReuse(
                       max_total_tokens(flags.wire, flags.max_total_tokens),
                       whole_answer=flags.wire == "0.5.9"))
        for i in range(dep.replicas)
    ]  # fmt: skip
    router_flags = merged(cluster.router.args, lay.router_args)
    router = router_model(cluster.router_policy(lay), len(sims), router_flags,
                          cluster.router.package)  # fmt: skip
    return simulate_sessions(plan, sims, router)
