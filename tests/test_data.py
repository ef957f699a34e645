"""The worker's data: loading, the utterance split, normalisation and context windows."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from snet.data.corpus import Corpus, load_corpus
from snet.data.sources import open_source
from snet.protocol.errors import DataError
from snet.protocol.job import DataSpec
from snet.protocol.splits import frames_of, split_utterances


@pytest.fixture(scope="module")
def fsdd() -> Corpus:
    return load_corpus(DataSpec(), outputs=10)


def write_npz(path: Path, **arrays: Any) -> str:
    np.savez(path, **arrays)
    return str(path)


def small_arrays() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Six utterances of 2..7 frames of 3 features; frame i holds (i, 10 i, -i) + offset."""
    lengths = np.array([3, 2, 5, 4, 7, 6])
    n = int(lengths.sum())
    i = np.arange(n, dtype=np.float32)
    frames = np.stack([i, 10 * i, -i], axis=1) + np.float32(5.0)
    labels = np.array([0, 1, 2, 1, 0, 2])
    return frames, labels, lengths


# ---------------------------------------------------------------- the default data


def test_default_data_shape(fsdd: Corpus) -> None:
    assert fsdd.frames.shape == (53999, 13)
    assert fsdd.frames.dtype == np.float32
    assert fsdd.features == 13
    assert fsdd.labels.shape == (53999,)
    assert fsdd.labels.dtype == np.int64
    assert set(np.unique(fsdd.labels)) == set(range(10))
    assert fsdd.context == 4
    assert fsdd.pattern_size == 117


def test_default_split_disjoint_and_covering(fsdd: Corpus) -> None:
    train, cv = fsdd.train_frames, fsdd.cv_frames
    assert len(np.intersect1d(train, cv)) == 0
    np.testing.assert_array_equal(np.sort(np.concatenate([train, cv])), np.arange(53999))
    assert 0.05 < len(cv) / 53999 < 0.15  # cv_fraction 0.1 of the utterances
    # utterances, not frames, are split: no utterance has frames on both sides
    in_cv = np.zeros(53999, dtype=bool)
    in_cv[cv] = True
    starts = fsdd.utterance_start
    assert np.array_equal(in_cv, in_cv[starts])


def test_default_split_matches_split_utterances(fsdd: Corpus) -> None:
    starts = np.unique(fsdd.utterance_start)
    lengths = np.diff(np.append(starts, 53999))
    assert len(lengths) == 3000
    train_utts, cv_utts = split_utterances(3000, 0.1, 0)
    np.testing.assert_array_equal(fsdd.train_frames, frames_of(train_utts, lengths))
    np.testing.assert_array_equal(fsdd.cv_frames, frames_of(cv_utts, lengths))


def test_default_normalised_on_training_frames(fsdd: Corpus) -> None:
    train = fsdd.frames[fsdd.train_frames].astype(np.float64)
    np.testing.assert_allclose(train.mean(axis=0), 0.0, atol=1e-4)
    np.testing.assert_allclose(train.std(axis=0), 1.0, atol=1e-4)
    assert fsdd.mean.shape == (13,) and fsdd.std.shape == (13,)
    assert (fsdd.std > 0).all()
    # the cross-validation frames are normalised with the same statistics, not their own
    cv = fsdd.frames[fsdd.cv_frames].astype(np.float64)
    assert np.abs(cv.mean(axis=0)).max() > 1e-3


def test_default_windows(fsdd: Corpus) -> None:
    indices = fsdd.train_frames[:100]
    windows = fsdd.windows(indices)
    assert windows.shape == (100, 117)
    assert windows.dtype == np.float32
    # the centre of each window is the frame itself
    np.testing.assert_array_equal(windows[:, 4 * 13 : 5 * 13], fsdd.frames[indices])


def test_default_windows_clip_at_utterance_start_and_end(fsdd: Corpus) -> None:
    starts = np.unique(fsdd.utterance_start)
    first = int(starts[1])  # first frame of the second utterance
    window = fsdd.windows(np.array([first])).reshape(9, 13)
    for k in range(5):  # left context and centre all repeat the first frame
        np.testing.assert_array_equal(window[k], fsdd.frames[first])
    for k in range(5, 9):
        np.testing.assert_array_equal(window[k], fsdd.frames[first + k - 4])
    last = first - 1  # last frame of the first utterance
    window = fsdd.windows(np.array([last])).reshape(9, 13)
    for k in range(4, 9):
        np.testing.assert_array_equal(window[k], fsdd.frames[last])
    np.testing.assert_array_equal(window[0], fsdd.frames[last - 4])


# ---------------------------------------------------------------- small .npz files


def test_npz_with_per_utterance_labels(tmp_path: Path) -> None:
    frames, labels, lengths = small_arrays()
    path = write_npz(tmp_path / "utt.npz", X=frames, y=labels, lengths=lengths)
    corpus = load_corpus(DataSpec(source=path, context=2, cv_fraction=0.3, split_seed=1), 3)
    np.testing.assert_array_equal(corpus.labels, np.repeat(labels, lengths))
    assert corpus.frames.shape == (27, 3)
    assert corpus.pattern_size == 15
    assert len(np.intersect1d(corpus.train_frames, corpus.cv_frames)) == 0
    np.testing.assert_array_equal(
        np.sort(np.concatenate([corpus.train_frames, corpus.cv_frames])), np.arange(27)
    )
    train = frames[corpus.train_frames].astype(np.float64)
    np.testing.assert_allclose(corpus.mean, train.mean(axis=0), rtol=1e-6)
    np.testing.assert_allclose(corpus.std, train.std(axis=0), rtol=1e-6)
    expected = (frames - train.mean(axis=0)) / train.std(axis=0)
    np.testing.assert_allclose(corpus.frames, expected, rtol=1e-5, atol=1e-6)


