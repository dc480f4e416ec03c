"""A new user's first command, as the README gives it: `python -m jaxrl_llm.train --config=configs/tiny.py`
on the install `pip install -e .` makes -- without PyTorch (a test-only dependency) -- and with a
chat-template dataset, which needs jinja2 from install_requires."""
import ast
import json
import os
import subprocess
import sys

import fixtures_reliability as fr
from fixtures_data import make_tiny_tokenizer

TORCH_WARNING = "PyTorch was not found"
# An interpreter where the packages named in argv[1] are not installed, as far as anyone can tell:
# `import torch` fails and importlib.util.find_spec("torch") is None, what transformers sees on the
# README's install (sys.modules["torch"] = None would not do: `datasets` tests `"torch" in sys.modules`).
WITHOUT = """import importlib.machinery, runpy, sys
hidden = sys.argv.pop(1).split(",")
class Finder(importlib.machinery.PathFinder):
    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name.split(".")[0] in hidden:
            return None
        return importlib.machinery.PathFinder.find_spec(name, path, target)
sys.meta_path = [Finder if f is importlib.machinery.PathFinder else f for f in sys.meta_path]
"""
RUN_MODULE = WITHOUT + "runpy.run_module(sys.argv.pop(1), run_name='__main__', alter_sys=True)\n"


def _python_without(modules: str, code: str, args, env, timeout=300):
    return subprocess.run([sys.executable, "-c", WITHOUT + code, modules, *args], capture_output=True, text=True,
                          env=env, cwd=fr.ROOT, timeout=timeout)


def _chat_dataset(tmp_path):
    tok_dir = tmp_path / "tok"
    make_tiny_tokenizer(tok_dir, chat_template=True)
    rows = [{"messages": [{"role": "user", "content": f"What is {i}+{i}?"}], "answer": str(2 * i), "level": 1}
            for i in range(8)]
    path = tmp_path / "chat.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(tok_dir), str(path)


def test_install_requires_jinja2():
    """The chat-template path below runs jinja2 (transformers' apply_chat_template); a fresh install has it
    only through install_requires."""
    tree = ast.parse(open(os.path.join(fr.ROOT, "setup.py"), encoding="utf-8").read())
    call = next(n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "setup")
    requires = ast.literal_eval(next(k.value for k in call.keywords if k.arg == "install_requires"))
    assert any(r.split(">")[0].split("=")[0].strip().lower() == "jinja2" for r in requires), requires


def test_chat_template_dataset_needs_jinja2(tmp_path):
    """Without jinja2 the same dataset fails to load: the requirement above is what makes the run work."""
    tok, data = _chat_dataset(tmp_path)
    code = ("from jaxrl_llm.data import default_data_config, load_prompt_dataset, load_tokenizer\n"
            "c = default_data_config(); c.path = sys.argv[1]; c.prompt_column = 'messages'\n"
            "load_prompt_dataset(c, load_tokenizer(sys.argv[2]))\n")
    proc = _python_without("jinja2", code, [data, tok], fr.cli_env(tmp_path / "cache"))
    assert proc.returncode != 0 and "jinja2" in proc.stderr, proc.stderr[-2000:]


def _cache_entries(directory) -> set[str]:
    return {n for n in os.listdir(directory) if not n.startswith(".")} if os.path.isdir(directory) else set()


def test_readme_first_command_on_a_chat_dataset_without_torch(tmp_path):
    """The README's first command with a chat-template JSONL dataset, on an interpreter without PyTorch:
    it trains, prints no transformers warning about PyTorch, and ends with the run's summary. It keeps its
    compiled programs in the default compilation cache (under $XDG_CACHE_HOME here), and the same command
    in another workdir compiles nothing new: every program is read back."""
    tok, data = _chat_dataset(tmp_path)
    # Every program kept (the test run's thresholds, stated here so that a run without its cache,
    # JAXRL_TEST_NO_COMPILATION_CACHE=1, keeps them too); the config's default directory applies (JAX's
    # own variable would win over it).
    env = fr.cli_env(None, XDG_CACHE_HOME=str(tmp_path / "xdg"), JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
                     JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    cache = tmp_path / "xdg" / "jaxrl_llm" / "jax"
    control = _python_without("torch", "import transformers\n", [], env)
    assert TORCH_WARNING in control.stderr  # the interpreter does hide torch from transformers
    wd = tmp_path / "run"
    fields = dict(total_steps=1, tokenizer=tok, data__task="", data__path=data, data__prompt_column="messages",
                  data__use_chat_template=True, data__max_prompt_length=64, model__max_position_embeddings=128,
                  reward__completion_format="text")  # the fixture's reward reads strings, not TRL's messages
    proc = subprocess.run([sys.executable, "-c", RUN_MODULE, "torch", "jaxrl_llm.train", *fr.train_args(wd, **fields)],
                          capture_output=True, text=True, env=env, cwd=fr.ROOT, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    output = proc.stdout + proc.stderr
    assert TORCH_WARNING not in output
    assert "chat template: True" in proc.stderr  # the prompts went through the template
    assert (wd / "DONE").read_text().strip() == "1"
    assert "trained steps 1-1 of 1" in proc.stdout and str(wd / "checkpoints" / "1") in proc.stdout
    first = _cache_entries(cache)
    assert len(first) >= 4, first  # the sampler, score, prepare and update programs at least
    again = fr.run_cli("train", fr.train_args(tmp_path / "again", **fields), env, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert _cache_entries(cache) == first


def test_compilation_cache_directory_from_the_config_or_the_environment(tmp_path, monkeypatch, capsys):
    """The command lines' cache: JAX_COMPILATION_CACHE_DIR wins, "" is off, $XDG_CACHE_HOME moves the
    default, a directory that cannot be made is one warning and no cache (the run goes on)."""
    import jax

    from jaxrl_llm import config as config_lib
    from jaxrl_llm.cli import use_compilation_cache
    updates = {}
    monkeypatch.setattr(jax.config, "update", lambda name, value: updates.__setitem__(name, value))
    c = config_lib.base_config()
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path / "env"))
    assert use_compilation_cache(c, "prog") == str(tmp_path / "env") and updates == {}
    monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert use_compilation_cache(c, "prog") == str(tmp_path / "xdg" / "jaxrl_llm" / "jax")
    assert updates == {"jax_compilation_cache_dir": str(tmp_path / "xdg" / "jaxrl_llm" / "jax"),
                       "jax_compilation_cache_max_size": 10 * 2**30}
    assert (tmp_path / "xdg" / "jaxrl_llm" / "jax").is_dir()
    updates.clear()
    c.compilation_cache.dir, c.compilation_cache.max_gb = str(tmp_path / "mine"), 0.5
    assert use_compilation_cache(c, "prog") == str(tmp_path / "mine")
    assert updates["jax_compilation_cache_max_size"] == 2**29
    updates.clear()
    c.compilation_cache.dir = ""
    assert use_compilation_cache(c, "prog") == "" and updates == {}
    (tmp_path / "file").write_text("")
    c.compilation_cache.dir = str(tmp_path / "file" / "cache")  # under a file: cannot be made
    assert use_compilation_cache(c, "prog") == "" and updates == {}
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"prog: warning: compilation_cache.dir {tmp_path / 'file' / 'cache'}")
