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
from jaxrl_llm.compile_options import jit

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
    # This host's (first round's rows, info) that the rollout metrics reduce over every process, until
    # the trainer's thread does it (`Producer.finish`, then None): the producer thread issues no collective.
    unreduced: tuple | None = None


def rollout_key(rng, ahead: int):
    """The sampling key of the step `ahead` steps after the state whose key is `rng`."""
    for _ in range(ahead):
        rng = jax.random.split(rng, 3)[0]
    return jax.random.split(rng, 3)[1]


def staleness_metrics(p: Produced) -> dict[str, float]:
    """`rollout/staleness/{mean,max}`: steps between the consuming step and each row's policy version;
    with partial rollouts (`token_versions`), each token's: the mean over the completions' tokens, the
    max the oldest token's (`min_token` the newest's)."""
    if "token_versions" in p.local:  # over every process's rows (a collective: the trainer's thread)
        mask = np.asarray(p.local["mask"]) > 0
        lag = p.step - np.asarray(p.local["token_versions"], np.float64)[mask]
        if not lag.size:  # a host whose rows are all empty
            lag = np.array([np.nan])
        total, count, high, low = dist.allgather_rows(
            np.array([[np.nansum(lag), np.sum(~np.isnan(lag)), np.nanmax(lag), np.nanmin(lag)]])).T
        return {"rollout/staleness/mean": float(total.sum() / max(count.sum(), 1)),
                "rollout/staleness/max": float(np.nanmax(high)), "rollout/staleness/min_token": float(np.nanmin(low))}
    lag = p.step - np.asarray(p.local["policy_version"], np.float64)
    return {"rollout/staleness/mean": float(lag.mean()), "rollout/staleness/max": float(lag.max())}


class Producer:
    """The schedule run in the calling thread. `make(params, rng, version, step) -> Produced` samples
    and scores the batch of `step` with `params` (after `version` updates) from the state key `rng`;
    `reduce(p)` completes its metrics over every process, in the trainer's thread."""

    def __init__(self, make, k: int, total_steps: int, reduce=lambda p: None):
        self.make, self.k, self.total, self.reduce = make, k, total_steps, reduce
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
        return self.finish(self.ready.pop(step))

    def finish(self, p: Produced) -> Produced:
        """`p` with its metrics over every process (collectives: in the trainer's thread, in step order)."""
        if p.unreduced is not None:
            self.reduce(p)
            p.unreduced = None
        return p

    def pending(self) -> list[Produced]:
        """The batches requested and not yet taken (finished first), by step: what a checkpoint stores."""
        return [self.finish(self.ready[s]) for s in sorted(self.ready)]

    def close(self) -> None:
        self.ready.clear()


class ThreadedProducer(Producer):
    """The schedule with sampling in a background thread on the rollout mesh; `to_rollout(params)`
    copies a policy version onto it. The thread runs under `dist.host_only`: on several processes each
    samples its own rows on its own rollout mesh, and every collective (the weights' gather, the rows'
    metrics, the agreement on a failure) is issued by the trainer's thread, in the same order everywhere."""

    def __init__(self, make, k: int, total_steps: int, to_rollout, reduce=lambda p: None):
        super().__init__(make, k, total_steps, reduce)
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
        self.requests.put((step, copy, dist.fetch(rng), version, time.perf_counter()))

    def _loop(self) -> None:
        with dist.host_only():  # this thread's rows are this host's, its arrays on this host's devices
            self._serve()

    def _serve(self) -> None:
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
            while not done() and self.error is None:
                if not self.thread.is_alive():
                    self.error = RuntimeError("the rollout producer thread stopped without a batch")
                    break
                self.cond.wait(_POLL_S)
        self._raise_if_failed()

    def _raise_if_failed(self) -> None:
        """Raises the producer's error; on several processes, on every process when any failed (one small
        gather in the trainer's thread, where every host calls it: a failure never leaves a host waiting
        in a collective the failed one does not reach)."""
        with self.cond:
            error = self.error
        if jax.process_count() == 1:
            if error is not None:
                raise error
            return
        said = "" if error is None else f"{type(error).__name__}: {' '.join(str(error).split())}"[:500]
        said_by = dist.allgather_lists([list(said.encode())])
        if error is not None:
            raise error
        for process, words in enumerate(said_by):
            if words:
                raise RuntimeError(f"the rollout producer of process {process} failed: "
                                   f"{bytes(words).decode(errors='replace')}")

    def _take(self, step: int) -> Produced:
        self._wait(lambda: step in self.ready)
        with self.cond:
            p = self.ready.pop(step)
        return self.finish(p)

    def pending(self) -> list[Produced]:
        self._wait(lambda: self.busy == 0)
        with self.cond:
            batches = [self.ready[s] for s in sorted(self.ready)]
        return [self.finish(p) for p in batches]

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
    d = dataclasses.asdict(dataclasses.replace(p, local={}, unreduced=None))
    d.pop("unreduced")
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
    """(training devices, this host's rollout devices or None): the last `mesh.rollout_devices` = r
    sample. On P processes the split is per host: the last r/P devices of each host form its own
    rollout mesh, sampling its own rows (none of the producer's work crosses hosts), the others all
    train together. Refuses what the producers do not support."""
    devices = list(jax.devices() if devices is None else devices)
    r, P = c.mesh.rollout_devices, jax.process_count()
    if not r:
        return devices, None
    if c.rollout.batch_prompts % r:
        raise ValueError(f"config.rollout.batch_prompts={c.rollout.batch_prompts} must be divisible by "
                         f"mesh.rollout_devices={r} (the rollout mesh shards prompts over its devices)")
    if P == 1:
        if r >= len(devices):
            raise ValueError(f"config.mesh.rollout_devices={r} leaves no training device of the {len(devices)}")
        return devices[:-r], devices[-r:]
    if r % P:
        raise ValueError(f"config.mesh.rollout_devices={r} must be divisible by the {P} processes (each host "
                         f"samples its rows on r/{P} of its own devices)")
    # Episodes and DAPO's resampling take one decision over every host's rows per turn or round: a
    # collective that a host sampling alone cannot issue.
    for field, on in (("env.name", c.env.name), ("dapo.dynamic_sampling", c.dapo.dynamic_sampling)):
        if on:
            raise ValueError(f"config.{field} with mesh.rollout_devices > 0 needs a single process for now (each "
                             f"host's rollout mesh samples alone, and this decides over every host's rows); "
                             f"set mesh.rollout_devices=0 to run it on {P} processes")
    hosts: dict[int, list] = {}
    for d in devices:
        hosts.setdefault(d.process_index, []).append(d)
    per = r // P
    if len(hosts) != P or min(len(h) for h in hosts.values()) <= per:
        raise ValueError(f"config.mesh.rollout_devices={r} needs more than r/{P} = {per} devices on each of the {P} "
                         f"processes, got {sorted(len(h) for h in hosts.values())}")
    rollout = {id(d) for h in hosts.values() for d in h[-per:]}
    return [d for d in devices if id(d) not in rollout], hosts[jax.process_index()][-per:]


