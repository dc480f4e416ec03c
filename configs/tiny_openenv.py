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
import os

from jaxrl_llm.config import from_file


def get_config(arg=None):
    c = from_file(os.path.join(os.path.dirname(__file__), "tiny_multiturn.py"), arg)
    c.env.name = "openenv"
    c.env.kwargs.app = "tests.openenv_guess_server:app"  # module:app of create_app/create_fastapi_app
    c.env.kwargs.reset_columns = ("hidden",)  # the row's hidden digit goes to the server's reset(hidden=...)
    c.env.kwargs.step_timeout_s = 30.0  # a step without answer ends its episode (status `timeout`)
    return c
