"""What each workload point sends, read once per point: prompts, sessions or a trace.

The data behind a run's points (:class:`~pytest_kimi.config.inputs.Inputs`): SPEED-Bench
prompts (each distinct selection read once), a session workload's sessions (read or
generated) or a replayed trace's requests, each as a
:class:`~pytest_kimi.workload.dataset.Workload`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from pytest_kimi.config.options import Options
from pytest_kimi.config.points import Point

if TYPE_CHECKING:
    from collections.abc import Callable

    from pytest_kimi.config import ClusterConfig, WorkloadConfig
    from pytest_kimi.workload.dataset import Workload


def load_prompts(
    options: Options,
    cluster: ClusterConfig,
    run_points: tuple[Point, ...],
    configs: dict[str, str],
) -> dict[str, Workload]:
    """Each point's prompts (point id -> workload), each distinct selection read once;
    ``configs`` is each point's SPEED-Bench config."""
    from pytest_kimi.workload.dataset import load_workload

    path = dataset_path(options, cluster)
    loaded: dict[tuple, Workload] = {}
    out: dict[str, Workload] = {}
    for point in run_points:
        wl = point.apply(cluster.workload)
        config = configs[point.id]
        key = (wl.num_requests + wl.warmup_requests, wl.category, config, wl.api)
        if wl.sessions:
            out[point.id] = _timed(options, wl, session_workload(options, cluster, wl, path))
            continue
        if wl.kind == "trace":
            from pytest_kimi.workload.trace import load_trace

            speed = options.trace_speed or wl.trace_speed
            out[point.id] = load_trace(path, count=key[0], speed=speed)
            continue
        if key not in loaded:
            loaded[key] = load_workload(
                path,
                num_requests=key[0],
                seed=wl.seed,
                category=wl.category,
                config=config,
                prompt=options.prompt or wl.prompt,
                api=wl.api,
                tokenizer_dir=tokenizer_dir(options, cluster),
            )
        out[point.id] = _timed(options, wl, loaded[key])
    return out


BATCH_SEED_STEP = 1_000_003  # batch b's prompts are drawn with seed + b x this


def batch_prompts(
    options: Options, cluster: ClusterConfig, run_points: tuple[Point, ...],
    configs: dict[str, str],
) -> dict[str, list[Workload]]:  # fmt: skip
    """``--kimi-until-decided``: each point's batches after its planned requests (half as
    many again each: :func:`~pytest_kimi.results.sequential.batch_size`), drawn from the
    same rows as they were (same category, config and construction) with the seed moved on
    per batch. Each batch is its own draw, so prompts can repeat earlier batches' and, from
    a dataset with fewer rows than a batch, each other (the run's note counts them)."""
    from pytest_kimi.results.sequential import batch_size, batches_for
    from pytest_kimi.workload.dataset import load_workload

    assert options.until_decided is not None
    path = dataset_path(options, cluster)
    out: dict[str, list[Workload]] = {}
    for point in run_points:
        wl = point.apply(cluster.workload)
        size = batch_size(wl.num_requests)

        def sample(n: int, batch: int, wl: WorkloadConfig = wl, config: str = configs[point.id]
                   ) -> Workload:  # fmt: skip
            return load_workload(path, num_requests=n, seed=wl.seed + batch * BATCH_SEED_STEP,
                                 category=wl.category, config=config,
                                 prompt=options.prompt or wl.prompt, api=wl.api,
                                 tokenizer_dir=tokenizer_dir(options, cluster))  # fmt: skip

        count = batches_for(wl.num_requests, options.until_decided)
        out[point.id] = [_batch(sample, size, wl.num_requests, b) for b in range(1, count + 1)]
    return out


def _batch(
    sample: Callable[[int, int], Workload], size: int, planned: int, batch: int
) -> Workload:
    """Batch ``batch`` of ``size`` prompts; from a dataset of fewer rows, ``planned`` of them
    (as many as the planned run drew) repeated to ``size``."""
    from dataclasses import replace

    from pytest_kimi.workload.rows import DatasetError

    try:
        return sample(size, batch)
    except DatasetError:
        few = sample(planned, batch)
        return replace(few, prompts=(list(few.prompts) * -(-size // planned))[:size])


def _timed(options: Options, wl: WorkloadConfig, workload: Workload) -> Workload:
    """The workload with its recorded arrival list (``arrivals:``), if it has one: one
    instant per prompt or session, at ``--kimi-trace-speed`` over its ``trace_speed``."""
    if wl.arrivals is None:
        return workload
    from dataclasses import replace

    from pytest_kimi.workload.speedbench import DataFile, sha256_file
    from pytest_kimi.workload.trace import read_arrivals

    speed = options.trace_speed or wl.trace_speed
    offsets = read_arrivals(wl.arrivals, count=len(workload), speed=speed)
    files = (*workload.files, DataFile(wl.arrivals, sha256_file(wl.arrivals)))
    return replace(workload, arrivals_s=offsets, trace_speed=speed, files=files)


def session_workload(
    options: Options, cluster: ClusterConfig, wl: WorkloadConfig, path: Path
) -> Workload:
    """A session workload's sessions: from its dataset, or generated (``kind: agentic``)."""
    from pytest_kimi.workload.agentic import Agentic
    from pytest_kimi.workload.sessionset import load_sessions

    agentic = Agentic(turns=wl.turns, system_prompt_tokens=wl.system_prompt_tokens,
                      task_tokens=wl.task_tokens, tool_result_tokens=wl.tool_result_tokens)
    return load_sessions(
        wl.kind, path, count=wl.num_requests + wl.warmup_requests, seed=wl.seed,
        category=wl.category, agentic=agentic, prompt=options.prompt or wl.prompt,
        api=wl.api, tokenizer_dir=tokenizer_dir(options, cluster),
    )  # fmt: skip


def dataset_path(options: Options, cluster: ClusterConfig) -> Path:
    """``--kimi-dataset`` (relative to the current directory) over the cluster file's
    ``workload.dataset`` (relative to the cluster file)."""
    from pytest_kimi.workload.dataset import resolve_dataset

    if options.dataset:
        return resolve_dataset(options.dataset)
    return resolve_dataset(cluster.workload.dataset, cluster.path.parent)


def tokenizer_dir(options: Options, cluster: ClusterConfig) -> Path:
    """Where the served model's chat template is read from, on this machine: ``--kimi-tokenizer``,
    else the servers' ``tokenizer-path`` flag, else their ``model_path`` (``builtin:mock-tokenizer``
    is the shipped one). Only read when a chat template is asked for."""
    from pytest_kimi.config.serverargs import resolve_model_path

    if options.tokenizer:
        return Path(options.tokenizer).expanduser()
    given = cluster.server.args.get("tokenizer-path")
    value = given if isinstance(given, str) else cluster.server.model_path
    return Path(resolve_model_path(value)).expanduser()
