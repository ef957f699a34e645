"""protocol/README.md against the code: examples, message tables, dtypes, error codes."""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import typing
from dataclasses import fields
from pathlib import Path
from typing import Any

import numpy as np

from snet.protocol import auth, errors
from snet.protocol.framing import ALLOWED_DTYPES, NOT_IN_HEADER, encode_bytes
from snet.protocol.job import JobSpec
from snet.protocol.messages import (
    MESSAGE_TYPES,
    Goodbye,
    Heartbeat,
    Lease,
    Message,
    Welcome,
)
from snet.protocol.network import ELEMENT_DTYPE, ElementLayout

from wire_samples import (
    NETWORK,
    README_DTYPES,
    decode_one,
    example_frames,
    fenced_block,
    hand_frame,
    message_sections,
    parse_frame,
    readme_text,
    table_cells,
)

# ---------------------------------------------------------------- the README's contents


def test_readme_hex_examples_are_what_the_encoder_produces() -> None:
    expected: dict[str, Message] = {
        "goodbye": Goodbye("training complete"),
        "heartbeat": Heartbeat(1700000000.5),
        "lease": Lease(7, 0, np.array([5, 9, 2], dtype="<i8")),
    }
    found = example_frames(readme_text())
    assert {name for name, _ in found} == set(expected)
    for name, frame in found:
        assert frame == encode_bytes(expected[name]), f"README example {name!r} is stale"
        parse_frame(frame)


def test_readme_token_proof_vector() -> None:
    lines = fenced_block(readme_text(), "example-proof", "text").splitlines()
    vector = dict(line.split(": ", 1) for line in lines if line)
    token, nonce = vector["token"], bytes.fromhex(vector["nonce"])
    by_hand = hmac.new(token.encode("utf-8"), b"snet-hello\x00" + nonce, hashlib.sha256)
    assert by_hand.hexdigest() == vector["proof"]
    assert auth.proof(token, nonce).hex() == vector["proof"]
    assert auth.NONCE_BYTES == len(nonce) == 32


def test_readme_job_example_is_a_job() -> None:
    example = json.loads(fenced_block(readme_text(), "example-job", "json"))
    current = JobSpec().to_dict()
    assert set(example) == set(current)
    for key, value in current.items():
        if isinstance(value, dict):
            assert set(example[key]) == set(value), f"job[{key!r}] keys differ"
    JobSpec.from_dict(example)
    welcome = decode_one(hand_frame("welcome", {"worker_id": 1, "job": example}))
    assert isinstance(welcome, Welcome) and welcome.job == example


MSGPACK_TYPE_NAMES = {
    int: "int",
    float: "float",
    str: "str",
    bytes: "bin",
    bool: "bool",
    tuple[str, ...]: "array of str",
    dict[str, Any]: "map",
}
ARRAY_DTYPES = {
    "element": ELEMENT_DTYPE.str,
    "indices": "<i8",
    "norms": "<f8",
    "lengths": "<i8",
    "features": "<f4",
    "labels": "<i4",
    "velocity": "<f4",
    "error": "<f4",
    "partial": "<f4",
}


def test_readme_tables_match_every_message() -> None:
    sections = message_sections(readme_text())
    assert list(sections) == list(MESSAGE_TYPES)
    for type_name, cls in MESSAGE_TYPES.items():
        rows = [
            table_cells(line) for line in sections[type_name].splitlines() if line.startswith("| `")
        ]
        documented = {cells[0].strip("`"): cells[1] for cells in rows}
        hints = typing.get_type_hints(cls)
        scalars = [f.name for f in fields(cls) if f.name not in {*cls.ARRAYS, *NOT_IN_HEADER}]
        assert list(documented) == [*scalars, *cls.ARRAYS], type_name
        for name in scalars:
            assert documented[name] == MSGPACK_TYPE_NAMES[hints[name]], f"{type_name}.{name}"
        for name in cls.ARRAYS:
            assert documented[name] == f"`{ARRAY_DTYPES[name]}`", f"{type_name}.{name}"
        assert f"— {cls.__name__} (" in readme_text()


def test_readme_dtype_table_is_the_decoders() -> None:
    assert set(README_DTYPES) == ALLOWED_DTYPES
    for dtype, itemsize in README_DTYPES.items():
        assert np.dtype(dtype).itemsize == itemsize
        assert np.dtype(dtype).byteorder in "<|="


def test_readme_lists_every_error_code() -> None:
    classes = [v for v in vars(errors).values() if isinstance(v, type)]
    codes = {vars(c)["code"] for c in classes if isinstance(vars(c).get("code"), str)}
    assert {"malformed_frame", "frame_too_large", "update_rejected"} <= codes
    table = re.findall(r"^\| `(\w+)` \| (?:server|both|—) \|", readme_text(), flags=re.MULTILINE)
    assert codes <= set(table)


def test_readme_lists_every_error_code_sent_by_name() -> None:
    """Codes the server and the reference worker send as plain strings (not as an error
    class's ``code``): ``bad_job`` was sent by both and missing from section 9."""
    from snet.protocol import messages

    root = Path(errors.__file__).resolve().parent.parent  # the checkout (src/snet links)
    sent = set()
    for folder in ("server", "client", "transport"):
        for source in (root / folder).rglob("*.py"):
            text = source.read_text()
            sent |= set(re.findall(r'ErrorMessage\(\s*"(\w+)"', text))
            sent |= set(re.findall(r'\.fail\(\s*"(\w+)"', text))
    named = {*messages.DROPPED, messages.TOO_MANY_CONNECTIONS, messages.TOO_MANY_HANDSHAKES}
    assert "bad_job" in sent  # the scan still finds what it is for ("timeout" is named now)
    table = re.findall(r"^\| `(\w+)` \| (?:server|both|—) \|", readme_text(), flags=re.MULTILINE)
    assert sent | named <= set(table)


def test_element_layout_is_weights_then_biases_per_layer() -> None:
    layout = ElementLayout.for_network(NETWORK)
    assert layout.offsets == (0, 6, 9, 15) and layout.size == 17 and layout.nbytes == 68
    assert NETWORK.connections == 17
    w0 = np.arange(6, dtype="<f4").reshape(2, 3)
    b0 = np.array([10, 11, 12], dtype="<f4")
    w1 = np.arange(20, 26, dtype="<f4").reshape(3, 2)
    b1 = np.array([30, 31], dtype="<f4")
    flat = np.concatenate([w0.ravel(), b0, w1.ravel(), b1])
    views = layout.views(flat)
    for view, part in zip(views, (w0, b0, w1, b1), strict=True):
        assert np.array_equal(view, part)
    # W_l[i, j] sits at offset(W_l) + i * fan_out + j
    assert flat[9 + 2 * 2 + 1] == w1[2, 1]
