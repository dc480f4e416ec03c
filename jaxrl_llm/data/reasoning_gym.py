"""reasoning-gym tasks as prompt data (`data.source = "reasoning_gym"`; docs/data.md, "reasoning-gym tasks").

A run names one or more tasks of the `reasoning_gym` package with their weights
(`data.reasoning_gym.tasks = "spell_backward, chain_sum:2"`) and each task's generator options
(`data.reasoning_gym.options.<task>.<field>`, the fields of the task's config dataclass). The rows are
generated from the run's seed by the package's own weighted composite dataset (no download, no file):
row i is the composite's item i, of the task its weights draw for i (the composite's seed is a hash of the
run's: `composite_seed`).

Held-out rows: as for the built-in task (data/tasks.py), a fixed eighth of the problem space, the
questions whose CRC-32 is 0 mod 8, is the "test" split and the "train" split skips them; each split
walks the composite's items from index 0 and keeps those of its side, so the same seed gives the same
rows, another seed other rows, and no question is on both sides.

Every row carries what the reward needs to score it with the task's own `score_answer`
(rewards/reasoning_gym.py): `task` (the task's name), `rg_config` (the JSON of the keyword arguments
that recreate the task's dataset, its seed and size included) and `rg_index` (the item's index there).
The reward rebuilds the entry from them, so it scores exactly the entry the package generated.

Curriculum (`data.reasoning_gym.curriculum`): the package's own curriculum of each task (its attribute
levels; `curriculum_tasks()` lists the tasks that have one) gives the generator options at a level;
`CurriculumState` holds the level of each task and raises it when the task's training reward passes the
threshold (the trainer regenerates the training rows then; the held-out rows stay those of the start).

The package is imported only when this source is used; a missing package or an unknown task is a one-line
error at config time (`check_section`, called by `config.prepare`).
"""
from __future__ import annotations

import dataclasses
import difflib
import json
import zlib
from collections.abc import Mapping

SOURCE = "reasoning_gym"
TASK_COLUMN = "task"
CONFIG_COLUMN = "rg_config"
INDEX_COLUMN = "rg_index"
ROW_COLUMNS = ("question", "answer", TASK_COLUMN, CONFIG_COLUMN, INDEX_COLUMN)
SPLITS = ("train", "test")
HELD_OUT_MOD = 8  # one question in 8 (by CRC-32) is held out for evaluation
WALK_FACTOR = 16  # a split walks at most WALK_FACTOR x rows + WALK_SLACK items for its rows
WALK_SLACK = 256
INSTALL_HINT = "pip install reasoning-gym"


def import_package():
    """The `reasoning_gym` module, or a one-line ValueError saying what to install."""
    try:
        import reasoning_gym
    except ImportError as e:
        raise ValueError(f"data.source='reasoning_gym' needs the reasoning-gym package, which is not installed "
                         f"({e.name or 'reasoning_gym'} not found): {INSTALL_HINT}") from None
    return reasoning_gym


def task_names() -> list[str]:
    """Every task the installed package registers (its `composite` wrapper excepted)."""
    import_package()
    from reasoning_gym.factory import DATASETS
    return sorted(n for n in DATASETS if n != "composite")


def curriculum_tasks() -> list[str]:
    """The tasks with a curriculum (difficulty levels) in the installed package."""
    import_package()
    from reasoning_gym.factory import CURRICULA
    return sorted(n for n in CURRICULA if n != "composite")


def parse_tasks(spec) -> list[tuple[str, float]]:
    """'spell_backward, chain_sum:2' -> [('spell_backward', 1.0), ('chain_sum', 2.0)] (weight 1 when left
    out); one-line errors naming data.reasoning_gym.tasks."""
    field = "config.data.reasoning_gym.tasks"
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"{field} must name at least one reasoning-gym task, e.g. 'spell_backward' or "
                         f"'spell_backward, chain_sum:2' (name:weight), got {spec!r}")
    out: list[tuple[str, float]] = []
    for part in spec.split(","):
        name, _, weight = part.strip().partition(":")
        name = name.strip()
        try:
            w = float(weight) if weight.strip() else 1.0
        except ValueError:
            raise ValueError(f"{field}: the weight of {name!r} must be a number, got {weight.strip()!r}") from None
        if not name or not (w > 0 and w < float("inf")):
            raise ValueError(f"{field} must be comma-separated name[:weight] entries with weights > 0, got {spec!r}")
        if name in (n for n, _ in out):
            raise ValueError(f"{field} names {name!r} twice")
        out.append((name, w))
    return out


def _options(section) -> dict[str, dict]:
    options = section.options
    return dict(options.to_dict() if hasattr(options, "to_dict") else options or {})


