"""KL-coefficient controllers for the KL-to-reference penalty (β of PPO's reward, GRPO's loss).

Both controllers are pytrees whose leaves are float32 scalars, so they live in the jitted,
checkpointed train state and `update(state, kl, n_steps)` is a pure function returning a new state
(call it as `ctrl.update(kl, n)` or `AdaptiveKLController.update(ctrl, kl, n)`).

Adaptive rule (Ziegler et al. 2019, as in TRL):
    β ← β·(1 + clip(KL/target − 1, −0.2, 0.2)·n_steps/horizon)
where KL is the current KL estimate in the units of `target` (TRL: the batch mean of each
sequence's summed per-token KL) and n_steps the number of samples seen since the last update.
The multiplier stays positive as long as n_steps < 5·horizon, which any sane horizon ensures.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct


def _positive(cls_name, name, x):
    if jnp.ndim(x) != 0:
        raise ValueError(f"{cls_name}: {name} must be a scalar, got shape {jnp.shape(x)}")
    if not isinstance(x, jax.core.Tracer) and not float(x) > 0:
        raise ValueError(f"{cls_name}: {name} must be > 0, got {float(x)}")
    return jnp.asarray(x, jnp.float32)


def _check_update_args(cls_name, kl, n_steps):
    for name, x in (("kl", kl), ("n_steps", n_steps)):
        if jnp.ndim(x) != 0:
            raise ValueError(f"{cls_name}.update: {name} must be a scalar, "
                             f"got shape {jnp.shape(x)}")


@struct.dataclass
class FixedKLController:
    """A constant KL coefficient with the controller interface.

    Attributes:
      value: float32 scalar β.
    """

    value: jax.Array

    @classmethod
    def create(cls, kl_coef):
        """kl_coef >= 0 (0 disables the penalty)."""
        if jnp.ndim(kl_coef) != 0:
            raise ValueError(f"FixedKLController: kl_coef must be a scalar, got shape "
                             f"{jnp.shape(kl_coef)}")
        if not isinstance(kl_coef, jax.core.Tracer) and not float(kl_coef) >= 0:
            raise ValueError(f"FixedKLController: kl_coef must be >= 0, got {float(kl_coef)}")
        return cls(value=jnp.asarray(kl_coef, jnp.float32))

    def update(self, kl, n_steps):
        """Returns the controller unchanged (same signature as the adaptive one)."""
        _check_update_args("FixedKLController", kl, n_steps)
        return self


@struct.dataclass
class AdaptiveKLController:
    """Proportional controller of β towards a target KL (see the module docstring).

    Attributes:
      value: float32 scalar β, the current coefficient.
      target: float32 scalar KL target (> 0).
      horizon: float32 scalar, the number of samples over which a full 20% correction applies.
    """

    value: jax.Array
    target: jax.Array
    horizon: jax.Array

    @classmethod
    def create(cls, init_kl_coef, target, horizon):
        """All three > 0."""
        name = "AdaptiveKLController"
        return cls(value=_positive(name, "init_kl_coef", init_kl_coef),
                   target=_positive(name, "target", target),
                   horizon=_positive(name, "horizon", horizon))

    def update(self, kl, n_steps):
        """β ← β·(1 + clip(kl/target − 1, −0.2, 0.2)·n_steps/horizon); returns a new controller.

        Args:
          kl: scalar KL estimate, same units as `target`.
          n_steps: scalar number of samples since the last update.
        """
        _check_update_args("AdaptiveKLController", kl, n_steps)
        error = jnp.clip(jnp.asarray(kl, jnp.float32) / self.target - 1.0, -0.2, 0.2)
        mult = 1.0 + error * jnp.asarray(n_steps, jnp.float32) / self.horizon
        return self.replace(value=(self.value * mult).astype(jnp.float32))
