"""Data formats: pfiles (round trip and hand-made bytes), Kaldi ark/scp, .npy directories,
norm files, and the clear errors for data that does not fit the network."""

from __future__ import annotations

import itertools
import struct
from pathlib import Path

import numpy as np
import pytest

from snet.data.corpus import SourceStore, load_corpus
from snet.data.kaldi import write_kaldi
from snet.data.norms import Norms, compute_norms, read_norm_file, write_norm_file
from snet.data.pfile import HEADER_BYTES, PFile, write_pfile
from snet.data.sources import check_against_network, open_source
from snet.protocol.errors import DataError
from snet.protocol.job import DataSpec


def small_corpus() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Five utterances (3, 1, 4, 2, 5 frames) of 3 float features, labels 0..3."""
    rng = np.random.default_rng(3)
    lengths = np.array([3, 1, 4, 2, 5])
    frames = rng.standard_normal((15, 3)).astype(np.float32) * 7 + 2
    labels = rng.integers(0, 4, size=15)
    return frames, labels, lengths


# ---------------------------------------------------------------- pfiles


def test_pfile_round_trip_is_identical(tmp_path: Path) -> None:
    frames, labels, lengths = small_corpus()
    path = tmp_path / "small.pfile"
    write_pfile(path, frames, labels, lengths)
    assert path.stat().st_size == HEADER_BYTES + 15 * (2 + 3 + 1) * 4 + 6 * 4
    source = open_source(DataSpec(source=str(path)))
    np.testing.assert_array_equal(source.read(np.arange(15)), frames)  # bit for bit
    np.testing.assert_array_equal(source.labels, labels)
    np.testing.assert_array_equal(source.lengths, lengths)
    assert source.features == 3
    # rows in any order, read without loading the rest
    np.testing.assert_array_equal(source.read(np.array([14, 0, 7])), frames[[14, 0, 7]])
    # and written again from what was read: the same bytes
    again = tmp_path / "again.pfile"
    write_pfile(again, source.read(np.arange(15)), source.labels, source.lengths)
    assert again.read_bytes() == path.read_bytes()


def _hand_made_pfile(path: Path, with_table: bool) -> None:
    """Two sentences (2 frames, 1 frame), 2 features, 1 label, built byte by byte."""
    records = [(0, 0, 1.5, -2.0, 7), (0, 1, 0.25, 3.0, 1), (1, 0, -1.0, 8.5, 4)]
    lines = [
        "-pfile_header version 0 size 32768",
        "-num_sentences 2",
        "-num_frames 3",
        "-first_feature_column 2",
        "-num_features 2",
        "-first_label_column 4",
        "-num_labels 1",
        "-format 2d2f1d",  # repeat counts, as some tools write it
        "-data size 15 offset 0 ndim 2 nrow 3 ncol 5",
    ]
    if with_table:
        lines.append("-sent_table_data size 3 offset 15 ndim 1")
    header = ("\n".join([*lines, "-end"]) + "\n").encode("ascii")
    body = b"".join(struct.pack(">iiffi", *record) for record in records)
    table = struct.pack(">iii", 0, 2, 3) if with_table else b""
    path.write_bytes(header + b"\0" * (32768 - len(header)) + body + table)


@pytest.mark.parametrize("with_table", [True, False], ids=["sentence-table", "no-table"])
def test_pfile_from_hand_computed_bytes(tmp_path: Path, with_table: bool) -> None:
    path = tmp_path / "hand.pfile"
    _hand_made_pfile(path, with_table)
    pfile = PFile(path)
    assert (pfile.sentences, pfile.frames, pfile.features, pfile.labels_per_frame) == (2, 3, 2, 1)
    np.testing.assert_array_equal(pfile.lengths(), [2, 1])
    np.testing.assert_array_equal(
        pfile.feature_rows(np.arange(3)), [[1.5, -2.0], [0.25, 3.0], [-1.0, 8.5]]
    )
    np.testing.assert_array_equal(pfile.label_column(), [7, 1, 4])


def test_pfile_written_matches_the_documented_layout(tmp_path: Path) -> None:
    path = tmp_path / "w.pfile"
    write_pfile(path, np.array([[1.5, -2.0], [0.25, 3.0], [-1.0, 8.5]]), [7, 1, 4], [2, 1])
    raw = path.read_bytes()
    header = raw[:HEADER_BYTES].rstrip(b"\0").decode("ascii").splitlines()
    assert header[0] == "-pfile_header version 0 size 32768"
    assert "-format ddffd" in header and "-num_frames 3" in header
    assert "-sent_table_data size 3 offset 15 ndim 1" in header and header[-1] == "-end"
    assert raw[HEADER_BYTES : HEADER_BYTES + 20] == struct.pack(">iiffi", 0, 0, 1.5, -2.0, 7)
    assert raw[-12:] == struct.pack(">iii", 0, 2, 3)


@pytest.mark.parametrize(
    ("damage", "match"),
    [
        (lambda b: b.replace(b"version 0", b"version 9"), "not a pfile"),
        (lambda b: b.replace(b"-format 2d2f1d", b"-format 2d3f"), "does not match"),
        (lambda b: b.replace(b"nrow 3", b"nrow 4"), "inconsistent -data"),
        (lambda b: b[:-8], "promises"),
        (lambda b: b[:100], "too short"),
    ],
    ids=["version", "format", "rows", "truncated", "no-header"],
)
def test_damaged_pfile_fails_clearly(tmp_path: Path, damage: object, match: str) -> None:
    path = tmp_path / "hand.pfile"
    _hand_made_pfile(path, with_table=True)
    path.write_bytes(damage(path.read_bytes()))  # type: ignore[operator]
    with pytest.raises(DataError, match=match):
        open_source(DataSpec(source=str(path)))


# ---------------------------------------------------------------- Kaldi


def test_kaldi_ark_scp_round_trip(tmp_path: Path) -> None:
    frames, labels, lengths = small_corpus()
    ark, scp, ali = (str(tmp_path / n) for n in ("feats.ark", "feats.scp", "ali.ark"))
    write_kaldi(ark, scp, ali, frames, labels, lengths)
    for features in (scp, ark):
        source = open_source(DataSpec(source=features, labels=ali))
        np.testing.assert_array_equal(source.lengths, lengths)
        np.testing.assert_array_equal(source.labels, labels)
        np.testing.assert_array_equal(source.read(np.arange(15)), frames)
        np.testing.assert_array_equal(source.read(np.array([9, 3, 0])), frames[[9, 3, 0]])
    # text alignments (ali-to-pdf | copy-int-vector ark:- ark,t:-) work the same
    text = tmp_path / "ali.txt"
    starts = np.concatenate([[0], np.cumsum(lengths)])
    text.write_text(
        "".join(
            f"utt{i:06d} " + " ".join(map(str, labels[a:b])) + "\n"
            for i, (a, b) in enumerate(itertools.pairwise(starts))
        )
    )
    source = open_source(DataSpec(source=scp, labels=str(text)))
    np.testing.assert_array_equal(source.labels, labels)


def test_kaldi_needs_matching_alignments(tmp_path: Path) -> None:
    frames, labels, lengths = small_corpus()
    ark, scp, ali = (str(tmp_path / n) for n in ("feats.ark", "feats.scp", "ali.ark"))
    write_kaldi(ark, scp, ali, frames, labels, lengths)
    with pytest.raises(DataError, match=r"need per-frame labels: give --labels \(labels in"):
        open_source(DataSpec(source=scp))
    # a test or CV file's labels are its own setting's (it named --labels, given already)
    unlabelled = DataSpec(source=scp)  # as part("test") or part("cv") makes it
    with pytest.raises(DataError, match=r"give --test-labels \(test_labels in \[job.data\]\)"):
        open_source(unlabelled, "test")
    with pytest.raises(DataError, match=r"give --cv-labels \(cv_labels in \[job.data\]\)"):
        open_source(unlabelled, "cv")
    short = tmp_path / "short.txt"
    short.write_text("utt000000 1 2\n")
    with pytest.raises(DataError, match="no alignment for 4 utterance"):
        open_source(DataSpec(source=scp, labels=str(short)))
    wrong = tmp_path / "wrong.txt"
    wrong.write_text("".join(f"utt{i:06d} 1 2\n" for i in range(5)))
    with pytest.raises(DataError, match="'utt000000' has 3 frames, its alignment 2 labels"):
        open_source(DataSpec(source=scp, labels=str(wrong)))


def test_alignments_given_for_data_that_holds_its_own_labels_are_refused(tmp_path: Path) -> None:
    """--labels beside a pfile, an .npz or a directory of .npy files was read by nobody:
    the file's own labels trained, without a word."""
    frames, labels, lengths = small_corpus()
    ark, scp, ali = (str(tmp_path / n) for n in ("feats.ark", "feats.scp", "ali.ark"))
    write_kaldi(ark, scp, ali, frames, labels, lengths)
    pfile, npz, folder = tmp_path / "small.pfile", tmp_path / "small.npz", tmp_path / "npy"
    write_pfile(pfile, frames, labels, lengths)
    np.savez(npz, X=frames, y=labels, lengths=lengths)
    folder.mkdir()
    for name, array in (("features", frames), ("labels", labels), ("lengths", lengths)):
        np.save(folder / f"{name}.npy", array)
    for data in (pfile, npz, folder):
        with pytest.raises(DataError) as refused:
            open_source(DataSpec(source=str(data), labels=ali))
        assert str(refused.value) == (
            f"alignments {ali} given for {data}, which is not Kaldi features (.scp/.ark) "
            "and holds its own labels: leave them out"
        )
    # the CV and test files' own alignments are checked alike
    with pytest.raises(DataError, match="holds its own labels"):
        open_source(DataSpec(source=scp, labels=ali, cv_source=str(npz), cv_labels=ali).part("cv"))


