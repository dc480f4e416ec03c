"""The RL loop: `Trainer(config, workdir).run()`.

  setup      validate the config -> workdir -> mesh -> rewards -> tokenizer, model config -> data -> the reward
             check on probe completions (trainer/reward_check.py) -> policy/reference/value parameters on
             the mesh -> train state -> checkpoint restore -> metric sinks
  each step  rollout (sample G completions per prompt, rewards, [DAPO resampling]) -> score pass
             (reference log-probs, old values) -> advantages -> E epochs x M minibatches of the jitted,
             state-donating update -> metrics, samples, checkpoint
  eval       with eval.every_steps: held-out pass@k before the first step (its own row, step 0, in the
             metric files; `initial_eval`), then every k steps and at the end, in that step's row
  end        final checkpoint, Hugging Face export with the tokenizer, PNG of the curves, DONE marker, the
             summary printed (trainer/feedback.py)
  signal     SIGTERM / SIGINT / JAX's preemption notice: the step finishes, a checkpoint of it is
             committed, `Preempted` is raised (jaxrl_llm/preemption.py)

An algorithm is an `Objective` (jaxrl_llm/rl/objective.py) read from the config's preset, never a
subclass. Shapes: B prompts, G completions per prompt, N = B*G rows (prompt b owns rows b*G..b*G+G-1),
P prompt tokens (left-padded), T completion tokens (right-padded).
"""
from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
from etils import epath

from jaxrl_llm import config as config_lib
from jaxrl_llm import distributed as dist
from jaxrl_llm import evaluate
from jaxrl_llm import faults, fs, sharding
from jaxrl_llm import metrics as metrics_lib
from jaxrl_llm.checkpoint import Checkpointer, abstract_like
from jaxrl_llm.data import reasoning_gym as rgym
from jaxrl_llm.data.config import reward_columns
from jaxrl_llm.models import lora, save_hf
from jaxrl_llm.models.hf import save_peft_adapter
from jaxrl_llm.models.config import config_to_hf_dict
from jaxrl_llm.preemption import Preempted, StopSignals
from jaxrl_llm.rl import Objective
from jaxrl_llm.rewards import check_reward_parameters
from jaxrl_llm.trainer import (adapters, async_rollout, diagnose, feedback, preflight, report, reward_check, setup,
                               teacher)
from jaxrl_llm.trainer.rollout import Rollouts
from jaxrl_llm.trainer.inputs import python_inputs
from jaxrl_llm.trainer.packs import Packer, shares_prompt
from jaxrl_llm.trainer.partial import PartialRollouts
from jaxrl_llm.trainer.state import TrainState, UpdatePlan
from jaxrl_llm.trainer.steps import step_functions
from jaxrl_llm.trainer.workdir import prepare_workdir, undo_on_failure, write_run_files

log = logging.getLogger(__name__)