def test_npz_with_per_frame_labels(tmp_path: Path) -> None:
    frames, _, lengths = small_arrays()
    per_frame = np.arange(27) % 4
    path = write_npz(tmp_path / "frame.npz", X=frames, y=per_frame, lengths=lengths)
    corpus = load_corpus(DataSpec(source=path, context=1), 4)
    np.testing.assert_array_equal(corpus.labels, per_frame)
    assert corpus.labels.dtype == np.int64


def test_windows_of_small_file_clip_both_ends(tmp_path: Path) -> None:
    frames, labels, lengths = small_arrays()
    path = write_npz(tmp_path / "w.npz", X=frames, y=labels, lengths=lengths)
    corpus = load_corpus(DataSpec(source=path, context=2), 3)
    np.testing.assert_array_equal(corpus.utterance_start[:5], [0, 0, 0, 3, 3])
    np.testing.assert_array_equal(corpus.utterance_end[:5], [3, 3, 3, 5, 5])
    # utterance 1 is frames 3..4 (two frames): both windows stay inside it
    windows = corpus.windows(np.array([3, 4])).reshape(2, 5, 3)
    expected_rows = [[3, 3, 3, 4, 4], [3, 3, 4, 4, 4]]
    for window, rows in zip(windows, expected_rows, strict=True):
        np.testing.assert_array_equal(window, corpus.frames[rows])
    # into a caller's buffer
    out = np.empty((2, 15), dtype=np.float32)
    result = corpus.windows(np.array([5, 9]), out=out)
    assert result is out
    np.testing.assert_array_equal(out[0].reshape(5, 3), corpus.frames[[5, 5, 5, 6, 7]])
    np.testing.assert_array_equal(out[1].reshape(5, 3), corpus.frames[[7, 8, 9, 9, 9]])


def test_context_zero_windows_are_frames(tmp_path: Path) -> None:
    frames, labels, lengths = small_arrays()
    path = write_npz(tmp_path / "c0.npz", X=frames, y=labels, lengths=lengths)
    corpus = load_corpus(DataSpec(source=path, context=0), 3)
    idx = np.array([0, 26, 13])
    np.testing.assert_array_equal(corpus.windows(idx), corpus.frames[idx])


def test_labels_out_of_range(tmp_path: Path) -> None:
    frames, labels, lengths = small_arrays()
    path = write_npz(tmp_path / "big.npz", X=frames, y=labels + 1, lengths=lengths)
    with pytest.raises(DataError, match=r"labels run from 1 to 3.*3 outputs"):
        load_corpus(DataSpec(source=path), 3)
    negative = write_npz(tmp_path / "neg.npz", X=frames, y=labels - 1, lengths=lengths)
    with pytest.raises(DataError, match=r"labels run from -1"):
        load_corpus(DataSpec(source=negative), 3)


def test_whole_lengths_stored_as_floats_are_taken(tmp_path: Path) -> None:
    frames, labels, lengths = small_arrays()
    path = write_npz(tmp_path / "f.npz", X=frames, y=labels, lengths=lengths.astype(np.float64))
    assert open_source(DataSpec(source=path)).lengths.tolist() == lengths.tolist()


def test_lengths_not_summing_to_frames(tmp_path: Path) -> None:
    frames, labels, lengths = small_arrays()
    short = lengths.copy()
    short[-1] -= 1
    path = write_npz(tmp_path / "len.npz", X=frames, y=labels, lengths=short)
    with pytest.raises(DataError, match="lengths add up to 26, there are 27 frames"):
        open_source(DataSpec(source=path))
    with pytest.raises(DataError, match="lengths add up"):
        load_corpus(DataSpec(source=path), 3)


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"y": np.zeros(5, dtype=np.int64)}, "5 labels for 27 frames"),
        ({"lengths": np.array([3, 2, 5, 4, 7, 6, 0])}, "positive counts"),
        ({"lengths": np.array([3, 2, 5, 4, 7.5, 5.5])}, "whole numbers, got float64"),
        ({"X": np.zeros(27, dtype=np.float32)}, "2-D"),
    ],
    ids=["label-count", "zero-length", "fractional-length", "1-d"],
)
def test_bad_shapes(tmp_path: Path, change: dict[str, np.ndarray], match: str) -> None:
    frames, labels, lengths = small_arrays()
    arrays = {"X": frames, "y": labels, "lengths": lengths, **change}
    path = write_npz(tmp_path / "bad.npz", **arrays)
    with pytest.raises(DataError, match=match):
        open_source(DataSpec(source=path))


def test_missing_file_or_array(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="does not exist"):
        open_source(DataSpec(source=str(tmp_path / "absent.npz")))
    frames, labels, _ = small_arrays()
    path = write_npz(tmp_path / "nolengths.npz", X=frames, y=labels)
    with pytest.raises(DataError, match="lengths"):
        open_source(DataSpec(source=path))
    with pytest.raises(DataError):
        load_corpus(DataSpec(source=str(tmp_path / "absent.npz")), 3)
