"""The replicas behind the router: their load, their health and the router-side queue.

A request is sent to at most `worker_max_inflight` requests' worth of a replica at once; past that it
waits in the router in that replica's queue. Such a request has not started: when its replica leaves
rotation it is routed again among the others. A replica leaves rotation when a request cannot connect
to it (at once) or after `health_failure_threshold` failed health checks in a row; it comes back after
a passing check, with an empty prefix tree (its cache is presumed lost). Requests in flight on a
replica that leaves are ended by `dead` (an event they race their I/O against), so none can hang.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter, deque
from dataclasses import dataclass, field

import httpx

from radixgen.runtime.router.config import RouterConfig
from radixgen.runtime.router.policy import Decision, make_policy
from radixgen.runtime.router.prefix_tree import Key

logger = logging.getLogger("radixgen.router")


class NoWorkerError(RuntimeError):
    """No replica is in rotation."""


class WorkerLeft(Exception):
    """The replica a queued request waited for left rotation (route it again)."""


@dataclass(eq=False)
class Worker:
    url: str
    healthy: bool = True
    in_flight: int = 0
    failed_checks: int = 0
    reason: str | None = None  # why it left rotation
    queue: deque = field(default_factory=deque)  # futures of requests waiting for a slot
    dead: asyncio.Event = field(default_factory=asyncio.Event)  # set when it leaves rotation
    routed: Counter = field(default_factory=Counter)  # decisions by reason

    @property
    def load(self) -> int:
        return self.in_flight + len(self.queue)


class WorkerPool:
    def __init__(self, urls: list[str], config: RouterConfig) -> None:
        if not urls:
            raise ValueError("the router needs at least one worker URL")
        self.config = config
        self.workers = [Worker(u.rstrip("/")) for u in urls]
        self.policy = make_policy(config)
        self.errors: Counter = Counter()  # failed requests by code
        self.rerouted = 0  # queued requests sent to another replica after theirs left

    def healthy(self) -> list[Worker]:
        return [w for w in self.workers if w.healthy]

    def least_loaded(self) -> Worker:
        live = self.healthy()
        if not live:
            raise NoWorkerError(self.no_worker_message())
        return min(live, key=lambda w: w.load)

    def no_worker_message(self) -> str:
        why = "; ".join(f"{w.url}: {w.reason}" for w in self.workers)
        return f"no replica is in rotation ({why})"

    async def acquire(self, key: Key) -> tuple[Worker, Decision]:
        """A replica for a prompt `key`, with a request slot taken on it (give it back with `release`)."""
        while True:
            live = self.healthy()
            if not live:
                raise NoWorkerError(self.no_worker_message())
            decision = self.policy.choose(key, live)
            w = decision.worker
            w.routed[decision.reason] += 1
            if w.in_flight < self.config.worker_max_inflight and not w.queue:
                w.in_flight += 1
                return w, decision
            slot = asyncio.get_running_loop().create_future()
            w.queue.append(slot)
            try:
                await slot  # `release` takes the slot for us
                return w, decision
            except WorkerLeft:
                self.rerouted += 1
                continue
            finally:
                if slot in w.queue:  # cancelled while waiting
                    w.queue.remove(slot)

    def release(self, w: Worker) -> None:
        w.in_flight -= 1
        while w.queue and w.in_flight < self.config.worker_max_inflight:
            slot = w.queue.popleft()
            if not slot.done():
                w.in_flight += 1
                slot.set_result(None)

    def leave(self, w: Worker, reason: str) -> None:
        """Take `w` out of rotation: its queued requests go elsewhere, its in-flight ones end."""
        if not w.healthy:
            return
        logger.warning("replica %s leaves rotation: %s", w.url, reason)
        w.healthy, w.reason = False, reason
        w.dead.set()
        self.policy.forget(w.url)
        while w.queue:
            slot = w.queue.popleft()
            if not slot.done():
                slot.set_exception(WorkerLeft())

    def rejoin(self, w: Worker) -> None:
        if w.healthy:
            return
        logger.warning("replica %s is back in rotation", w.url)
        w.healthy, w.reason, w.failed_checks = True, None, 0
        w.dead = asyncio.Event()
        self.policy.forget(w.url)

    # ------------------------------------------------------------------ health

    async def check(self, client: httpx.AsyncClient, w: Worker) -> bool:
        """One health check of `w`; updates its rotation state; whether it passed."""
        try:
            r = await client.get(w.url + "/health", timeout=self.config.health_check_timeout)
            ok = r.status_code == 200
            why = f"/health answered {r.status_code}"
        except httpx.ConnectError as e:  # nothing listens there: no point waiting for more checks
            self.leave(w, f"connection refused ({e})")
            return False
        except httpx.HTTPError as e:
            ok, why = False, f"health check failed: {type(e).__name__}: {e}".rstrip(": ")
        if ok:
            w.failed_checks = 0
            self.rejoin(w)
        else:
            w.failed_checks += 1
            if w.failed_checks >= self.config.health_failure_threshold:
                self.leave(w, why)
        return ok

    async def watch(self, client: httpx.AsyncClient) -> None:
        """Check every replica every `health_check_interval` seconds, forever."""
        while True:
            await asyncio.gather(*(self.check(client, w) for w in self.workers))
            await asyncio.sleep(self.config.health_check_interval)