class Trainer:
    """Builds everything from a config, then `run()` trains to `total_steps` (resuming if possible).

    config: a ConfigDict (`jaxrl_llm.base_config()` or a config file's) or a dict of fields (nested, or
      dotted keys such as "rollout.group_size"); validated once, with unknown fields refused.
    workdir: a local path or a URL that etils.epath and Orbax read (gs://...).
    rewards: reward functions replacing `reward.functions`: one, or a list of callables (called by keyword
      with the inputs they declare: `completions`, dataset columns, ...; docs/rewards.md), registry names
      or "module:function" paths, each optionally as (reward, weight); without weights in the list the
      config's `reward.weights` apply.
    dataset: prompt rows replacing `data.path`/`data.task`: a `datasets.Dataset` or a list of dicts with
      the configured prompt (and answer) columns.
    devices: those of the mesh, all of `jax.devices()` by default.
    """

    def __init__(self, config: ml_collections.ConfigDict | Mapping[str, Any], workdir: str, *,
                 rewards: Sequence[Any] | Callable[..., Any] | str | None = None, dataset: Any = None, devices=None):
        t0 = time.perf_counter()
        c, callables, rows = python_inputs(config, rewards, dataset)
        preflight.check_inputs(c, rows_given=rows is not None)  # the files, before anything loads
        self.c, self.workdir = c, workdir
        self.objective, self.plan = Objective.from_config(c), UpdatePlan.from_config(c)
        # mesh.rollout_devices = r > 0: the last r devices sample (their own mesh), the others train.
        devices, rollout_devices = async_rollout.split_devices(c, devices)
        self.mesh = sharding.make_mesh(c.mesh.data, c.mesh.fsdp, c.mesh.tensor, devices=devices,
                                       expert=c.mesh.expert, sequence=c.mesh.sequence)
        self.rollout_mesh = sharding.make_mesh(1, -1, 1, devices=rollout_devices) if rollout_devices else None
        setup.check_batch_fits(c, self.mesh)
        with undo_on_failure(workdir, close=self._close_sinks):  # a failed start leaves the workdir as it was
            self._setup(callables, rows)
        self.setup_s = time.perf_counter() - t0

    def _setup(self, callables, rows) -> None:
        """Everything that reads or writes the workdir: models, rewards, data, checkpoint, metric sinks."""
        c, workdir = self.c, self.workdir
        wd = prepare_workdir(workdir, c)
        self.reward_fns = setup.build_rewards(c, self.mesh, callables)
        model_path, self.tokenizer, self.mc, self.eos_ids, self.pad_id = setup.load_model_config(c)
        setup.check_pool(c, self.mesh, self.mc)
        # The prompts before the parameters: a bad file fails before anything is compiled.
        dataset, self.data_stats, held_out = setup.load_data(c, self.tokenizer, rows)
        self.reward_fns = setup.user_rewards(c, self.reward_fns, dataset)  # their form of the completions
        check_reward_parameters(self.reward_fns, reward_columns(dataset.column_names))
        self.data = setup.data_iterator(c, dataset)
        # reasoning-gym's curriculum: each task's level, raised on its training reward (data/reasoning_gym.py).
        section = c.data.reasoning_gym
        self.curriculum = (rgym.CurriculumState([n for n, _ in rgym.parse_tasks(section.tasks)],
                                                section.curriculum_threshold, section.curriculum_window)
                           if c.data.source == rgym.SOURCE and section.curriculum else None)
        self.rollouts = Rollouts(c, self.mc, self.mesh, self.data, self.tokenizer, self.reward_fns, self.eos_ids,
                                 self.pad_id)
        # Every reward on probe completions of a few rows, before the parameters load or anything compiles.
        self_test = reward_check.check_rewards(c, self.rollouts, dataset)
        self.self_test_metrics = self_test.metrics() if self_test is not None else {}  # step 1's row
        evaluates = c.eval.every_steps and evaluate.eval_source(c)
        eval_rows = evaluate.load_eval_data(c, self.tokenizer, held_out) if evaluates else None
        self._init_state(model_path)
        self.evaluator = self._evaluator(callables, eval_rows) if eval_rows is not None else None
        self.initial_eval: dict[str, float] | None = None  # the held-out metrics before the first step
        self.ckpt = Checkpointer(str(wd / "checkpoints"), max_to_keep=c.checkpoint.max_to_keep,
                                 async_save=c.checkpoint.async_save)
        self.start_step = self._restore()
        self._build_producer()
        write_run_files(wd, c, config_to_hf_dict(self.mc, c.model.dtype), self.tokenizer)
        wandb = (dict(project=c.log.wandb_project, name=c.log.wandb_name, entity=c.log.wandb_entity,
                      config=c.to_dict()) if c.log.wandb else None)
        self.writer = metrics_lib.MetricsWriter(workdir, enabled=dist.is_main(), tensorboard=c.log.tensorboard,
                                                resume_step=self.start_step, wandb=wandb)
        leaves, treedef = jax.tree_util.tree_flatten(self.state_shardings)
        self.fns = step_functions(self.objective, self.plan, self.mc, self.mesh, treedef, tuple(leaves), self.teacher_mc)
        self.packer = Packer(c.train.pack_length, c.rollout.group_size, self.plan.score_chunks, c.train.grad_accum,
                             self.mesh, shares_prompt(c.train.pack_share_prompt, self.mc, c.train.pack_length),
                             self.plan.microbatch_tokens) if c.train.pack_length > 0 else None

    def _close_sinks(self) -> None:
        """Closes what a failed start may have opened in the workdir, before it is cleaned."""
        if getattr(self, "writer", None) is not None:
            self.writer.close()
        if getattr(self, "ckpt", None) is not None:
            self.ckpt.close()
        if getattr(self, "producer", None) is not None:
            self.producer.close()

    def _init_state(self, model_path: str) -> None:
        """Policy, reference and value parameters on the mesh, and the train state holding them."""
        c = self.c
        init_rng, _, state_rng = jax.random.split(jax.random.PRNGKey(c.seed), 3)  # init_rng: adapters.base_rng
        params, self.param_shardings = setup.load_params(c, self.mc, model_path, self.mesh, init_rng)
        self.uses_ref = self.objective.uses_ref
        refresh = self.uses_ref and c.ref.refresh_every > 0  # then the reference lives in the state
        value = setup.load_value_params(c, self.mc, params, self.mesh) if c.value.enabled else None
        # LoRA: the base is frozen outside the state and is the reference itself; the adapters train.
        self.base, params, self.param_shardings = adapters.split_trainable(self.mc, params, self.param_shardings,
                                                                           self.mesh, init_rng)
        self.base_id = None if self.base is None else adapters.base_identity(self.mc, self.base)
        self.frozen_ref = None if not self.uses_ref or refresh else (
            self.base if self.base is not None else setup.copy_params(params, self.param_shardings))
        self.value_shardings = value[1] if value else None
        # Distillation: the teacher, frozen outside the state like the LoRA base (trainer/teacher.py).
        self.teacher_mc, self.teacher, self.teacher_id = (teacher.load_teacher(
            c, self.tokenizer, self.mc, self.mesh, setup.resolve_model_path) if self.objective.uses_teacher else
            (None, None, None))
        self.state, self.state_shardings = setup.init_train_state(
            self.objective, self.plan, params, self.param_shardings, value, self.mesh, state_rng, refresh)

    def _evaluator(self, callables, eval_rows) -> evaluate.Evaluator:
        """The held-out evaluation; its rewards are the training ones unless eval.rewards names others."""
        ec = evaluate.reward_config(self.c)
        same = config_lib.reward_specs(ec) == config_lib.reward_specs(self.c)
        fns = self.reward_fns if same else setup.user_rewards(ec, setup.build_rewards(ec, self.mesh, callables),
                                                              eval_rows)
        return evaluate.Evaluator(self.c, self.mc, self.mesh, self.tokenizer, fns, self.eos_ids, self.pad_id,
                                  eval_rows)

    def _restore(self) -> int:
        """Restores the latest checkpoint, if any (exact resume: state and data position)."""
        restored = self.ckpt.restore(abstract_like(self.state))
        self._inflight: list = []  # the rollout batches in flight at the checkpoint (rollout.max_staleness)
        self._partial_state = None  # partial rollouts' rows in flight at the checkpoint
        if restored is None:
            return 0
        start, self.state, meta = restored
        adapters.check_base(meta, self.base_id, str(self.workdir))
        teacher.check_teacher(meta, self.teacher_id, str(self.workdir))
        if start > self.c.total_steps:  # else the run would do nothing and exit 0
            raise ValueError(f"config.total_steps={self.c.total_steps} is below step {start}, where the checkpoint "
                             f"in {self.workdir} stands; raise total_steps to train further, or use another workdir")
        if self.curriculum is not None and "curriculum" in meta:  # the levels first: they decide the rows
            self.curriculum.restore(meta["curriculum"])
            if any(self.curriculum.levels.values()):
                self._load_levels()
        self.data.restore(meta["data"])
        self._inflight = [async_rollout.from_json(d) for d in meta.get("inflight", [])]
        self._partial_state = meta.get("partial")
        log.info("resumed from step %d in %s", start, self.workdir)
        return start

    def _build_producer(self) -> None:
        """The rollout schedule (trainer/async_rollout.py): batches sampled k = rollout.max_staleness
        updates ahead, in this thread or, on a rollout mesh, in a background one."""
        c = self.c
        rollouts = self.rollouts if self.rollout_mesh is None else Rollouts(
            c, self.mc, self.rollout_mesh, self.data, self.tokenizer, self.reward_fns, self.eos_ids, self.pad_id,
            per_host=jax.process_count() > 1)  # several processes: each host's rollout mesh samples its rows
        self.partial = PartialRollouts(c, rollouts) if c.rollout.partial else None
        if self.partial is not None and self._partial_state is not None:
            self.partial.restore(self._partial_state)
        make = async_rollout.batch_maker(c, rollouts, self.data, self.data_stats, self.partial)
        self.producer = async_rollout.build_producer(c, make, self.rollout_mesh, self.mc, self.policy(self.state),
                                                     self.mesh)
        self.producer.restore(self._inflight)
        self.is_async = c.rollout.max_staleness > 0 or self.rollout_mesh is not None

    def policy(self, state: TrainState):
        """The policy's parameters: with LoRA the base joined to the state's adapters (no copy)."""
        return lora.join(self.base, state.params)

    # ======================================================================== the loop
    def train_step(self, state: TrainState):
        """One RL iteration. Returns (new state, metrics dict of floats, samples for logging)."""
        t_step = time.perf_counter()
        faults.point("step", state.step)  # read only under fault injection: no host sync otherwise
        batch = self.producer.next(state, self.policy(state))  # the batch of this step; that of step + k is requested
        return self.update_step(state, batch, t_step, time.perf_counter() - t_step)

    def update_step(self, state: TrainState, batch: async_rollout.Produced, t_step: float, wait_s: float = 0.0):
        """The iteration's update on its rollout `batch`; returns what `train_step` does."""
        c, fns, local = self.c, self.fns, batch.local
        rng, _, shuffle_key = jax.random.split(state.rng, 3)
        b = self.rollouts.device_batch(local)

        t_upd = time.perf_counter()
        ref = state.ref_params if state.ref_params is not None else self.frozen_ref
        B, per_mb = c.rollout.batch_prompts, c.rollout.batch_prompts // c.train.minibatches
        # VAPO's value pretraining: the first steps train the value model alone, the policy frozen.
        pretraining = c.value.pretrain_steps > 0 and int(state.step) < c.value.pretrain_steps  # no sync when off
        update = fns.update_value if pretraining else fns.update
        with sharding.use_mesh(self.mesh, sequence=True):  # a `sequence` axis splits the rows' tokens here
            pack = self.packer.score(b) if self.packer else None
            b.update(fns.score(state, ref, b, pack, self.base, self.teacher))
            b.setdefault("old_logp", b["behavior_logp"])  # proximal = behaviour unless recomputed
            fields, kl_stats = fns.prepare(b, state.kl.value)
            b.update(fields)
            step_metrics, state = [], state.replace(rng=rng)
            for epoch in range(c.train.epochs):
                perm = jax.random.permutation(jax.random.fold_in(shuffle_key, epoch), B)
                for m in range(c.train.minibatches):
                    pidx = perm[m * per_mb:(m + 1) * per_mb]
                    state, mm = update(state, b, pidx, self.packer.update(pidx) if self.packer else None, self.base,
                                       self.teacher)
                    faults.point("update")  # the update is running on the donated state
                    step_metrics.append(mm)
            if state.ref_params is not None and (int(state.step) + 1) % c.ref.refresh_every == 0:
                state = state.replace(ref_params=fns.refresh_ref(state.ref_params, state.params))
            kl_value = kl_stats.get("kl/seq_sum", jnp.float32(0.0))
            state = state.replace(step=state.step + 1,
                                  kl=state.kl.update(kl_value, jnp.float32(B * c.rollout.group_size)))
        step_metrics = jax.device_get(step_metrics)
        update_s = time.perf_counter() - t_upd

        m = report.update_metrics(step_metrics, b, kl_stats, state.kl.value, c.rollout.recompute_logprobs,
                                  fresh=batch.version == batch.step)
        m.update(self.packer.metrics() if self.packer else {})
        m.update(batch.metrics)
        if self.is_async:
            m.update(async_rollout.staleness_metrics(batch))
            m.update(report.staleness_gap(b))
        P = local["prompt_tokens"].shape[1]
        info = {"sample_s": batch.sample_s, "gen_tokens": batch.gen_tokens}
        m.update(report.perf_metrics(c, info, P, time.perf_counter() - t_step, update_s,
                                     report.step_flops(c, self.mc, P, self.uses_ref), self._peak))
        if self.is_async:  # the timeline: the trainer's wait for this batch, the sampler's for its weights
            m.update({"perf/rollout_wait_s": wait_s, "perf/sampler_wait_s": batch.weights_wait_s})
        m["step"] = float(state.step)
        return state, m, batch.samples

    def _advance_curriculum(self, m: dict) -> dict[str, float]:
        """reasoning-gym's curriculum after a step: each task's mean training reward of the step (from the
        reasoning_gym reward's per-task sums and row counts) to `CurriculumState.observe`; the training rows
        regenerated at the new levels when one rose. Returns the `curriculum/<task>/level` metrics."""
        means = {}
        for task in self.curriculum.levels:
            rows = m.get(f"reward/reasoning_gym/rows_{task}", 0.0)
            if rows > 0:
                means[task] = m[f"reward/reasoning_gym/sum_{task}"] / rows
        raised = self.curriculum.observe(means)
        if raised:
            log.info("curriculum: %s raised to level %s (mean training reward >= %g over %d steps)", ", ".join(raised),
                     ", ".join(str(self.curriculum.levels[t]) for t in raised), self.curriculum.threshold,
                     self.curriculum.window)
            self._load_levels()
        return {f"curriculum/{t}/level": float(level) for t, level in self.curriculum.levels.items()}

    def _load_levels(self) -> None:
        """The training rows regenerated at the curriculum's levels, served from the next batch on."""
        dataset, stats, _ = setup.load_data(self.c, self.tokenizer, None, dict(self.curriculum.levels))
        self.data.replace_dataset(dataset)
        self.data_stats.update(stats)  # in place: the batch maker reads this dict

    @functools.cached_property
    def _peak(self) -> float:
        return self.c.log.peak_flops or metrics_lib.peak_flops(jax.devices()[0])

    def save(self, state, *, force=False):
        # The batches in flight first: the producer is then idle, and the data position is after them.
        inflight = [async_rollout.to_json(p) for p in self.producer.pending()]
        meta = {"data": self.data.state(), "step": int(state.step)}
        if self.partial is not None:
            meta["partial"] = self.partial.state()
        if self.curriculum is not None:
            meta["curriculum"] = self.curriculum.state()
        if self.base_id is not None:
            meta[adapters.BASE_KEY] = self.base_id
        if self.teacher_id is not None:
            meta[teacher.TEACHER_KEY] = self.teacher_id
        self.ckpt.save(int(state.step), state, {**meta, "inflight": inflight} if inflight else meta, force=force)
        self.writer.flush()  # metrics up to a checkpoint are durable, also where files cannot be appended to
        faults.point("checkpoint", int(state.step))  # Orbax's asynchronous write is in flight

    def run(self) -> list[dict]:
        """Trains from the restored step to total_steps; returns this run's metrics rows."""
        c = self.c
        t0 = time.perf_counter()
        state, history = self.state, []
        progress = feedback.Progress(c.total_steps, self.start_step, c.algo, enabled=c.log.progress and dist.is_main(),
                                     every_s=c.log.progress_every_s)
        if self.evaluator is not None and self.start_step == 0:
            # The initial policy's: a row of its own at step 0 in the metric files; the history keeps
            # one row per training step.
            self.initial_eval = self.evaluator(self.policy(state), step=0)[0]
            self.writer.write(0, self.initial_eval)
        # SIGTERM / SIGINT / JAX's preemption notice: the step in progress finishes, then a checkpoint
        # of it is committed and Preempted raised (jaxrl_llm/preemption.py). After the last step a signal
        # waits for the final checkpoint and export. The previous handlers are back on exit.
        with StopSignals() as stop:
            try:
                for step in range(self.start_step, c.total_steps):
                    state, m, samples = self.train_step(state)
                    if self.curriculum is not None:
                        m.update(self._advance_curriculum(m))
                    if step == 0:  # a resumed run checks its rewards again but logs no second copy
                        m.update(self.self_test_metrics)
                    if self.evaluator is not None and ((step + 1) % c.eval.every_steps == 0
                                                       or step + 1 == c.total_steps):
                        m.update(self.evaluator(self.policy(state), step=step + 1)[0])
                    self.writer.write(step + 1, m)
                    if c.log.samples_every and (step + 1) % c.log.samples_every == 0:
                        self.writer.write_samples(step + 1, samples)
                    history.append(m)
                    progress.update(m)
                    if m.get("train/empty_updates"):
                        log.warning("step %d: %d update(s) had no loss token and were skipped (train/empty_updates; "
                                    "not counted as non-finite): %s", step + 1, int(m["train/empty_updates"]),
                                    diagnose.empty_cause(c, m))
                    self._check_finite(state, step, m)
                    if step + 1 == self.start_step + feedback.HINT_AFTER_STEPS and dist.is_main():
                        for hint in feedback.padding_hints(c, history):  # early, for a run worth restarting
                            log.info("hint: %s", hint)
                    if (step + 1) % c.checkpoint.every_steps == 0 and step + 1 < c.total_steps:
                        self.save(state)
                    reason = stop.should_stop(step + 1)  # every process, every step: the answer is agreed
                    if reason and step + 1 < c.total_steps:
                        self._stop(state, reason)
            except BaseException:
                self.producer.close()  # a thread sampling ahead stops with the run
                raise
            finally:
                progress.close()
            self._commit(state)
            self.producer.close()
            self.ckpt.wait()
            self.writer.flush()
            self.finish()
        if dist.is_main():
            print(feedback.summary(c, self.workdir, history, int(state.step), self.initial_eval, self.setup_s,
                                   time.perf_counter() - t0), flush=True)
        return history

    def _commit(self, state) -> None:
        """`state` becomes the trainer's and is checkpointed, unless its step already is."""
        self.state = state
        if self.ckpt.latest_step() != int(state.step):
            self.save(state, force=True)

    def _stop(self, state, reason: str) -> None:
        """Commits a checkpoint of `state` (awaited: the process may exit next), then raises Preempted."""
        self._commit(state)
        self.ckpt.close()  # waits for the write to commit
        self.writer.close()
        raise Preempted(reason, int(state.step), self.c.total_steps, str(self.workdir))

    def _check_finite(self, state, step: int, m: dict[str, float]) -> None:
        if int(state.nonfinite) >= self.c.train.max_nonfinite_steps:
            self.ckpt.wait()
            raise FloatingPointError(
                f"{int(state.nonfinite)} consecutive updates had NaN/inf loss or gradients (step {step + 1}); "
                f"stopped with the last good checkpoint intact (train.max_nonfinite_steps="
                f"{self.c.train.max_nonfinite_steps}); {diagnose.nonfinite_causes(self.c, m)}")

    def finish(self):
        """Export, plot and the DONE marker (process 0)."""
        c = self.c
        wd = epath.Path(self.workdir)
        # Every process takes part in gathering the sharded parameters; process 0 writes them. With LoRA:
        # the merged model to hf/, the adapters alone to hf_adapter/ (a PEFT adapter of model.path).
        lora_run = self.base is not None and c.export.at_end
        params = jax.tree_util.tree_map(dist.to_host, lora.merge(self.mc, self.policy(self.state))
                                        if lora_run else self.state.params) if c.export.at_end else None
        adapter = jax.tree_util.tree_map(dist.to_host, self.state.params) if lora_run else None
        if dist.is_main():
            if c.export.at_end:
                dtype = c.export.dtype or None
                _write_dir(wd / "hf", lambda out: save_hf(out, self.mc, params, tokenizer=self.tokenizer, dtype=dtype))
            if lora_run:
                _write_dir(wd / "hf_adapter", lambda out: save_peft_adapter(out, self.mc, adapter, c.model.path, dtype))
            metrics_path = wd / "metrics.jsonl"
            if c.export.plot and metrics_path.exists():
                metrics_lib.plot_curves(str(metrics_path), str(wd / "curves.png"))
            (wd / "DONE").write_text(f"{int(self.state.step)}\n", encoding="utf-8")  # last: the run is complete
        self.writer.close()
        self.ckpt.close()


def _write_dir(path: epath.Path, write: Callable[[str], None]) -> None:
    """write(local dir): in place (atomically), or locally then copied for an object-store URL."""
    if fs.is_url(str(path)):
        fs.write_via_local_dir(path, write)
    else:
        write(str(path))
