"""One configuration object per process, from three sources: flags > environment > TOML.

A dataclass field ``http_port`` is the flag ``--http-port``, the environment variable
``SNET_HTTP_PORT`` and the key ``http_port`` in the file's table (``[server]`` or
``[worker]``). Job fields live in the ``[job]`` table (``[job.data]`` for the data) and
in ``SNET_JOB_<FIELD>`` variables.
"""

from __future__ import annotations

import os
import re
import sys
import tomllib
from dataclasses import MISSING, fields
from typing import Any, TypeVar

from snet.protocol.errors import ConfigError
from snet.protocol.job import DataSpec, JobSpec
from snet.protocol.network import NetworkSpec

T = TypeVar("T")


def read_toml(path: str | None) -> dict[str, Any]:
    if not path:
        return {}
    try:
        with open(path, "rb") as handle:
            return tomllib.load(handle)
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from exc


def _convert(text: str, kind: Any, name: str) -> Any:
    try:
        if kind in (int, "int"):
            return int(text)
        if kind in (float, "float"):
            return float(text)
        if kind in (bool, "bool"):
            if text.lower() in ("1", "true", "yes", "on"):
                return True
            if text.lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError(text)
    except ValueError as exc:
        raise ConfigError(f"{name}={text!r} is not a valid {kind}") from exc
    return text


SERVICE_LINK = re.compile(r"^(tcp|udp|sctp)://[^/:]+:\d+$")


def _service_link(name: str, value: str) -> bool:
    """Whether ``name=value`` is a Kubernetes service link, not a setting: a Service named
    ``snet`` (``snet-http``) gives every pod ``SNET_PORT=tcp://10.96.0.12:7000``
    (``SNET_HTTP_PORT=...``), which would otherwise be read as the port. It is ignored,
    with a line that says why and how to stop it."""
    if not SERVICE_LINK.match(value):
        return False
    service = name.removesuffix("_PORT").lower().replace("_", "-")
    print(
        f"snet: ignoring {name}={value}: that is the Kubernetes service link of a Service "
        f"named {service!r}, not a setting (set enableServiceLinks: false in the pod spec, "
        "or name the Service otherwise)",
        file=sys.stderr,
    )
    return True


def merge(
    cls: type[T],
    table: dict[str, Any],
    env_prefix: str,
    flags: dict[str, Any],
    **extra: Any,
) -> T:
    """Build ``cls`` taking each field from flags, else environment, else table."""
    values: dict[str, Any] = {}
    known = {f.name for f in fields(cls)}  # type: ignore[arg-type]
    unknown = set(table) - known
    if unknown:
        raise ConfigError(f"unknown setting(s) {sorted(unknown)} for {cls.__name__}")
    for f in fields(cls):  # type: ignore[arg-type]
        if f.name in extra:
            continue
        env_name = env_prefix + f.name.upper()
        if flags.get(f.name) is not None:
            values[f.name] = flags[f.name]
        elif env_name in os.environ and not _service_link(env_name, os.environ[env_name]):
            values[f.name] = _convert(os.environ[env_name], f.type, env_name)
        elif f.name in table:
            values[f.name] = table[f.name]
        elif f.default is MISSING and f.default_factory is MISSING:
            raise ConfigError(f"{cls.__name__} needs {f.name}")
    values.update(extra)
    try:
        return cls(**values)
    except TypeError as exc:
        raise ConfigError(f"bad settings for {cls.__name__}: {exc}") from exc


def build_job(table: dict[str, Any], flags: dict[str, Any]) -> JobSpec:
    """The job from the ``[job]`` table, ``SNET_JOB_*`` variables and job flags."""
    table = dict(table)
    data_table = dict(table.pop("data", {}))
    network_text = flags.pop("network", None) or os.environ.get("SNET_JOB_NETWORK")
    activation = flags.pop("activation", None) or os.environ.get("SNET_JOB_ACTIVATION")
    network_value = table.pop("network", None)
    table_activation = str(table.pop("activation", "sigmoid"))
    if network_text or isinstance(network_value, str):
        network = NetworkSpec.parse(
            network_text or str(network_value),
            activation or table_activation,
        )
    elif isinstance(network_value, dict):
        network = NetworkSpec.from_dict(network_value)
    else:
        default = JobSpec().network
        network = (
            NetworkSpec(default.sizes, (activation,) * len(default.activations))
            if activation
            else default
        )
    data_keys = tuple(f.name for f in fields(DataSpec))
    data_flags: dict[str, Any] = {k: flags.pop(k) for k in data_keys if k in flags}
    data = merge(DataSpec, data_table, "SNET_JOB_DATA_", data_flags)
    rates = flags.pop("learning_rates", None)
    if isinstance(rates, str):
        flags["learning_rates"] = tuple(float(x) for x in rates.split(","))
    if "learning_rates" in table:
        table["learning_rates"] = tuple(float(x) for x in table["learning_rates"])
    env_rates = os.environ.get("SNET_JOB_LEARNING_RATES")
    if env_rates and not flags.get("learning_rates"):
        flags["learning_rates"] = tuple(float(x) for x in env_rates.split(","))
    return merge(JobSpec, table, "SNET_JOB_", flags, network=network, data=data)
