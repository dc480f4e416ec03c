"""Rollouts ahead of the trainer with bounded, deterministic staleness (`rollout.max_staleness` = k).

The schedule: the batch of step i is sampled with the policy after update max(0, i − k) -- exactly that
version, never "whatever is newest" (for i < k, the initial parameters) -- and with the key that the
synchronous loop would use at step i: split(rng_i, 3)[1], where rng_i is the state's key stream after i
steps (rng_{i+1} = split(rng_i, 3)[0] does not depend on the parameters, so it is known k steps early).
At the start of step v, with the state after v updates in hand, the batch of step v + k is requested;
then the batch of step v is taken. k = 0 is today's synchronous loop, call for call.

Two producers run that schedule:
  `Producer`          in the calling thread, on the training mesh (mesh.rollout_devices = 0): no overlap,
                      the same numbers; what the CPU tests use.
  `ThreadedProducer`  a background thread sampling (and scoring rewards) on its own mesh of r devices
                      while the trainer updates on the others; each version is copied to the rollout
                      mesh (`jax.device_put`, device to device where the runtime allows) before the
                      update that donates it. At most k batches wait; an error in the thread is raised in
                      the trainer at its next `next`/`pending` (never a hang).

Exact resume: a checkpoint at step s stores the k batches in flight (s..s+k−1: host rows, a few MB for
a real batch) rather than the k policy versions that sampled them (k copies of the model), so resume
takes them back and continues with the batch of step s + k from the restored state.

Several processes: each process samples its own block of rows (distributed.host_rows). A checkpoint
stores every batch in flight as its *global* rows: `to_json` gathers the blocks in process order (a
collective: every process calls `save`), and process 0 writes them with the checkpoint's metadata.
On resume every process takes its block of the global rows back (`from_json`), so a resume on the same
process count continues exactly, and one on another count (the batch divisible by it) trains on the
same rows (the data position is global too); only the `samples.jsonl` rows of those batches, which
process 0 drew from its own block, stay those of the old layout.
"""
from __future__ import annotations

import base64
import dataclasses
import io
import logging
import queue
import threading
import time

import jax
import numpy as np

from jaxrl_llm import distributed as dist

log = logging.getLogger(__name__)
_POLL_S = 0.5  # how often a wait checks that the producer thread is alive


@dataclasses.dataclass
class Produced:
    """One step's rollout batch with what the step reports about it, computed when it was drawn."""

    step: int  # the training step that consumes it
    version: int  # updates done by the policy that sampled it
    local: dict  # this host's rows (trainer/rollout.py), with `policy_version` (N,)
    metrics: dict  # reward/length/data metrics of the batch
    samples: list  # rows for samples.jsonl
    sample_s: float  # sampling and scoring time
    gen_tokens: float  # tokens generated (all DAPO rounds)
    weights_wait_s: float = 0.0  # how long the sampler waited for this version's weights


def rollout_key(rng, ahead: int):
    """The sampling key of the step `ahead` steps after the state whose key is `rng`."""
    for _ in range(ahead):
        rng = jax.random.split(rng, 3)[0]
    return jax.random.split(rng, 3)[1]


def staleness_metrics(p: Produced) -> dict[str, float]:
    """`rollout/staleness/{mean,max}`: steps between the consuming step and each row's policy version."""
    lag = p.step - np.asarray(p.local["policy_version"], np.float64)
    return {"rollout/staleness/mean": float(lag.mean()), "rollout/staleness/max": float(lag.max())}