def batch_maker(c, rollouts, data, data_stats, partial=None):
    """`make(params, rng, version, step) -> Produced` for the producers: samples, scores and reports the
    batch of `step` with `rollouts` (on the sampling mesh), or with `partial`'s round (trainer/partial.py:
    rows carry their oldest token's version); its rollout metrics over every process are left to
    `reduce_metrics` in the trainer's thread."""
    from jaxrl_llm.trainer import report
    G = c.rollout.group_size

    def make(params, rng, version: int, step: int) -> Produced:
        key = rollout_key(rng, step - version)
        if partial is None:
            local, first, info = rollouts.collect(params, key, step)
        else:
            local, first, info = partial.collect(params, key, step, version)
        local.setdefault("policy_version", np.full(len(local["scores"]), version, np.int32))
        m = {**report.data_metrics(data, data_stats), **info.get("partial", {})}  # data: where it stands after this batch
        unreduced = ({k: first[k] for k in ("scores", "lengths", "truncated", "supervised") if k in first},
                     {k: info[k] for k in ("reward_metrics", "rounds", "kept_groups") if k in info})
        return Produced(step, version, local, m, report.samples(info, first, c.log.num_samples, G),
                        info["sample_s"], info["gen_tokens"], unreduced=unreduced)
    return make


def reduce_metrics(c):
    """`reduce(p)`: the reward/length metrics of `p`'s first round over every process's rows, first in
    its metrics (collectives on several processes: called in the trainer's thread)."""
    from jaxrl_llm.trainer import report

    def reduce(p: Produced) -> None:
        first, info = p.unreduced
        p.metrics = {**report.rollout_metrics(first, info, c.rollout.group_size, c.dapo.dynamic_sampling),
                     **p.metrics}
    return reduce


def build_producer(c, make, rollout_mesh, mc, params, train_mesh=None) -> Producer:
    """The threaded producer on `rollout_mesh` (laid out by the sharding rules for that mesh, whose
    sizes differ from the training one's), or, when it is None, the in-thread one."""
    reduce = reduce_metrics(c)
    # Partial rollouts draw step i's batch with the policy of step i-1 (max_staleness bounds the oldest token).
    k = 1 if c.rollout.partial else c.rollout.max_staleness
    if rollout_mesh is None:
        return Producer(make, k, c.total_steps, reduce)
    from jaxrl_llm import sharding
    from jaxrl_llm.models import param_logical_axes
    abstract = jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), params)
    shardings = sharding.logical_to_sharding(param_logical_axes(mc), abstract, rollout_mesh)
    to_rollout = ((lambda p: jax.device_put(p, shardings)) if jax.process_count() == 1 else
                  host_copier(train_mesh, shardings))
    return ThreadedProducer(make, k, c.total_steps, to_rollout, reduce)


def host_copier(train_mesh, shardings):
    """`to_rollout` of a rollout mesh per host: each parameter gathered whole onto every training device
    (a jitted identity to the replicated sharding: the training devices' collective, issued by the
    trainer's thread on every host alike, no host round trip), then this host's copy put on its rollout
    mesh (device to device). One parameter at a time: one parameter, not the model, is replicated at once."""
    whole = jit(lambda x: x, out_shardings=jax.sharding.NamedSharding(train_mesh, jax.sharding.PartitionSpec()))

    def copy_one(x, target):
        return jax.block_until_ready(jax.device_put(whole(x).addressable_data(0), target))
    return lambda params: jax.tree_util.tree_map(copy_one, params, shardings)
