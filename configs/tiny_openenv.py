"""configs/tiny_multiturn.py's task through an OpenEnv server: the guess environment of
tests/openenv_guess_server.py (written with openenv-core's server API) launched by the trainer as a
subprocess on a free localhost port, driven through openenv-core's client, one session per episode.

  pip install openenv-core
  python -m jaxrl_llm.train --config=configs/tiny_openenv.py --workdir=/tmp/tiny_openenv

(from the repository root, so that `tests.openenv_guess_server` imports). Same episodes as
configs/tiny_multiturn.py for the same seed (tests/test_envs_openenv.py checks a training run against
guess_digit), so the same learning curve (docs/environments.md); each step adds the server's round trips.
A server already running: env.kwargs.base_url="http://host:port" instead of env.kwargs.app.
"""
import importlib.util
import os


def _tiny_multiturn_config(arg):
    """configs/tiny_multiturn.py's config (loaded by path: config files are not a package)."""
    path = os.path.join(os.path.dirname(__file__), "tiny_multiturn.py")
    spec = importlib.util.spec_from_file_location("_tiny_multiturn", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config(arg)


def get_config(arg=None):
    c = _tiny_multiturn_config(arg)
    c.env.name = "openenv"
    c.env.kwargs.app = "tests.openenv_guess_server:app"  # module:app of create_app/create_fastapi_app
    c.env.kwargs.reset_columns = ("hidden",)  # the row's hidden digit goes to the server's reset(hidden=...)
    c.env.kwargs.step_timeout_s = 30.0  # a step without answer ends its episode (status `timeout`)
    return c
