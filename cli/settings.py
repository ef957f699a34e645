"""One configuration object per process, from three sources: flags > environment > TOML.

A dataclass field ``http_port`` is the flag ``--http-port``, the environment variable
``SNET_HTTP_PORT`` and the key ``http_port`` in the file's table (``[server]`` or
``[worker]``). Job fields live in the ``[job]`` table (``[job.data]`` for the data) and
in ``SNET_JOB_<FIELD>`` variables (``SNET_JOB_DATA_<FIELD>``).

Every value, whichever source it comes from, is decoded here against its field's type
and allowed values, so a mistake is one ``ConfigError`` naming the key, the value and
what was expected (the command line prints it and exits 2). Unknown tables and keys are
refused, with the nearest known name as a suggestion. ``output_file`` checks a file a
command will write before it does its work.
"""

from __future__ import annotations

import difflib
import math
import os
import re
import sys
import tomllib
import typing
from dataclasses import MISSING, Field, dataclass, field, fields
from pathlib import Path
from typing import Any, TypeVar

from snet.protocol.errors import ConfigError
from snet.protocol.job import DataSpec, JobSpec
from snet.protocol.network import NetworkSpec
from snet.protocol.numbering import is_plain_int, plain_float, plain_int
from snet.transport.files import read_at_most

T = TypeVar("T")

TABLES = ("server", "job", "worker", "spert")  # one file may serve server and workers
CONFIG_BYTES = 1024 * 1024  # a config file is a few kilobytes: larger is something else
ACTIVATIONS = ("sigmoid", "tanh", "relu")
ACTIVATION_HELP = "activation of the hidden layers"  # a part of the network, not a field


@dataclass(frozen=True)
class ConfigFile:
    """A TOML file's tables (``[server]``, ``[job]``, ``[worker]``, ``[spert]``), with its
    path to name in messages; empty when no file was given."""

    path: str = ""
    tables: dict[str, dict[str, Any]] = field(default_factory=dict)

    def table(self, name: str) -> tuple[dict[str, Any], str]:
        """The table's keys and how to name the table in a message."""
        where = f"{self.path} [{name}]" if self.path else f"[{name}]"
        return dict(self.tables.get(name, {})), where


def say_unread_tables(document: ConfigFile, command: str) -> None:
    """Name on stderr the tables of ``document`` other than [job], which ``command``
    (``snet train``, ``snet demo``) reads alone: a [server] out_dir or min_workers was
    read by nobody without a word."""
    if others := sorted(set(document.tables) - {"job"}):
        tables = ", ".join(f"[{name}]" for name in others)
        print(f"snet {command}: reads the [job] table of {document.path} only: {tables} not used",
              file=sys.stderr)  # fmt: skip


def read_toml(path: str | None) -> ConfigFile:
    """The file's tables (none without a path); refuses tables no command knows."""
    if not path:
        return ConfigFile()
    try:
        text = read_at_most(path, CONFIG_BYTES, f"config file {path}", "a config file")
        document = tomllib.loads(text.decode("utf-8"))
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:  # tomllib.load's own read raised this, a traceback
        raise ConfigError(f"config file {path} is not valid TOML: not UTF-8 ({exc.reason} "
                          f"at byte {exc.start})") from None  # fmt: skip
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from exc
    for name, value in document.items():
        if not isinstance(value, dict):
            raise ConfigError(
                f"{path}: {name} = {value!r} is outside a table: settings go in "
                + ", ".join(f"[{known}]" for known in TABLES)
            )
        if name not in TABLES:
            raise ConfigError(f"{path}: unknown table [{name}]{_suggest(name, TABLES, '[{}]')}")
    return ConfigFile(path, document)


def _suggest(name: str, known: typing.Iterable[str], form: str = "{!r}") -> str:
    close = difflib.get_close_matches(name, list(known), n=1)
    return f" (did you mean {form.format(close[0])}?)" if close else ""


def env_name(prefix: str, setting: Field[Any]) -> str:
    """A field's environment variable: the prefix and the field's name in capitals."""
    return prefix + setting.name.upper()