class Producer:
    """The schedule run in the calling thread. `make(params, rng, version, step) -> Produced` samples
    and scores the batch of `step` with `params` (after `version` updates) from the state key `rng`."""

    def __init__(self, make, k: int, total_steps: int):
        self.make, self.k, self.total = make, k, total_steps
        self.ready: dict[int, Produced] = {}
        self.started = False

    def restore(self, batches: list[Produced]) -> None:
        """The batches in flight at the restored checkpoint."""
        self.ready.update({p.step: p for p in batches})

    def next(self, state, params=None) -> Produced:
        """Requests the batch of step v + k (v = state.step) with the state's policy (`params`, default
        state.params; with LoRA the base joined to the adapters), returns step v's."""
        v = int(state.step)
        params = state.params if params is None else params
        if not self.started:
            self.started = True
            # A fresh run: steps 0..k-1 use the initial policy. A resume whose checkpoint lacks its
            # in-flight batches (total_steps raised after the end) samples them with today's policy.
            missing = [j for j in range(v, min(v + self.k, self.total)) if j not in self.ready]
            if missing and v > 0:
                log.warning("steps %s had no batch in flight in the checkpoint (total_steps raised?): sampled "
                            "with the policy of step %d", missing, v)
            for j in missing:
                self._request(j, params, state.rng, v)
        if v + self.k < self.total:
            self._request(v + self.k, params, state.rng, v)
        return self._take(v)

    def _request(self, step: int, params, rng, version: int) -> None:
        self.ready[step] = self.make(params, rng, version, step)

    def _take(self, step: int) -> Produced:
        return self.ready.pop(step)

    def pending(self) -> list[Produced]:
        """The batches requested and not yet taken (finished first), by step: what a checkpoint stores."""
        return [self.ready[s] for s in sorted(self.ready)]

    def close(self) -> None:
        self.ready.clear()


class ThreadedProducer(Producer):
    """The schedule with sampling in a background thread on the rollout mesh; `to_rollout(params)`
    copies a policy version onto it."""

    def __init__(self, make, k: int, total_steps: int, to_rollout):
        super().__init__(make, k, total_steps)
        self.to_rollout = to_rollout
        self.requests: queue.Queue = queue.Queue()
        self.cond = threading.Condition()
        self.busy = 0  # requests not finished
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._loop, name="jaxrl_llm-rollout-producer", daemon=True)
        self.thread.start()

    def _request(self, step: int, params, rng, version: int) -> None:
        self._raise_if_failed()
        # The copy must be complete before the update donates `params`: waiting here is the trainer's
        # share of the weight transfer.
        copy = jax.block_until_ready(self.to_rollout(params))
        with self.cond:
            self.busy += 1
        self.requests.put((step, copy, np.asarray(jax.device_get(rng)), version, time.perf_counter()))

    def _loop(self) -> None:
        idle_since = time.perf_counter()
        while True:
            item = self.requests.get()
            if item is None:
                return
            step, params, rng, version, _ = item
            waited = time.perf_counter() - idle_since
            try:
                p = self.make(params, rng, version, step)
                p.weights_wait_s = waited
            except BaseException as e:  # re-raised in the trainer's thread
                with self.cond:
                    self.error, self.busy = e, self.busy - 1
                    self.cond.notify_all()
                return
            with self.cond:
                self.ready[step], self.busy = p, self.busy - 1
                self.cond.notify_all()
            idle_since = time.perf_counter()

    def _wait(self, done) -> None:
        with self.cond:
            while not done():
                self._raise_if_failed()
                if not self.thread.is_alive():
                    raise RuntimeError("the rollout producer thread stopped without a batch")
                self.cond.wait(_POLL_S)
            self._raise_if_failed()

    def _raise_if_failed(self) -> None:
        if self.error is not None:
            raise self.error

    def _take(self, step: int) -> Produced:
        self._wait(lambda: step in self.ready)
        with self.cond:
            return self.ready.pop(step)

    def pending(self) -> list[Produced]:
        self._wait(lambda: self.busy == 0)
        with self.cond:
            return [self.ready[s] for s in sorted(self.ready)]

    def close(self) -> None:
        """Stops the thread after its current batch (it is a daemon: an exiting process does not wait)."""
        self.requests.put(None)
        self.thread.join(timeout=_POLL_S)
        super().close()


# ------------------------------------------------------------------------------- checkpointed batches
_PROMPT_KEYS = ("prompt_tokens", "prompt_mask", "prompt_routes")  # (B, P, ...) left-padded; others (N, ...)


