"""Numbers in settings' texts and peers' strings are plain ASCII digits
(protocol/numbering.py): ``int()``, ``float()`` and ``str.isdigit`` take more."""

from __future__ import annotations

import pytest

from snet.protocol.errors import ConfigError


def test_numbers_in_texts_are_plain_ascii_digits() -> None:
    """``str.isdigit`` takes "²" (which ``int`` then refuses: a ValueError where a
    ConfigError was promised, from a peer's memory capability) and other scripts' digits."""
    from snet.protocol.address import split_host_port
    from snet.protocol.memory import stated_memory
    from snet.protocol.numbering import is_plain_int, plain_float, plain_int

    assert is_plain_int("7000") and not is_plain_int("\u00b2") and not is_plain_int("1_0")
    assert not is_plain_int("\u0663") and not is_plain_int("") and not is_plain_int("-1")
    assert plain_int("042") == 42 and plain_float(".5") == 0.5 and plain_float("1e-3") == 0.001
    for bad in ("1_0", "\u0663", "", "1.2.3", "0x10"):
        with pytest.raises(ValueError):
            plain_float(bad)
    # nan and inf read as float reads them; the settings that cannot be them say so
    assert plain_float("-Inf") == float("-inf") and plain_float("nan") != plain_float("nan")
    with pytest.raises(ConfigError, match="is not memory:BYTES:CHUNK:FIXED"):
        stated_memory(["memory:\u00b2:1:1"])
    with pytest.raises(ValueError, match="not HOST:PORT"):
        split_host_port("host:\u0667\u0660\u0660\u0660")


def test_settings_are_read_as_typed(capsys: pytest.CaptureFixture[str]) -> None:
    """Flags, variables and a TOML file's strings went through int() and float(), which
    took "1_0" as 10 and other scripts' digits (found by a review); spaces around a
    number stay allowed, as before."""
    from snet.protocol.numbering import plain_int
    from snet.protocol.staleness import StalenessSetting

    from user_errors import error

    assert error(["train", "--epochs", "1_0"], capsys) == (
        "snet: --epochs: '1_0' is not a whole number"
    )
    assert error(["plan", "--workers", "1,\u0663"], capsys).startswith(
        "snet: --workers must be comma-separated whole numbers"
    )
    assert plain_int(" 42 ") == 42 and plain_int("-3", signed=True) == -3
    with pytest.raises(ValueError):
        plain_int("-3")
    assert StalenessSetting.parse("bounded: 2").bound == 2  # as int() took it before
    assert (
        error(["train", "--momentum", "nan"], capsys) == "snet: --momentum: 'nan' is not a number"
    )
    with pytest.raises(ConfigError, match="dcasgd's lambda must be in"):
        StalenessSetting.parse("dcasgd:inf")
