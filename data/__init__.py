"""Training data on disk: the formats speech researchers use, read lazily.

Shared by the server (which leases frames, normalises, and sends frames inline to workers
that cannot read the data) and the workers (which cut context windows). Neither imports
the other; both import this package and ``snet.protocol``.

- ``sources``: one ``FrameSource`` per format (numpy .npz or memory-mapped .npy files,
  Quicknet pfiles, Kaldi feats.scp/.ark with alignments), opened without reading the
  features; ``open_source`` picks the format.
- ``archive``: opening a user's ``.npz`` (weights or data) without ever unpickling it,
  with one line for a file that is not an archive.
- ``pfile``: reading and writing ICSI Quicknet pfiles.
- ``kaldi``: Kaldi features and alignments through ``kaldiio``.
- ``norms``: mean and standard deviation over the training frames, and Quicknet norm files.
- ``windows``: utterance bounds and context windows.
- ``joined``: the job's training file and its separate CV file as one row space, and the
  train/CV split.
- ``cache``: normalised frames written once per machine and memory-mapped read-only by
  every worker on it.
- ``corpus``: the frames a process trains on (all in memory, read on demand, or received
  from the server), normalised, with labels and the train/CV split.
"""