def check_task_name(name: str, names: list[str]) -> None:
    """A one-line error for a task the package does not have, naming the nearest ones."""
    if name in names:
        return
    near = difflib.get_close_matches(name, names, n=4, cutoff=0.5)
    hint = f"; did you mean {', '.join(near)}?" if near else f"; its tasks: {', '.join(names[:12])}, ..."
    raise ValueError(f"config.data.reasoning_gym.tasks: {name!r} is not a reasoning-gym task{hint}")


def check_section(section, *, curriculum_ok: bool = True) -> None:
    """Checks `data.reasoning_gym` (one-line ValueErrors naming the field): the package is installed, every
    task exists, every option is a field of its task's config and the task accepts the values, the
    curriculum's tasks have curricula. Builds each task's config once (cheap): no row is generated."""
    tasks = parse_tasks(section.tasks)
    import_package()
    from reasoning_gym.factory import DATASETS
    names = task_names()
    for name, _ in tasks:
        check_task_name(name, names)
    if section.curriculum:
        missing = [n for n, _ in tasks if n not in curriculum_tasks()]
        if missing:
            raise ValueError(f"config.data.reasoning_gym.curriculum: {', '.join(missing)} has no curriculum in "
                             "reasoning-gym (no difficulty levels); leave it out or set curriculum=False")
        if not curriculum_ok:
            raise ValueError("config.data.reasoning_gym.curriculum needs synchronous rollouts "
                             "(rollout.max_staleness=0, mesh.rollout_devices=0)")
    options = _options(section)
    for name, values in options.items():
        if name not in dict(tasks):
            raise ValueError(f"config.data.reasoning_gym.options.{name}: {name!r} is not among data.reasoning_gym."
                             f"tasks ({', '.join(n for n, _ in tasks)})")
        if not isinstance(values, Mapping):
            raise ValueError(f"config.data.reasoning_gym.options.{name} must be a section of fields, got {values!r}")
    for name, _ in tasks:
        fields = [f.name for f in dataclasses.fields(DATASETS[name][1])]
        for key in options.get(name, {}):
            if key not in fields or key in ("seed", "size"):
                allowed = [f for f in fields if f not in ("seed", "size")]
                raise ValueError(f"config.data.reasoning_gym.options.{name}.{key} is not an option of the task "
                                 f"(seed and size come from the run); its options: {', '.join(allowed)}")
        try:
            make_config(name, task_kwargs(section, name, 0 if section.curriculum else None))
        except (AssertionError, TypeError, ValueError) as e:
            raise ValueError(f"config.data.reasoning_gym.options.{name}: the task refuses its options: "
                             f"{' '.join(str(e).split()) or type(e).__name__}") from None


def make_config(name: str, kwargs: dict):
    """The task's config dataclass built from `kwargs`, validated as the package validates it."""
    from reasoning_gym.factory import DATASETS
    config = DATASETS[name][1](**kwargs)
    if hasattr(config, "validate"):
        config.validate()
    return config


def curriculum_options(name: str, level: int) -> dict:
    """The generator options of task `name` at its curriculum's global `level` (every attribute at that
    level, or its highest): the fields the package's curriculum sets, as plain values."""
    import_package()
    from reasoning_gym.factory import create_curriculum
    curriculum = create_curriculum(name)
    curriculum.set_global_level(level)
    config = curriculum.generate_configuration()
    fields = []
    for attr in curriculum.attributes.values():
        fields += [attr.lower_field_name, attr.upper_field_name] if hasattr(attr, "lower_field_name") else [
            attr.field_name]
    return {f: _plain(getattr(config, f)) for f in fields}


def max_level(name: str) -> int:
    """The highest global level of task `name`'s curriculum (its longest attribute's last level)."""
    import_package()
    from reasoning_gym.factory import create_curriculum
    return max(len(a.levels) for a in create_curriculum(name).attributes.values()) - 1


def _plain(value):
    return list(value) if isinstance(value, tuple) else value


def task_kwargs(section, name: str, level: int | None = None) -> dict:
    """Keyword arguments of task `name`'s dataset (seed and size apart): its curriculum's options at
    `level` (None: no curriculum), then the run's options for the task over them."""
    kwargs = curriculum_options(name, level) if level is not None else {}
    kwargs.update({k: _plain(v) for k, v in _options(section).get(name, {}).items()})
    return kwargs


def start_levels(section) -> dict[str, int] | None:
    """Each task's level at the start (0) under a curriculum; None without one."""
    return {name: 0 for name, _ in parse_tasks(section.tasks)} if section.curriculum else None


def composite_seed(seed: int) -> int:
    """The composite dataset's seed for the run's `seed`: a multiplicative hash into [0, 2^31). The package
    draws item i from Random(seed + i) (and its i-th task from seed + i + 1), so seeds 0 and 1 would give
    the same rows shifted by one; hashed, two seeds' streams lie far apart."""
    return (int(seed) * 2654435761 + 0x9E3779B1) % (1 << 31)


