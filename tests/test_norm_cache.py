"""The server keeps the training frames' normalisation in the data cache (``data/cache.py``
``cached_norms``): a start on the same files and split reads it instead of taking a pass
over every training frame, and gets the very values it would have computed."""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

import numpy as np
import pytest

from snet.data.cache import (
    ABANDONED_SECONDS,
    _with_checksum,
    cache_directory,
    cached_norms,
    default_cache_directory,
)
from snet.data.joined import open_job_source, split_frames
from snet.data.norms import Norms, compute_norms
from snet.protocol.errors import DataError
from snet.protocol.job import DataSpec

from inprocess import Lab


def frames_set(path: Path, utterances: int, seed: int, shift: float = 0.0) -> Path:
    """``utterances`` of 5-15 frames of 13 features in three classes (``shift`` moves the
    features, not the shapes)."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(5, 16, utterances)
    features = rng.standard_normal((int(lengths.sum()), 13)).astype(np.float32) * 3 + shift
    np.savez(path, X=features, y=rng.integers(0, 3, utterances), lengths=lengths)
    return path


def _train(spec: DataSpec) -> np.ndarray:
    source = open_job_source(spec)
    return split_frames(spec, source.lengths, source.cv_utterances)[0]


def test_the_normalisation_is_computed_once_for_the_same_files_and_split(tmp_path: Path) -> None:
    spec = DataSpec(source=str(frames_set(tmp_path / "d.npz", 40, 1)), cv_fraction=0.25)
    cache, train = tmp_path / "cache", _train(spec)
    computed = compute_norms(open_job_source(spec), train).as_array()
    assert np.array_equal(cached_norms(open_job_source(spec), train, cache).as_array(), computed)
    (kept,) = cache.glob("norms-*.npy")
    source = open_job_source(spec)
    again = cached_norms(source, train, cache)
    assert again.as_array().tobytes() == computed.tobytes()  # bit for bit
    assert source.parts[0]._features._array is None  # type: ignore[attr-defined]  # not read
    # another split, or a rewritten file, is another normalisation
    other = DataSpec(source=spec.source, cv_fraction=0.25, split_seed=5)
    assert not np.array_equal(_train(other), train)
    assert np.array_equal(
        cached_norms(open_job_source(other), _train(other), cache).as_array(),
        compute_norms(open_job_source(other), _train(other)).as_array(),
    )
    frames_set(Path(spec.source), 40, 1, shift=1.0)  # the same size, rewritten in place:
    later = kept.stat().st_mtime_ns + 10**9  # its time tells it (a clock tick may not)
    os.utime(spec.source, ns=(later, later))
    changed = cached_norms(open_job_source(spec), train, cache).as_array()
    assert np.array_equal(changed, compute_norms(open_job_source(spec), train).as_array())
    assert np.allclose(changed[0], computed[0] + 1.0) and not np.array_equal(changed, computed)
    assert len(list(cache.glob("norms-*.npy"))) == 3 and kept.exists()


def test_the_normalisation_of_deleted_data_is_pruned(tmp_path: Path) -> None:
    gone = DataSpec(source=str(frames_set(tmp_path / "gone.npz", 10, 1)))
    cached_norms(open_job_source(gone), _train(gone), tmp_path / "c")
    Path(gone.source).unlink()
    kept = DataSpec(source=str(frames_set(tmp_path / "kept.npz", 10, 2)))
    cached_norms(open_job_source(kept), _train(kept), tmp_path / "c")
    assert len(list((tmp_path / "c").glob("norms-*"))) == 2  # kept's .npy and its note


def test_temporaries_of_killed_writers_are_pruned_and_live_ones_kept(tmp_path: Path) -> None:
    """A writer killed mid-write leaves its temporary (as big as a corpus's frames);
    the next write removes it once its pid is gone and it is an hour old, and only then."""
    cache = tmp_path / "c"
    cache.mkdir()
    gone = 4_194_305  # above the largest pid Linux gives (pid_max is at most 2**22)
    old = time.time() - ABANDONED_SECONDS - 60

    def planted(name: str, mtime: float | None = None) -> Path:
        path = cache / name
        path.write_bytes(b"half a file")
        if mtime is not None:
            os.utime(path, (mtime, mtime))
        return path

    abandoned = planted(f"frames-{'a' * 32}.npy.{gone}.0badf00d.tmp", old)
    abandoned_norms = planted(f"norms-{'b' * 32}.npy.{gone}.0badf00d.tmp", old)
    recent = planted(f"frames-{'c' * 32}.npy.{gone}.0badf00d.tmp")  # perhaps elsewhere
    alive = planted(f"frames-{'d' * 32}.npy.{os.getpid()}.0badf00d.tmp", old)
    not_ours = planted("frames-notes.tmp", old)
    spec = DataSpec(source=str(frames_set(tmp_path / "d.npz", 10, 1)))
    cached_norms(open_job_source(spec), _train(spec), cache)  # a write prunes
    assert not abandoned.exists() and not abandoned_norms.exists()
    assert recent.exists() and alive.exists() and not_ours.exists()


def test_without_a_usable_cache_it_is_computed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    spec = DataSpec(source=str(frames_set(tmp_path / "d.npz", 10, 1)))
    source, train = open_job_source(spec), _train(spec)
    computed = compute_norms(source, train).as_array()
    assert np.array_equal(cached_norms(source, train, None).as_array(), computed)
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    caplog.set_level(logging.WARNING, "snet.data")
    assert np.array_equal(cached_norms(source, train, blocker / "cache").as_array(), computed)
    assert "cannot keep the normalisation in the data cache" in caplog.text
    assert "--data-cache DIR names another directory, none keeps nothing" in caplog.text
    damaged = tmp_path / "cache"
    cached_norms(source, train, damaged)
    (kept,) = damaged.glob("norms-*.npy")
    kept.write_bytes(b"not an array")
    assert np.array_equal(cached_norms(source, train, damaged).as_array(), computed)
    assert "cannot be read" in caplog.text
    assert np.array_equal(np.load(kept)[:2], computed)  # written again


def _planted(path: Path, kind: str) -> None:
    """A file under the kept normalisation's name that ``compute_norms`` never writes."""
    kept = np.load(path)
    good = kept[:2]  # the third row: their checksum (_with_checksum)
    if kind == "changed value":  # by a hand or the disk: a probe's +0.5 was taken
        kept[0, 0] += 0.5
        np.save(path, kept)
    elif kind == "old layout":  # (2, F), as before the checksum
        np.save(path, good)
    elif kind == "one column":  # would broadcast: one mean and std for every feature
        np.save(path, good[:, :1])
    elif kind == "wider":
        np.save(path, np.concatenate([good, good[:, :1]], axis=1))
    elif kind == "tiny std":  # below the floor: the frames would be infinite
        np.save(path, _with_checksum(np.stack([good[0], np.full(good.shape[1], 1e-300)])))
    elif kind == "complex":
        np.save(path, good.astype(np.complex128))
    elif kind == "float32":
        np.save(path, good.astype(np.float32))
    elif kind == "structured":
        np.save(path, np.zeros(2, dtype=[("a", "<f8"), ("b", "<i4")]))
    elif kind == "huge header":  # a header that claims 16 TB: nothing may be allocated
        header = {"descr": "<f8", "fortran_order": False, "shape": (2, 10**12)}
        with open(path, "wb") as out:
            np.lib.format.write_array_header_1_0(out, header)
    elif kind == "another user's":  # in a shared directory: not trusted
        os.chown(path, 54321, 54321)


@pytest.mark.parametrize(
    "kind",
    ["changed value", "old layout", "one column", "wider", "tiny std", "complex", "float32",
     "structured", "huge header", "another user's"],
)  # fmt: skip
def test_a_kept_normalisation_that_compute_norms_never_wrote_is_computed_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, kind: str
) -> None:
    """Whatever sits under the file's name, the server starts with the normalisation of
    its data: a bad file is neither used nor a crash (a crash loop under systemd)."""
    if kind == "another user's" and os.geteuid() != 0:
        pytest.skip("making a file another user's needs root")
    spec = DataSpec(source=str(frames_set(tmp_path / "d.npz", 10, 1)))
    source, train, cache = open_job_source(spec), _train(spec), tmp_path / "cache"
    computed = compute_norms(source, train).as_array()
    cached_norms(source, train, cache)
    (kept,) = cache.glob("norms-*.npy")
    _planted(kept, kind)
    caplog.set_level(logging.WARNING, "snet.data")
    assert np.array_equal(cached_norms(source, train, cache).as_array(), computed)
    assert "cannot be read" in caplog.text
    if kind == "changed value":
        assert "its values do not match their checksum: changed since written" in caplog.text
    assert np.array_equal(np.load(kept)[:2], computed) and kept.stat().st_uid == os.getuid()


