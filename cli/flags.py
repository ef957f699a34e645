"""Command-line flags generated from the configuration dataclasses' fields.

Each field of ``ServerConfig``, ``WorkerConfig``, ``JobSpec``, ``DataSpec`` and
``BoardConfig`` is one flag: its name is the field's (or the metadata's ``flag``), its
help the metadata's ``help``, followed by the field's default and its environment
variable; ``choices`` in the metadata are listed, and ``parallel`` marks a job field only
the service uses (``snet train`` does not offer it). So a new field is a new flag, with
nothing to write twice. Flags keep the text as typed (default None: not given);
``settings.merge`` decodes it with the environment and the TOML file, in one place.
"""

from __future__ import annotations

import argparse
from dataclasses import MISSING, Field, fields
from typing import Any

from .settings import ACTIVATION_HELP, ACTIVATIONS, env_name, flag_name

Parser = argparse.ArgumentParser | argparse._ArgumentGroup
NESTED = ("JobSpec", "DataSpec")  # fields holding a whole dataclass, not a flag


def default_of(field: Field[Any]) -> Any:
    if field.default is not MISSING:
        return field.default
    if field.default_factory is not MISSING:
        return field.default_factory()
    return None


def shown(value: Any) -> str:
    """A default as one would type it on the command line."""
    if isinstance(value, tuple):
        return ",".join(f"{item:g}" if isinstance(item, float) else str(item) for item in value)
    if hasattr(value, "describe"):
        return str(value.describe())
    return '""' if value == "" else str(value)


def add_field_flags(
    parser: Parser,
    cls: type,
    env_prefix: str,
    *,
    skip: tuple[str, ...] = (),
    only: tuple[str, ...] | None = None,
    defaults: dict[str, Any] | None = None,
) -> None:
    """One flag per field of ``cls`` (nested dataclasses and ``skip`` left out; ``only``
    these when given); ``defaults`` are a command's own defaults, shown as such."""
    for field in fields(cls):
        if field.name in skip or (only is not None and field.name not in only):
            continue
        if getattr(field.type, "__name__", field.type) in NESTED:
            continue  # the job's and the data's own flags (add_job_flags)
        choices = field.metadata.get("choices")
        default = (defaults or {}).get(field.name, default_of(field))
        text = str(field.metadata["help"])  # every field has help: a KeyError here is a bug
        flag = flag_name(field)
        switch: dict[str, Any] = {}
        if field.type in (bool, "bool"):  # --insecure alone means true; a value may follow
            switch = {"nargs": "?", "const": "true"}
        parser.add_argument(
            flag,
            dest=field.name,
            **switch,
            metavar="{" + ",".join(choices) + "}"
            if choices
            else flag[2:].replace("-", "_").upper(),
            help=f"{text} (default {shown(default)}; env {env_name(env_prefix, field)})".replace(
                "%", "%%"
            ),
        )


def add_job_flags(
    parser: argparse.ArgumentParser,
    *,
    parallel: bool = True,
    defaults: dict[str, Any] | None = None,
) -> None:
    """The job's flags (``[job]`` in the TOML file) and its data's (``[job.data]``);
    without ``parallel``, only those sequential training uses; ``defaults``: the
    command's own, as ``add_field_flags``."""
    from snet.protocol.job import DataSpec, JobSpec

    group = parser.add_argument_group("job (what to train; also [job] in the TOML file)")
    unused = tuple(f.name for f in fields(JobSpec) if f.metadata.get("parallel"))
    add_field_flags(group, JobSpec, "SNET_JOB_", skip=() if parallel else unused, defaults=defaults)
    group.add_argument(
        "--activation",
        metavar="{" + ",".join(ACTIVATIONS) + "}",
        help=f"{ACTIVATION_HELP} (default sigmoid; env SNET_JOB_ACTIVATION)",
    )
    data = parser.add_argument_group("data (also [job.data] in the TOML file)")
    add_field_flags(data, DataSpec, "SNET_JOB_DATA_")


def add_config_flag(parser: argparse.ArgumentParser, tables: str) -> None:
    parser.add_argument("--config", metavar="FILE", help=f"TOML file with {tables}")


def given(args: argparse.Namespace, cls: type) -> dict[str, Any]:
    """The flags of ``cls``'s fields that were given, by field name."""
    return {
        f.name: value for f in fields(cls) if (value := getattr(args, f.name, None)) is not None
    }


def given_job(args: argparse.Namespace) -> dict[str, Any]:
    """The job's and its data's flags that were given (``settings.build_job`` takes them)."""
    from snet.protocol.job import DataSpec, JobSpec

    flags = given(args, JobSpec) | given(args, DataSpec)
    if getattr(args, "activation", None) is not None:
        flags["activation"] = args.activation
    return flags
