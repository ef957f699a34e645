"""The package is the product: the wheel holds ``snet`` alone (server, client, protocol,
data, perf, cli) and no benchmarks; ``snet bench`` runs a checkout's, or says how."""

from __future__ import annotations

import shutil
import sys
import zipfile
from pathlib import Path

import pytest

from snet.cli import checkout
from snet.cli.main import main

from helpers import run_process

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = {"cli", "client", "data", "perf", "protocol", "server"}


def _copy_checkout(target: Path) -> None:
    """What a build reads, symbolic links kept: the build must not touch this checkout."""
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        if (ROOT / name).exists():
            shutil.copy2(ROOT / name, target / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info")
    shutil.copytree(ROOT / "src", target / "src", symlinks=True, ignore=ignore)
    for folder in (*PACKAGES, "bench"):
        shutil.copytree(ROOT / folder, target / folder, ignore=ignore)


@pytest.mark.system  # starts real processes
def test_the_wheel_holds_snet_alone_without_the_benchmarks(tmp_path: Path) -> None:
    source, out = tmp_path / "checkout", tmp_path / "dist"
    source.mkdir()
    _copy_checkout(source)
    build = run_process(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
         "--no-index", "-q", "-w", str(out), str(source)],
        timeout=300,
    )  # fmt: skip
    assert build.returncode == 0, build.stderr[-3000:]
    (wheel,) = out.glob("snet_train-*.whl")  # the distribution snet-train
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        info = next(n for n in names if n.endswith(".dist-info/top_level.txt"))
        assert archive.read(info).decode().split() == ["snet"]
    top = {name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")}
    assert top == {"snet"}
    packages = {
        name.split("/")[1] for name in names if name.startswith("snet/") and name.count("/") >= 2
    }
    assert packages == PACKAGES
    assert not [name for name in names if "bench" in name.split("/")[1]]
    assert "snet/server/dashboard/index.html" in names
    assert "snet/protocol/README.md" in names


def test_bench_without_a_checkout_says_how_in_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(checkout, "find_checkout", lambda: None)
    assert main(["bench", "--quick"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        "snet: the benchmarks are not installed with snet: in a source checkout run "
        "`python -m bench` (or `make bench`)"
    )
    assert main(["plan", "--calibrate"]) == 2
    assert "in a source checkout run `python -m bench`" in capsys.readouterr().err


@pytest.mark.system  # starts real processes
def test_bench_in_a_checkout_passes_its_arguments_through(tmp_path: Path) -> None:
    done = run_process(
        [sys.executable, "-m", "snet.cli", "bench", "--help"], timeout=60, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: python -m bench [-h] [--only ONLY] [--quick]")
