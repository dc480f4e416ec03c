"""The markdown report of the GPU suite's results (benchmarks/gpu_suite.py): one section per stage.

`render(results)` takes the suite's JSON (a dict: date, plan, seconds, stages: {name: {status, ...}})
and returns the text of the `gpu-suite-results` block; a stage that did not finish is listed with why.
"""
from __future__ import annotations

from harness.report import markdown_table  # noqa: E402

GIB = 2 ** 30


def _gib(b) -> str:
    return "n/a" if b is None else f"{b / GIB:.2f}"


def _lengths(d: dict) -> str:
    return f"{d['min']}/{d['median']:.0f}/{d['p90']:.0f}/{d['max']} (mean {d['mean']:.0f})"


def _env(env: dict) -> list[str]:
    v = env["versions"]
    return [f"Device: {env['device']} ({env['platform']}; nvidia-smi: {env['nvidia_smi']}); python {env['python']}, "
            + ", ".join(f"{k} {v[k]}" for k in v) + ".",
            "Matmul peaks measured in this run (TFLOP/s): "
            + ", ".join(f"{k} {val:.1f}" for k, val in env["matmul_tflops"].items())
            + f"; datasheet dense bfloat16 {env['datasheet_tflops']:.0f}."]


def _correctness(c: dict) -> list[str]:
    pt = c.get("pytest")
    head = "\n**Correctness.** "
    if pt:
        head += f"pytest on the device (`{pt.get('tests', '')}`): {pt.get('summary', pt.get('status'))}"
        head += (f"; failed: {pt['failed']}. " if pt.get("failed") else ". ")
    par = c["parity"]
    rows = [[k, par[k]["max_abs"], par[k]["max_rel"]] for k in par if isinstance(par[k], dict)]
    return [head, f"Logits against transformers on the same device ({par['rows_x_len'][0]} rows x "
                  f"{par['rows_x_len'][1]} tokens, one left-padded; largest |logit| {par['max_abs_logit']:.3g}):\n",
            markdown_table(["ours", "max abs diff", "relative to max |logit|"], rows),
            "\nSampler vs trainer log-probs, max |diff|: "
            + ", ".join(f"{k} {v:.2e}" for k, v in c["logp_identity"].items())]


def _sampler(s: dict) -> list[str]:
    sizes = {name: r for name, r in s.items() if isinstance(r, dict) and "rows" in r}
    rows = []
    for name, r in sizes.items():
        for label in ("full length", "heavy-tailed"):
            x = r[label]
            rows.append([f"{name} ({r['params'] / 1e9:.2f}B)", label, x["ours_s"], x["hf_s"], x["ours_useful_tps"],
                         x["hf_useful_tps"], f"**{x['ratio']:.2f}x**", _lengths(x["lengths_ours"]),
                         _lengths(x["lengths_hf"]), x["ours_compile_s"]])
    first = next(iter(sizes.values()))
    return [f"\n**Sampler**, bfloat16, {first['rows']} rows ({first['prompts']} prompts x G={first['group']}), "
            f"{first['prompt']} + {first['new']} tokens, temperature 1, full vocabulary; useful tokens/s counts "
            "each row's tokens up to its end; lengths min/median/p90/max:\n",
            markdown_table(["model", "lengths", "ours s", "HF s", "ours useful tok/s", "HF useful tok/s", "ratio",
                            "ours lengths", "HF lengths", "ours compile s"], rows)]


def _update(u: dict) -> list[str]:
    rows = [[f"{r['shape'][0]}x{r['shape'][1]} rows, {r['shape'][2]} + {r['shape'][3]}", r["sequence"], r["seconds"],
             r["tflops"], f"{100 * r['mfu_datasheet']:.1f}%", f"{100 * r['mfu_measured']:.1f}%"] for r in u["runs"]]
    return [f"\n**Update** (the trainer's jitted GRPO update: forward, backward, AdamW; {u['dtype']}, remat=full; "
            f"{u['params'] / 1e9:.2f}B parameters; useful FLOPs only). Peaks: datasheet {u['datasheet_tflops']:.0f}, "
            f"measured matmul {u['measured_peak_tflops']:.0f} TFLOP/s:\n",
            markdown_table(["batch", "sequence", "s", "TFLOP/s", "MFU (datasheet)", "MFU (measured peak)"], rows)]


