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


def test_readme_first_command_on_a_chat_dataset_without_torch(tmp_path):
    """The README's first command with a chat-template JSONL dataset, on an interpreter without PyTorch:
    it trains, prints no transformers warning about PyTorch, and ends with the run's summary."""
    tok, data = _chat_dataset(tmp_path)
    control = _python_without("torch", "import transformers\n", [], fr.cli_env(tmp_path / "cache"))
    assert TORCH_WARNING in control.stderr  # the interpreter does hide torch from transformers
    wd = tmp_path / "run"
    args = fr.train_args(wd, total_steps=1, tokenizer=tok, data__task="", data__path=data,
                         data__prompt_column="messages", data__use_chat_template=True, data__max_prompt_length=64,
                         model__max_position_embeddings=128,
                         reward__completion_format="text")  # the fixture's reward reads strings, not TRL's messages
    proc = subprocess.run([sys.executable, "-c", RUN_MODULE, "torch", "jaxrl_llm.train", *args], capture_output=True,
                          text=True, env=fr.cli_env(tmp_path / "cache"), cwd=fr.ROOT, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    output = proc.stdout + proc.stderr
    assert TORCH_WARNING not in output
    assert "chat template: True" in proc.stderr  # the prompts went through the template
    assert (wd / "DONE").read_text().strip() == "1"
    assert "trained steps 1-1 of 1" in proc.stdout and str(wd / "checkpoints" / "1") in proc.stdout
