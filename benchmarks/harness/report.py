"""Output of the benchmark scripts: the machine line (with its load average: the machine is shared), GitHub
markdown tables, side-by-side ratio lines, the results block of a markdown file, and JSON results."""
from __future__ import annotations

import datetime
import json
import os
import platform
import re
from importlib.metadata import PackageNotFoundError, version
from typing import Any, Sequence


def _version(package: str) -> str:
    """A package's installed version without importing it (importing torch costs this process memory)."""
    try:
        return version(package)
    except PackageNotFoundError:
        return "absent"


def load_average() -> str:
    """The 1, 5 and 15-minute load averages, e.g. '1.52, 1.20, 0.98'."""
    return ", ".join(f"{x:.2f}" for x in os.getloadavg())


def machine_description() -> str:
    """One line: CPU model (and family: "AMD EPYC" names several generations), core count, load average,
    library versions, and a preloaded allocator when LD_PRELOAD is set (it changes both sides' speed:
    docs/benchmarks.md, "Page faults between programs")."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            info = dict(line.split(":", 1) for line in f.read().split("\n\n")[0].splitlines() if ":" in line)
        info = {k.strip(): v.strip() for k, v in info.items()}
        cpu = info.get("model name", cpu) + (f" (family {info['cpu family']})" if "cpu family" in info else "")
    except OSError:
        pass
    import jax
    preload = f"; LD_PRELOAD={os.environ['LD_PRELOAD']}" if os.environ.get("LD_PRELOAD") else ""
    return (f"{cpu}, {os.cpu_count()} cores, load average {load_average()}; jax {jax.__version__} "
            f"({jax.default_backend()}), flax {_version('flax')}, torch {_version('torch')}, "
            f"transformers {_version('transformers')}{preload}")


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A GitHub markdown table; floats keep 3 significant digits."""
    def fmt(x):
        if isinstance(x, float):
            return f"{x:.3g}" if abs(x) < 100 else f"{x:,.0f}"
        return str(x)

    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(fmt(x) for x in row) + " |" for row in rows]
    return "\n".join(lines)


def ratio_line(ours: str, theirs: str, ours_value: float, theirs_value: float, *, higher_is_better: bool,
               unit: str, target: float | None = None) -> str:
    """'jaxrl_llm / TRL: 2.01x (18.3 vs 36.8 s/step, target >= 2x)': the speed-up of `ours` over `theirs`
    measured side by side (> 1: ours is faster or leaner)."""
    ratio = ours_value / theirs_value if higher_is_better else theirs_value / ours_value
    goal = f", target >= {target:g}x" if target else ""
    return f"{ours} / {theirs}: {ratio:.2f}x ({ours_value:.3g} vs {theirs_value:.3g} {unit}{goal})"


def update_markdown(path: str, key: str, body: str) -> None:
    """Writes `body` between the markers `<!-- key:begin -->` and `<!-- key:end -->` of `path`, replacing
    what a previous run wrote there and keeping the hand-written text around it. Without the markers the
    block is appended at the end of the file (created if missing)."""
    if not re.fullmatch(r"[\w.-]+", key):
        raise ValueError(f"key must be letters, digits, '_', '.' or '-', got {key!r}")
    begin, end = f"<!-- {key}:begin -->", f"<!-- {key}:end -->"
    stamp = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    block_text = f"{begin}\n<!-- written by the benchmark script on {stamp}; rerun it to refresh -->\n{body.strip()}\n{end}"
    text = ""
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            text = f.read()
    pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end), re.S)
    if pattern.search(text):
        text = pattern.sub(lambda _: block_text, text, count=1)
    else:
        text = (text.rstrip() + "\n\n" if text.strip() else "") + block_text + "\n"
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def save_json(path: str, result: dict) -> None:
    """Writes a script's result dict as JSON (numbers the docs quote, reproducible from the file)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(result, f, indent=1, default=str)