def test_data_without_lengths_wants_context_0(tmp_path: Path) -> None:
    """Without lengths every frame is its own utterance: a window of 4 frames either side
    was the one frame nine times (13 x 9 = the default network's 117 inputs), trained
    without a word. Refused, saying what to do; with --context 0 it is what it says."""
    frames, labels, _ = small_corpus()
    npz, folder, pfile = tmp_path / "nolen.npz", tmp_path / "nolen", tmp_path / "ones.pfile"
    np.savez(npz, X=frames, y=labels)
    folder.mkdir()
    np.save(folder / "features.npy", frames)
    np.save(folder / "labels.npy", labels)
    write_pfile(pfile, frames, labels, np.ones(15, dtype=np.int64))  # as convert writes it
    for data in (npz, folder, pfile):
        with pytest.raises(DataError) as refused:
            open_source(DataSpec(source=str(data)))
        assert str(refused.value) == (
            f"{data} has no sequences (no lengths, or every utterance one frame long), so a "
            "window of 4 frames either side has no neighbours to take: give its utterances' "
            "lengths, or --context 0 (context = 0 in [job.data]) for data without sequences"
        )
        source = open_source(DataSpec(source=str(data), context=0))
        np.testing.assert_array_equal(source.lengths, np.ones(15))


# ---------------------------------------------------------------- .npy directories, norms