def test_the_data_cache_setting_names_the_directory() -> None:
    assert cache_directory("none") is None
    assert cache_directory("") == default_cache_directory()
    assert cache_directory("/some/where") == Path("/some/where")


@pytest.mark.parametrize("lab", ["uvloop"], indirect=True)  # its subject is not the loop
async def test_the_server_keeps_the_normalisation_where_its_data_cache_says(
    lab: Lab, tmp_path: Path
) -> None:
    data = frames_set(tmp_path / "d.npz", 60, 1)
    job = ["--data", str(data), "--network", "117:8:3", "--epochs", "1"]
    kept = await lab.server(*job, "--data-cache", str(tmp_path / "kept"), name="kept")
    unkept = await lab.server(*job, "--data-cache", "none", name="unkept")
    assert len(list((tmp_path / "kept").glob("norms-*.npy"))) == 1
    assert np.array_equal(
        kept.server.coordinator.plan.norms.as_array(),
        unkept.server.coordinator.plan.norms.as_array(),
    )
    again = await lab.server(*job, "--data-cache", str(tmp_path / "kept"), name="again")
    assert again.server.coordinator.plan.source.parts[0]._features._array is None  # type: ignore[attr-defined]
    assert np.array_equal(
        again.server.coordinator.plan.norms.as_array(),
        unkept.server.coordinator.plan.norms.as_array(),
    )
    for server in (kept, unkept, again):
        server.stop("test over")
        assert await server.wait(30) == "test over"


