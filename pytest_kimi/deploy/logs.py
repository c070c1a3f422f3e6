"""Process logs: fetched in parallel, compressed, capped; old run folders on the nodes pruned.

A node's log can be gigabytes (``NCCL_DEBUG=INFO``), and what matters is usually at its
start (arguments, load) and its end (the error). So a log over the cap keeps its first and last
halves of the cap with one marker line between them saying how many bytes were cut; on SSH the
cutting and ``gzip`` happen on the node, so only the capped, compressed bytes travel.
Byte offsets into the original log (where teardown began: the log checks stop there) map onto
the capped copy with :meth:`Cut.map`.

Run folders (``<work_dir>/<run-id>``, named ``YYYYMMDD-HHMMSS-...`` by the store) of earlier
runs are removed at start, keeping the newest ``keep_runs`` and never the current one; only
folders of that shape, owned by the user running the command, are touched.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, TypeVar

MIB = 1024 * 1024
CHUNK = 1024 * 1024
# the store's run ids: 20260902-123051-<cluster>-dp2 (pytest_kimi.results.store.new_run_id)
H = TypeVar("H")
RUN_GLOB = "[0-9]" * 8 + "-" + "[0-9]" * 6 + "-*"


def marker(cut: int) -> str:
    """The line that stands where ``cut`` bytes were left out (bytes, as ``head -c`` counts)."""
    return f"\n[pytest-kimi: {cut} bytes cut here: the log was over its cap (logs.max_mib)]\n"


@dataclass(frozen=True)
class Cut:
    """Where a log of ``size`` bytes was cut: ``head`` bytes kept, ``cut`` left out, then the
    rest; ``cut == 0`` means the log was kept whole."""

    size: int
    head: int = 0
    cut: int = 0

    @classmethod
    def plan(cls, size: int, max_bytes: int) -> Cut:
        """Keep the first and last half of ``max_bytes`` of a ``size``-byte log."""
        if size <= max_bytes:
            return cls(size)
        head = max_bytes // 2
        return cls(size, head, size - head - (max_bytes - head))

    @property
    def tail(self) -> int:
        return self.size - self.head - self.cut

    def map(self, offset: int) -> int:
        """An offset into the original log as an offset into the capped copy; an offset
        inside the cut maps to the end of the marker line."""
        if self.cut == 0 or offset <= self.head:
            return offset
        kept = self.head + len(marker(self.cut).encode())
        return kept + max(0, offset - self.head - self.cut)


def cap_file(path: Path, max_bytes: int) -> Cut:
    """Cap ``path`` in place (head, marker, tail), streaming: never the whole log in memory."""
    size = path.stat().st_size
    cut = Cut.plan(size, max_bytes)
    if cut.cut == 0:
        return cut
    tmp = path.with_name(path.name + ".capping")
    with path.open("rb") as src, tmp.open("wb") as dst:
        _copy(src, dst, cut.head)
        dst.write(marker(cut.cut).encode())
        src.seek(cut.head + cut.cut)
        _copy(src, dst, cut.tail)
    tmp.replace(path)
    return cut


def _copy(src: BinaryIO, dst: BinaryIO, count: int) -> None:
    while count > 0:
        chunk = src.read(min(CHUNK, count))
        if not chunk:
            return
        dst.write(chunk)
        count -= len(chunk)


def capped_gzip_command(log: str, out: str, max_bytes: int) -> str:
    """Shell: write ``log`` capped (head, marker, tail) and gzipped to ``out``; print the
    log's size so the caller knows where it was cut (:meth:`Cut.plan` gives the same)."""
    q, o = shlex.quote(log), shlex.quote(out)
    head = max_bytes // 2
    tail = max_bytes - head
    mark = marker(0).replace(" 0 bytes", " %s bytes")
    return (
        f"s=$(stat -c %s {q}) || exit 1; "
        f'if [ "$s" -gt {int(max_bytes)} ]; then '
        f"{{ head -c {head} {q}; printf {shlex.quote(mark)} $((s - {max_bytes})); "
        f"tail -c {tail} {q}; }} | gzip -c >{o}; "
        f'else gzip -c {q} >{o}; fi && chmod 600 {o} && echo "$s"'
    )


def capped_cat_command(log: str, max_bytes: int) -> str:
    """Shell: ``log`` capped (head, marker, tail) to standard output, uncompressed (a log inside
    a container, read through the runtime's exec)."""
    q = shlex.quote(log)
    head = max_bytes // 2
    mark = marker(0).replace(" 0 bytes", " %s bytes")
    return (
        f"s=$(stat -c %s {q}) || exit 1; "
        f'if [ "$s" -gt {int(max_bytes)} ]; then head -c {head} {q}; '
        f"printf {shlex.quote(mark)} $((s - {max_bytes})); tail -c {max_bytes - head} {q}; "
        f"else cat {q}; fi"
    )


def prune_command(work_dir: str, keep: int, current: str) -> str:
    """Shell, run on a node at start: make ``work_dir`` (sticky and writable by all, like
    /var/tmp, when we create it: every run folder in it is 0700), then remove this user's run
    folders beyond the newest ``keep``, never ``current`` (the run starting now). Prints the
    folders removed."""
    w = shlex.quote(work_dir.rstrip("/") or "/")
    cur = shlex.quote(current)
    return (
        f"[ -d {w} ] || {{ mkdir -p {w} && chmod 1777 {w}; }} || exit 1; "
        f"cd {w} || exit 1; "
        f'for d in {RUN_GLOB}; do [ -d "$d" ] && [ -O "$d" ] && [ "$d" != {cur} ] '
        "&& printf '%s\\n' \"$d\"; done | LC_ALL=C sort -r "
        f"| tail -n +{max(0, int(keep)) + 1} "
        '| while IFS= read -r d; do rm -rf -- "$d" && printf \'pruned %s\\n\' "$d"; done; true'
    )


def parse_pruned(out: str) -> list[str]:
    """The run folders ``prune_command`` removed."""
    return [line[len("pruned ") :] for line in out.splitlines() if line.startswith("pruned ")]


def fetch_all(
    handles: Iterable[H],
    fetch: Callable[[H], Cut | None],
    node_of: Callable[[H], str],
    *,
    workers: int = 16,
) -> list[Cut | None]:
    """``fetch(handle)`` for every handle, nodes in parallel (at most ``workers`` at a time),
    one node's logs one after another (they share its SSH connection): 32 nodes' logs take about
    one log's time, not 32. Returns each handle's :class:`Cut` in order; a fetch that raises
    gives None (the fetch itself leaves a note in the log's file)."""
    items = list(handles)
    by_node: dict[str, list[int]] = {}
    for i, handle in enumerate(items):
        by_node.setdefault(node_of(handle), []).append(i)
    cuts: list[Cut | None] = [None] * len(items)

    def one_node(indices: list[int]) -> None:
        for i in indices:
            try:
                cuts[i] = fetch(items[i])
            except Exception:  # one log failing must not lose the others
                cuts[i] = None

    if by_node:
        with ThreadPoolExecutor(max_workers=max(1, min(workers, len(by_node)))) as pool:
            list(pool.map(one_node, by_node.values()))
    return cuts


def unzip_to(gz: Path, dest: Path) -> None:
    """Decompress ``gz`` into ``dest`` as a stream."""
    import gzip
    import shutil

    with gzip.open(gz, "rb") as src, dest.open("wb") as dst:
        shutil.copyfileobj(src, dst, CHUNK)