def test_npy_directory_is_memory_mapped_and_read_on_demand(tmp_path: Path) -> None:
    frames, labels, lengths = small_corpus()
    np.save(tmp_path / "features.npy", frames)
    np.save(tmp_path / "labels.npy", labels)
    np.save(tmp_path / "lengths.npy", lengths)
    spec = DataSpec(source=str(tmp_path), context=1, cv_fraction=0.4)
    source = open_source(spec)
    np.testing.assert_array_equal(source.read(np.array([4, 2])), frames[[4, 2]])
    norms = compute_norms(source, np.arange(15))
    lazy = SourceStore(source, norms)  # what a corpus larger than memory uses
    dense = load_corpus(spec, outputs=4)
    rows = np.array([[0, 0, 1], [5, 6, 6]])
    np.testing.assert_allclose(
        lazy.take(rows), (frames[rows] - frames.mean(0)) / frames.std(0), rtol=1e-5, atol=1e-5
    )
    assert dense.windows(np.array([3])).shape == (1, 9)


def test_norm_file_round_trip_in_quicknet_format(tmp_path: Path) -> None:
    norms = Norms(np.array([1.5, -2.25, 1e-3]), np.array([0.5, 4.0, 1.0]))
    path = tmp_path / "norms"
    write_norm_file(path, norms)
    lines = path.read_text().split()
    assert lines[:2] == ["vec", "3"] and lines[5:7] == ["vec", "3"]
    assert float(lines[6 + 2]) == pytest.approx(0.25)  # reciprocal standard deviations
    back = read_norm_file(path, 3)
    np.testing.assert_allclose(back.mean, norms.mean)
    np.testing.assert_allclose(back.std, norms.std)
    with pytest.raises(DataError, match="normalises 3 features, the data has 4"):
        read_norm_file(path, 4)
    (tmp_path / "bad").write_text("vec 3\n1\n2\n")
    with pytest.raises(DataError, match="not a Quicknet norm file"):
        read_norm_file(tmp_path / "bad", 3)
    for means, scales in (("0 0 nan", "1 1 1"), ("0 0 0", "1 inf 1"), ("-inf 0 0", "1 1 1")):
        (tmp_path / "odd").write_text(f"vec 3\n{means}\nvec 3\n{scales}\n")
        with pytest.raises(DataError, match="must be finite numbers"):  # trained to 0 %
            read_norm_file(tmp_path / "odd", 3)
    (tmp_path / "zero").write_text("vec 3\n0 0 0\nvec 3\n1 0 1\n")
    with pytest.raises(DataError, match="must be positive"):
        read_norm_file(tmp_path / "zero", 3)


