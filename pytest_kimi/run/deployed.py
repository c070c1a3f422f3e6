"""What each layout's deployment left the run, kept per layout name for measuring it.

A deployment we bring up leaves its plan, the watchdog's cancel hook, how its nodes' URLs are
reached from here (``network.client``) and, with ``network.client: on_node``, the client on a
node; an attached one (``--kimi-endpoint``) what the endpoint serves. From these, each
measured point gets its :class:`~pytest_kimi.run.measure.Target` and, on a local mock run, the
shared cluster clock; and a point after the watchdog found the deployment lost is not measured.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pytest_kimi.run.measure import Target, replica_endpoints

if TYPE_CHECKING:
    from pytest_kimi.deploy.attached import Attached
    from pytest_kimi.deploy.clientnode import NodeClient
    from pytest_kimi.deploy.plan import DeploymentPlan
    from pytest_kimi.deploy.reach import Reach
    from pytest_kimi.workload.abort import Abort
    from pytest_kimi.workload.sharedclock import SharedClock


@dataclass
class Deployed:
    """Per layout name: what its deployment is, as far as measuring it is concerned."""

    plans: dict[str, DeploymentPlan] = field(default_factory=dict)
    aborts: dict[str, Abort] = field(default_factory=dict)  # the watchdog's cancel hook
    reaches: dict[str, Reach] = field(default_factory=dict)  # node URL -> URL used
    clients: dict[str, NodeClient] = field(default_factory=dict)  # the client on a node
    attached: dict[str, Attached] = field(default_factory=dict)  # what --kimi-endpoint serves
    endpoints: dict[str, str] = field(default_factory=dict)  # the router URL, as reached
    # --kimi-repeat-fresh: tear down, call the function given, bring up; the new router URL
    restarts: dict[str, Callable[[Callable[[], None]], str]] = field(default_factory=dict)
    # --kimi-repeat: the (point id, repeat) last measured on the layout's current deployment
    served: dict[str, tuple[str, int]] = field(default_factory=dict)

    def reach(self, layout: str) -> Reach:
        from pytest_kimi.deploy.reach import DIRECT

        return self.reaches.get(layout, DIRECT)

    def target(self, layout: str, endpoint: str) -> Target:
        """Where the layout's requests go, whose counters are read, and who sends them."""
        plan, reach = self.plans.get(layout), self.reach(layout)
        replicas = {name: reach.url(url) for name, url in replica_endpoints(plan).items()}
        router_metrics = reach.url_or_none(plan.router_metrics_url) if plan else None
        attached = self.attached.get(layout)
        if attached is not None:  # the workers the endpoint named, and the router's metrics
            replicas, router_metrics = attached.worker_urls(), attached.router_metrics
        return Target(endpoint, router_metrics, replicas, self.clients.get(layout))

    def shared_clock(self, layout: str) -> SharedClock | None:
        """The local mock run's shared cluster clock (its servers bound and hold it), if any. A
        client on a node (``network.client: on_node``) times on its own wall clock instead."""
        plan = self.plans.get(layout)
        if self.clients.get(layout) is not None or plan is None or plan.mock_clock is None:
            return None
        from pytest_kimi.workload.sharedclock import SharedClock

        return SharedClock(plan.mock_clock)

    def broken(self, layout: str) -> str:
        """Why an earlier point left this layout's deployment unable to serve ("" if none)."""
        abort = self.aborts.get(layout)
        if abort is not None and abort.reason:
            return f"not measured: the deployment was lost at an earlier point: {abort.reason}"
        return ""