def _grpo(g: dict) -> list[str]:
    """One table over the stage's runs (older results hold a single run at the top level)."""
    runs = g.get("runs") or {"": g}
    lines = ["\n**GRPO iteration** (`benchmarks/grpo_iteration.py`, ours against TRL's `GRPOTrainer` on the same card; "
             "peak device memory: XLA's peak bytes in use and torch's max_memory_allocated, each in its own "
             "process):\n"]
    rows, failed = [], []
    for label, r in runs.items():
        if "timings" not in r:
            failed.append(f"- {label}: did not finish: {r.get('error', 'no result')[:200]}")
            continue
        ours = r["timings"].get("jaxrl_llm")
        for name, t in r["timings"].items():
            ratio = f"**{t['median'] / ours['median']:.2f}x**" if ours and name != "jaxrl_llm" else ""
            peak = (r.get("device_peak_gib") or {}).get(name)
            rows.append([label or "-", name, t["first"], t["median"], t["spread"], ratio,
                         "" if peak is None else f"{peak:.2f}"])
    lines.append(markdown_table(["run", "framework", "first iteration s", "iteration s (median)", "spread",
                                 "ours / TRL iterations/s", "peak device GiB"], rows))
    for label, r in runs.items():
        if "timings" in r:
            args = r["args"]  # without the interpreter's path, which says nothing
            shown = [a for i, a in enumerate(args) if a != "--trl-python" and (i == 0 or args[i - 1] != "--trl-python")]
            params = f"; {r['params'] / 1e9:.2f}B parameters" if "params" in r else ""
            lines.append(f"- {label + ': ' if label else ''}`{' '.join(shown)}`{params}")
            lines += [f"  - {line}" for line in r.get("lines", []) if "ratio against the faster" not in line]
    lines += failed
    if g.get("stopped"):
        lines.append(f"- stopped {g['stopped']}; the runs above are those it finished")
    return lines


def _memory(m: dict) -> list[str]:
    run = m["run"]
    resident = lambda pl: pl["params"] + pl["opt"] + pl["ref"] + pl["value"]
    step = lambda pl: resident(pl) + max(pl["batch"] + pl["score_temp"] + pl["score_out"],
                                         pl["batch"] + pl["update_temp"] + pl["update_out"])
    rows = [[label, _gib(resident(pl)), _gib(pl["score_temp"]), _gib(pl["update_temp"]), _gib(step(pl)),
             _gib(pl["peak"])]
            for label, pl in (("plan, compiled for CPU (docs/scaling.md's method)", m["plan_cpu"]),
                              ("plan, compiled for this device", m["plan_device"]))]
    return [f"\n**Memory** of a {run['size']} GRPO step, B={run['batch']} x G={run['group']}, {run['prompt']} + "
            f"{run['new']} tokens, grad_accum {run['grad_accum']}, params and compute {run['dtype']}, remat=full (GiB): "
            f"measured peak of the reference pass + update on the device **{_gib(m['measured_peak_bytes'])}** (of "
            f"{_gib(m['device_bytes_limit'])} available to XLA):\n",
            markdown_table(["", "resident (params, optimizer, reference)", "score temp", "update temp",
                            "reference + update peak", "peak with the sampler"], rows)]


SECTIONS = {"correctness": _correctness, "sampler": _sampler, "update": _update, "grpo": _grpo, "memory": _memory}


def render(results: dict) -> str:
    """The markdown report of a suite's results (what `--markdown` writes)."""
    stages = results["stages"]
    lines = [f"Run {results.get('date', '?')}, plan `{results.get('plan')}`, {results.get('seconds', 0):.0f} s in all."]
    if stages.get("env", {}).get("status") == "ok":
        lines += _env(stages["env"])
    lines += [f"- **{name}: {r.get('status')}** ({r.get('error', '')[:400]})"
              for name, r in stages.items() if r.get("status") != "ok"]
    for name, section in SECTIONS.items():
        if stages.get(name, {}).get("status") == "ok":
            lines += section(stages[name])
    return "\n".join(lines) + "\n"