def flag_name(setting: Field[Any]) -> str:
    """A field's flag: its name (or its metadata's ``flag``) with dashes."""
    return "--" + str(setting.metadata.get("flag", setting.name)).replace("_", "-")


def _expected(kind: Any) -> str:
    if kind is int:
        return "a whole number"
    if kind is float:
        return "a number"
    if kind is bool:
        return "true or false"
    if kind == tuple[float, ...]:
        return "a list of numbers (as a flag or variable: 0.2,0.1; in TOML: [0.2, 0.1])"
    return "text"


def decode(value: Any, kind: Any, label: str) -> Any:
    """``value`` (text from a flag or the environment, or a TOML value) as ``kind``;
    ``label`` names the key and the value's source in the error."""
    try:
        return _decode(value, kind)
    except (TypeError, ValueError, KeyError):
        raise ConfigError(f"{label}: {_as_written(value)} is not {_expected(kind)}") from None


def _as_written(value: Any) -> str:
    """A value as its user wrote it: TOML's ``true``, not Python's ``True``."""
    return str(value).lower() if isinstance(value, bool) else repr(value)


def _decode(value: Any, kind: Any) -> Any:
    if kind is str:
        if not isinstance(value, str):
            raise TypeError(value)
        return value
    if kind is bool:
        words = {"1": True, "true": True, "yes": True, "0": False, "false": False, "no": False}
        return value if isinstance(value, bool) else words[str(value).strip().lower()]
    if kind == tuple[float, ...]:
        items = value.split(",") if isinstance(value, str) else value
        if not isinstance(items, list | tuple) or not items:
            raise TypeError(value)
        return tuple(_decode(item, float) for item in items)
    if isinstance(value, bool):
        raise TypeError(value)
    if kind is int:
        if isinstance(value, float) or (isinstance(value, str) and not value.strip()):
            raise TypeError(value)
        # as typed: int() also took "1_0" and other scripts' digits (protocol/numbering.py)
        return plain_int(value, signed=True) if isinstance(value, str) else int(value)
    if kind is float:
        number = plain_float(value) if isinstance(value, str) else float(value)
        if not math.isfinite(number):
            raise ValueError(value)
        return number
    raise TypeError(f"no decoder for {kind}")


SERVICE_LINK = re.compile(r"^(tcp|udp|sctp)://[^/:]+:\d+$")
# The other variables Kubernetes gives a pod for each Service (``snet-worker``:
# SNET_WORKER_SERVICE_HOST, SNET_WORKER_SERVICE_PORT[_NAME], SNET_WORKER_PORT_7000_TCP,
# ..._PROTO, ..._PORT, ..._ADDR): none can be a setting's name
SERVICE_VARIABLE = re.compile(r"_(SERVICE_HOST|SERVICE_PORT(_\w+)?|PORT_\d+_(TCP|UDP|SCTP)\w*)$")


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


_FIELD_TYPES: dict[type, dict[str, Any]] = {}


def _field_types(cls: type) -> dict[str, Any]:
    """``cls``'s field types (read, never changed), resolved once per process: resolving
    evaluates each annotation's text, 0.6-0.9 ms a class, and a process that configures
    many servers and workers (the test suite's in-process ring: some 500 merges) paid it
    for each."""
    kinds = _FIELD_TYPES.get(cls)
    if kinds is None:
        kinds = _FIELD_TYPES[cls] = typing.get_type_hints(cls)
    return kinds


