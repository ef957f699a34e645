"""Staleness policies by name: what an asynchronous server does about stale updates.

An update computed on weights version ``b`` and applied in the step that makes version
``v + 1`` has staleness ``v - b``: the steps it did not see. The job (and the server's
control endpoint, at run time) names a policy with a short text:

- ``none``: apply every update as it is (SNet v2; the default);
- ``bounded:S``: bounded staleness (SSP, Ho et al. 2013): no update older than ``S``
  versions is applied; workers keep at most ``max(S, 1)`` updates unsettled so they rarely
  compute one, and the server refuses (and requeues the frames of) any that still is;
- ``rate``: the staleness-aware learning rate (Zhang et al. 2016): an update of
  staleness ``t`` counts ``1 / max(t, 1)`` of its gradient;
- ``dcasgd`` or ``dcasgd:L``: delay compensation (DC-ASGD, Zheng et al. 2017) with a
  constant ``lambda`` ``L`` (default 0.04): ``g + L * g * g * (W_now - W_base)``;
- ``gap``: Gap-Aware (Barkai et al. 2020): each value of the gradient is divided by
  ``max(1, |W_now - W_base| / C)``, ``C`` the running mean size of that weight's steps.

Plain data, parsed and checked here so that a bad name is refused where it is given.
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import ConfigError
from .numbering import plain_float, plain_int

POLICIES = ("none", "bounded", "rate", "dcasgd", "gap")
DC_LAMBDA = 0.04  # DC-ASGD-c's constant (Zheng et al. 2017 use 0.04 ... 2 with scaling)
MAX_BOUND = 1000


@dataclass(frozen=True)
class StalenessSetting:
    """A parsed policy: its name and its one parameter (the bound, or DC-ASGD's lambda)."""

    policy: str = "none"
    bound: int = 0  # bounded: the most versions an applied update may lag
    dc_lambda: float = DC_LAMBDA

    @classmethod
    def parse(cls, text: str) -> StalenessSetting:
        """``none``, ``bounded:S``, ``rate``, ``dcasgd[:L]``, ``gap``; ConfigError if not."""
        name, colon, argument = text.strip().lower().partition(":")
        if name not in POLICIES:
            raise ConfigError(f"staleness policy must be one of {POLICIES}, got {text!r}")
        if name == "bounded":
            try:
                bound = plain_int(argument)
            except ValueError:
                problem = f"bounded staleness needs a bound, e.g. bounded:2, got {text!r}"
                raise ConfigError(problem) from None
            if not 0 <= bound <= MAX_BOUND:
                raise ConfigError(f"the staleness bound must be in 0..{MAX_BOUND}, got {bound}")
            return cls("bounded", bound=bound)
        if name == "dcasgd":
            try:
                factor = plain_float(argument) if colon else DC_LAMBDA  # "dcasgd:" is not
            except ValueError:
                problem = f"dcasgd takes a number, e.g. dcasgd:0.04, got {text!r}"
                raise ConfigError(problem) from None
            if not 0.0 <= factor <= 100.0:
                raise ConfigError(f"dcasgd's lambda must be in [0, 100], got {factor}")
            return cls("dcasgd", dc_lambda=factor)
        if colon:
            raise ConfigError(f"staleness policy {name!r} takes no argument, got {text!r}")
        return cls(name)

    def describe(self) -> str:
        """The canonical text (``parse(describe())`` gives the same setting)."""
        if self.policy == "bounded":
            return f"bounded:{self.bound}"
        if self.policy == "dcasgd":
            return f"dcasgd:{self.dc_lambda:g}"
        return self.policy

    @property
    def needs_base_weights(self) -> bool:
        """DC-ASGD and Gap-Aware compare the weights now with those an update saw."""
        return self.policy in ("dcasgd", "gap")

    @property
    def changes_gradients(self) -> bool:
        """Whether the update rule sees anything but the gradients as they came."""
        return self.policy in ("rate", "dcasgd", "gap")


def canonical_staleness(text: str) -> str:
    """The canonical text of a policy (ConfigError for a bad one)."""
    return StalenessSetting.parse(text).describe()