def test_a_normalisation_of_another_width_or_not_real_is_refused() -> None:
    """What a server sends (``DataInfo.norms``) is checked against the data's width by the
    worker: one column would have broadcast over every feature."""
    good = np.stack([np.zeros(13), np.ones(13)])
    assert Norms.from_array(good, 13).mean.shape == (13,)
    with pytest.raises(DataError, match="for 1 features, the data has 13"):
        Norms.from_array(good[:, :1], 13)
    with pytest.raises(DataError, match="real numbers"):
        Norms.from_array(good.astype(np.complex128), 13)
    with pytest.raises(DataError, match="2 x features"):
        Norms.from_array(np.zeros((2, 0)), 0)


def test_a_job_run_from_another_directory_prunes_nothing_still_there(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each note names its data files by absolute path: a job that prunes from another
    working directory keeps the copies of files that exist (it removed them when the
    note held the relative path it was given), and one old note of a relative path is
    kept (where it was relative to is not known)."""
    cache = tmp_path / "c"
    for name, seed in (("one", 1), ("two", 2)):
        (tmp_path / name).mkdir()
        frames_set(tmp_path / name / "d.npz", 10, seed)
        monkeypatch.chdir(tmp_path / name)
        spec = DataSpec(source="d.npz")
        cached_norms(open_job_source(spec), _train(spec), cache)  # the second one prunes
    notes = sorted(cache.glob("norms-*.json"))
    assert len(notes) == 2 and len(list(cache.glob("norms-*.npy"))) == 2
    assert {json.loads(note.read_text())["sources"][0] for note in notes} == {
        str(tmp_path / "one" / "d.npz"),
        str(tmp_path / "two" / "d.npz"),
    }
    (old,) = [n for n in notes if "one" in json.loads(n.read_text())["sources"][0]]
    old.write_text(json.dumps({"sources": ["d.npz"]}))  # as written before
    monkeypatch.chdir(tmp_path)  # where no d.npz is
    (tmp_path / "two" / "d.npz").unlink()  # the other one's data is gone
    spec = DataSpec(source=str(frames_set(tmp_path / "three.npz", 10, 3)))
    cached_norms(open_job_source(spec), _train(spec), cache)
    left = {note.name for note in cache.glob("norms-*.json")}
    assert old.name in left and old.with_suffix(".npy").exists()
    assert len(left) == 2  # the old one and three's: two's went with its data