def test_job_norm_file_is_used_instead_of_the_statistics(tmp_path: Path) -> None:
    frames, labels, lengths = small_corpus()
    np.savez(tmp_path / "d.npz", X=frames, y=labels, lengths=lengths)
    write_norm_file(tmp_path / "norms", Norms(np.zeros(3), np.full(3, 2.0)))
    spec = DataSpec(source=str(tmp_path / "d.npz"), norm_file=str(tmp_path / "norms"))
    corpus = load_corpus(spec, outputs=4)
    np.testing.assert_allclose(corpus.frames, frames / 2.0, rtol=1e-6)


# ---------------------------------------------------------------- data against the network


def test_wrong_dimension_or_label_fails_with_a_clear_message(tmp_path: Path) -> None:
    frames, labels, lengths = small_corpus()
    np.savez(tmp_path / "d.npz", X=frames, y=labels, lengths=lengths)
    source = open_source(DataSpec(source=str(tmp_path / "d.npz")))
    with pytest.raises(
        DataError,
        match=r"3 features per frame; with a window of 9 frames a "
        r"pattern has 27 inputs, but the network has 117",
    ):
        check_against_network(source, 9, 117, 4)
    with pytest.raises(
        DataError,
        match=r"labels run from 0 to 3 \(frame \d+ has label 3\), "
        r"but the network has 3 outputs \(labels 0..2\)",
    ):
        check_against_network(source, 9, 27, 3)
    check_against_network(source, 9, 27, 4)  # fits


def test_a_test_file_may_lack_classes_that_training_data_must_have(tmp_path: Path) -> None:
    frames, labels, lengths = small_corpus()
    np.savez(tmp_path / "d.npz", X=frames, y=labels, lengths=lengths)
    source = open_source(DataSpec(source=str(tmp_path / "d.npz")))
    with pytest.raises(DataError, match=r"has 4 classes .* end the network with :4"):
        check_against_network(source, 9, 27, 6)
    check_against_network(source, 9, 27, 6, every_class=False)  # a test file: scored