def is_held_out(question: str) -> bool:
    """Whether a question belongs to the held-out "test" split (a function of its text alone)."""
    return zlib.crc32(question.encode("utf-8")) % HELD_OUT_MOD == 0


def generate(section, seed: int, num_rows: int, split: str = "train", levels: Mapping[str, int] | None = None):
    """`num_rows` rows (a `datasets.Dataset` with ROW_COLUMNS) of the weighted tasks of `section`
    (`data.reasoning_gym`) from `seed`: the composite dataset's items from index 0 that fall in `split`.
    `levels`: each task's curriculum level (None: no curriculum, the options alone)."""
    import datasets

    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    if num_rows < 1:
        raise ValueError(f"num_rows must be >= 1, got {num_rows}")
    import_package()
    from reasoning_gym.composite import CompositeConfig, CompositeDataset, DatasetSpec

    tasks = parse_tasks(section.tasks)
    limit = WALK_FACTOR * num_rows + WALK_SLACK
    specs, base = [], composite_seed(seed)
    for i, (name, weight) in enumerate(tasks):
        # The composite's own seeding of its i-th task (its seed + i + 1), written out so the row records it.
        kwargs = {**task_kwargs(section, name, None if levels is None else levels[name]),
                  "seed": base + i + 1, "size": limit}
        specs.append(DatasetSpec(name=name, weight=weight, config=kwargs))
    composite = CompositeDataset(CompositeConfig(size=limit, seed=base, datasets=specs))
    config_json = {s.name: json.dumps(s.config, sort_keys=True) for s in specs}
    held_out = split == "test"
    rows = {c: [] for c in ROW_COLUMNS}
    for index in range(limit):
        try:
            item = composite[index]
        except Exception as e:  # noqa: BLE001 (a task's generator, e.g. options no problem satisfies)
            raise ValueError(f"data.reasoning_gym: the package failed to generate item {index} of {section.tasks!r}: "
                             f"{type(e).__name__}: {' '.join(str(e).split())[:200]} (check the tasks' options)") from e
        if is_held_out(item["question"]) != held_out:
            continue
        name = item["metadata"]["source_dataset"]
        for column, value in zip(ROW_COLUMNS, (item["question"], str(item["answer"]), name, config_json[name],
                                               index)):
            rows[column].append(value)
        if len(rows[TASK_COLUMN]) == num_rows:
            return datasets.Dataset.from_dict(rows)
    raise ValueError(f"data.reasoning_gym: only {len(rows[TASK_COLUMN])} of the {num_rows} {split} rows in the first "
                     f"{limit} problems of {section.tasks!r} (1 question in {HELD_OUT_MOD} is held out, by hash): its "
                     "options leave too few distinct questions; widen them or ask for fewer rows")


def rebuild_dataset(name: str, config_json: str):
    """The task's dataset that a row's `rg_config` records (what the reward scores with)."""
    import_package()
    import reasoning_gym
    return reasoning_gym.create_dataset(name, **json.loads(config_json))


class CurriculumState:
    """The curriculum level of each task: raised by one (up to the curriculum's last level) when the task's
    mean training reward over the last `window` steps reaches `threshold`; the window then starts afresh,
    at the new level. `state()` / `restore()` round-trip it through a checkpoint's metadata."""

    def __init__(self, tasks: list[str], threshold: float, window: int):
        self.threshold, self.window = float(threshold), int(window)
        self.levels = {t: 0 for t in tasks}
        self.top = {t: max_level(t) for t in tasks}
        self.recent: dict[str, list[float]] = {t: [] for t in tasks}

    def observe(self, rewards: Mapping[str, float]) -> list[str]:
        """Records one step's mean training reward of each task seen (task -> mean); returns the tasks
        whose level rose."""
        raised = []
        for task, reward in rewards.items():
            if task not in self.levels:
                continue
            seen = self.recent[task]
            seen.append(float(reward))
            del seen[:-self.window]
            if (len(seen) == self.window and sum(seen) / self.window >= self.threshold
                    and self.levels[task] < self.top[task]):
                self.levels[task] += 1
                self.recent[task] = []
                raised.append(task)
        return raised

    def state(self) -> dict:
        return {"levels": dict(self.levels), "recent": {t: list(v) for t, v in self.recent.items()}}

    def restore(self, state: Mapping) -> None:
        for task, level in state.get("levels", {}).items():
            if task in self.levels:
                self.levels[task] = int(level)
        for task, values in state.get("recent", {}).items():
            if task in self.recent:
                self.recent[task] = [float(v) for v in values]