def to_json(p: Produced) -> dict:
    """A JSON-able record of a batch in flight: its global rows (every process's block, in process
    order: a collective) as a base64 .npz (no pickle), the rest as is."""
    buf = io.BytesIO()
    np.savez_compressed(buf, **gather_rows(p.local))
    d = dataclasses.asdict(p)
    d["local"] = base64.b64encode(buf.getvalue()).decode("ascii")
    return d


def from_json(d: dict) -> Produced:
    """The record of `to_json`, with this process's block of its global rows."""
    with np.load(io.BytesIO(base64.b64decode(d["local"])), allow_pickle=False) as z:
        local = {k: z[k][dist.host_rows(len(z[k]))] for k in z.files}
    return Produced(**{**d, "local": local})


def gather_rows(local: dict) -> dict:
    """Every process's rows of a batch, concatenated in process order (the global batch); prompts
    left-padded to the widest block first. The same keys on every process, taken in sorted order."""
    out = {}
    for k in sorted(local):
        v = np.asarray(local[k])
        if k in _PROMPT_KEYS and jax.process_count() > 1:
            width = int(dist.allgather_rows(np.array([v.shape[1]])).max())
            v = np.pad(v, ((0, 0), (width - v.shape[1], 0), *[(0, 0)] * (v.ndim - 2)))  # masked out: any id will do
        out[k] = dist.allgather_rows(v)
    return out


# ------------------------------------------------------------------------------------------ building
def split_devices(c, devices=None):
    """(training devices, rollout devices or None): the last `mesh.rollout_devices` sample. Refuses
    what the producers do not support: a rollout mesh on several processes."""
    devices = list(jax.devices() if devices is None else devices)
    r = c.mesh.rollout_devices
    if not r:
        return devices, None
    if jax.process_count() > 1:
        # The producer thread would run collectives (row gathers, the sampler's global arrays) next to the
        # trainer's, in an order that differs between hosts: a deadlock, not an error.
        raise ValueError("config.mesh.rollout_devices > 0 needs a single process for now (the producer thread's "
                         "collectives are not ordered with the trainer's across hosts); set it to 0 -- "
                         "rollout.max_staleness >= 1 works on several processes without it")
    if r >= len(devices):
        raise ValueError(f"config.mesh.rollout_devices={r} leaves no training device of the {len(devices)}")
    if c.rollout.batch_prompts % r:
        raise ValueError(f"config.rollout.batch_prompts={c.rollout.batch_prompts} must be divisible by "
                         f"mesh.rollout_devices={r} (the rollout mesh shards prompts over its devices)")
    return devices[:-r], devices[-r:]


def batch_maker(c, rollouts, data, data_stats):
    """`make(params, rng, version, step) -> Produced` for the producers: samples, scores and reports the
    batch of `step` with `rollouts` (on the sampling mesh)."""
    from jaxrl_llm.trainer import report
    G = c.rollout.group_size

    def make(params, rng, version: int, step: int) -> Produced:
        local, first, info = rollouts.collect(params, rollout_key(rng, step - version), step)
        local["policy_version"] = np.full(len(local["scores"]), version, np.int32)
        m = report.rollout_metrics(first, info, G, c.dapo.dynamic_sampling)
        m.update(report.data_metrics(data, data_stats))  # where the data stands after this batch
        return Produced(step, version, local, m, report.samples(info, first, c.log.num_samples, G),
                        info["sample_s"], info["gen_tokens"])
    return make


def build_producer(c, make, rollout_mesh, mc, params) -> Producer:
    """The threaded producer on `rollout_mesh` (laid out by the sharding rules for that mesh, whose
    sizes differ from the training one's), or, when it is None, the in-thread one."""
    if rollout_mesh is None:
        return Producer(make, c.rollout.max_staleness, c.total_steps)
    from jaxrl_llm import sharding
    from jaxrl_llm.models import param_logical_axes
    abstract = jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), params)
    shardings = sharding.logical_to_sharding(param_logical_axes(mc), abstract, rollout_mesh)
    return ThreadedProducer(make, c.rollout.max_staleness, c.total_steps, lambda p: jax.device_put(p, shardings))