def merge(
    cls: type[T],
    values: dict[str, Any],
    env_prefix: str,
    flags: dict[str, Any],
    where: str = "the file",
    **extra: Any,
) -> T:
    """Build ``cls`` taking each field from flags, else environment, else ``values`` (a
    TOML table named ``where`` in messages); ``extra`` fields are given ready-made."""
    known = [f.name for f in fields(cls)]  # type: ignore[arg-type]
    for key in values:
        if key not in known or key in extra:
            raise ConfigError(f"{where}: unknown setting {key!r}{_suggest(key, known)}")
    kinds = _field_types(cls)
    chosen: dict[str, Any] = {}
    labels: dict[str, str] = {}  # where each chosen value came from, as the user wrote it
    overridden: list[tuple[str, Any, str]] = []  # (field, value, label) a higher one beat
    for f in fields(cls):  # type: ignore[arg-type]
        if f.name in extra:
            continue
        env = env_name(env_prefix, f)
        given = []  # (value, label), the one that wins first
        if flags.get(f.name) is not None:
            given.append((flags[f.name], flag_name(f)))
        if env in os.environ and not _service_link(env, os.environ[env]):
            given.append((os.environ[env], env))
        if f.name in values:
            given.append((values[f.name], f"{where} {f.name}"))
        if not given:
            if f.default is MISSING and f.default_factory is MISSING:
                raise ConfigError(f"{cls.__name__} needs {f.name}")
            continue
        # the ones overridden are checked too: [job] epochs = 3.0 beside --epochs 1 was
        # taken without a word, and refused once the flag was left out
        for value, label in reversed(given):
            chosen[f.name] = _setting(f, kinds[f.name], value, label)
            if label != given[0][1]:
                overridden.append((f.name, chosen[f.name], label))
        labels[f.name] = given[0][1]
    chosen.update(extra)
    defaults = {f.name: flag_name(f) for f in fields(cls)}  # type: ignore[arg-type]
    try:
        made = cls(**chosen)
    except TypeError as exc:
        raise ConfigError(f"bad settings for {cls.__name__}: {exc}") from exc
    except ConfigError as exc:  # a setting left at its default is named by its flag
        raise as_given(exc, {**defaults, **labels}) from exc
    for name, value, label in overridden:  # and by its own checks ([job] threads = -1)
        try:
            cls(**{**chosen, name: value})
        except ConfigError as exc:  # its own check (named first, naming no other field),
            text = str(exc)  # not one of a pair it meets only beside the winners
            pairs = (o for o in defaults if o != name and re.search(rf"\b{o}\b", text))
            if text.split(" ", 1)[0] == name and next(pairs, None) is None:
                raise as_given(exc, {**defaults, **labels, name: label}) from exc
        except (TypeError, ValueError):  # not a check of its own: the winner's stand
            pass
    return made


def _setting(setting: Field[Any], kind: Any, value: Any, label: str) -> Any:
    """``value`` decoded as ``kind``, one of the setting's choices if it has any (in any
    case: "Async" was taken for a typo of "sync"); ``ConfigError`` naming ``label``."""
    decoded = decode(value, kind, label)
    allowed = setting.metadata.get("choices")
    if not allowed or decoded in allowed:
        return decoded
    if isinstance(decoded, str) and decoded.lower() in allowed:
        return decoded.lower()
    raise ConfigError(
        f"{label}: {value!r} is not one of {', '.join(allowed)}{_suggest(str(value), allowed)}"
    )


def as_given(error: ConfigError, labels: dict[str, str]) -> ConfigError:
    """A class's own check names its field ("retry_seconds must be >= 0"): said instead
    with what the user gave, the flag, the variable or the file's key
    ("--retry-seconds must be >= 0"), which a user can find and change."""
    text = str(error)
    name = text.split(" ", 1)[0]
    said = labels[name] + text[len(name) :] if name in labels else text
    # a check of two settings ("port and http_port are both 7300") names the other later;
    # only a name with an underscore is taken for one there, not a word ("server")
    for other, label in labels.items():
        if "_" in other and other != name:
            said = re.sub(rf"(?<![\w-]){re.escape(other)}(?![\w-])", label, said)
    return error if said == text else ConfigError(said)


def _network(values: dict[str, Any], flags: dict[str, Any], where: str) -> NetworkSpec:
    """The job's network: sizes and the hidden layers' activation, from the ``network`` and
    ``activation`` flags, SNET_JOB_* variables or keys (a table: the full wire form)."""
    activation, label = flags.pop("activation", None), "--activation"
    if activation is None and "SNET_JOB_ACTIVATION" in os.environ:
        activation, label = os.environ["SNET_JOB_ACTIVATION"], "SNET_JOB_ACTIVATION"
    if activation is None and "activation" in values:
        activation, label = values["activation"], f"{where} activation"
    if isinstance(activation, str) and activation.lower() in ACTIVATIONS:
        activation = activation.lower()  # any case, as every choice
    if activation is not None and activation not in ACTIVATIONS:
        raise ConfigError(
            f"{label}: {activation!r} is not one of {', '.join(ACTIVATIONS)}"
            f"{_suggest(str(activation), ACTIVATIONS)}"
        )
    sizes, label = flags.pop("network", None), "--network"
    if sizes is None and "SNET_JOB_NETWORK" in os.environ:
        sizes, label = os.environ["SNET_JOB_NETWORK"], "SNET_JOB_NETWORK"
    if sizes is None and "network" in values:
        sizes, label = values["network"], f"{where} network"
    if isinstance(sizes, dict):
        return NetworkSpec.from_dict(sizes)
    if sizes is None:
        default = JobSpec().network
        return (
            NetworkSpec(default.sizes, (activation,) * len(default.activations))
            if activation
            else default
        )
    parts = sizes.split(":") if isinstance(sizes, str) else []
    if len(parts) < 2 or not all(is_plain_int(part.strip()) and int(part) > 0 for part in parts):
        raise ConfigError(
            f"{label}: {sizes!r} is not layer sizes, input to output, such as 117:512:10"
        )
    return NetworkSpec.parse(sizes, activation or "sigmoid")


def refuse_unknown_variables(prefix: str, known: set[str], what: str) -> None:
    """ConfigError for a variable of ``prefix`` that is not ``known``, as for a TOML key:
    ``SNET_JOB_EPOCHZ=2`` was ignored without a word, and the job ran 10 epochs."""
    for name in sorted(os.environ):
        if not name.startswith(prefix) or name in known or SERVICE_VARIABLE.search(name):
            continue
        if name.endswith("_PORT") and SERVICE_LINK.match(os.environ[name]):
            continue  # a Service's link (merge() says so for a name it reads)
        raise ConfigError(f"{name}: no such {what} setting{_suggest(name, known)}")


def refuse_unknown_fields(prefix: str, cls: type, what: str) -> None:
    """``refuse_unknown_variables`` for the settings of the dataclass ``cls``, each read as
    ``prefix`` and its name (the worker's, a board's, the job's data for snet eval)."""
    refuse_unknown_variables(prefix, {env_name(prefix, f) for f in fields(cls)}, what)


def _refuse_unknown_job_variables() -> None:
    known = {env_name("SNET_JOB_", f) for f in fields(JobSpec)} | {"SNET_JOB_ACTIVATION"}
    known |= {env_name("SNET_JOB_DATA_", f) for f in fields(DataSpec)}
    refuse_unknown_variables("SNET_JOB_", known, "job")


def build_job(values: dict[str, Any], flags: dict[str, Any], where: str = "[job]") -> JobSpec:
    """The job from the ``[job]`` table (named ``where``), ``SNET_JOB_*`` variables and job
    flags (text as typed, or values already of the field's type)."""
    values, flags = dict(values), dict(flags)
    _refuse_unknown_job_variables()
    data_values = values.pop("data", {})
    if not isinstance(data_values, dict):
        raise ConfigError(f"{where} data: expected a table ([job.data]), got {data_values!r}")
    network = _network(values, flags, where)
    values.pop("network", None)
    values.pop("activation", None)
    data_keys = [f.name for f in fields(DataSpec)]
    data_flags = {k: flags.pop(k) for k in data_keys if k in flags}
    data = merge(DataSpec, data_values, "SNET_JOB_DATA_", data_flags, f"{where[:-1]}.data]")
    return merge(JobSpec, values, "SNET_JOB_", flags, where, network=network, data=data)


def output_file(path: str, suffixes: tuple[str, ...], what: str) -> Path:
    """``path`` as a file a command will write, checked before the command's work: one of
    ``suffixes`` (the format is chosen by it) in a folder that exists. ``what`` names
    the file in the message (``--png``, ``output``)."""
    out = Path(path)
    if out.suffix.lower() not in suffixes:
        raise ConfigError(f"cannot write {what} {out}: use {', '.join(suffixes)}")
    if not out.parent.is_dir():
        missing = "is not a directory" if out.parent.exists() else "does not exist"
        raise ConfigError(f"cannot write {what} {out}: {out.parent} {missing}")
    return out
