"""Replay a torch memory snapshot's trace through kvlab's allocator model (``kvlab replay``).

One-way flow, each module importing only those before it (and :mod:`kvlab.device.snapshot`, which reads the file):

- :mod:`~kvlab.device.replay.settings`: the recorded ``allocator_settings``, ``--what-if`` and sizes;
- :mod:`~kvlab.device.replay.seed`: the allocator's state at the trace's first event, from ``segments``;
- :mod:`~kvlab.device.replay.report`: :class:`ReplayResult` (the checks, the first divergence, JSON and text);
- :mod:`~kvlab.device.replay.engine`: how each recorded event drives the model;
- :mod:`~kvlab.device.replay.fidelity`: :func:`replay_snapshot` and :func:`state_at`;
- :mod:`~kvlab.device.replay.whatif`: the recorded stream under other settings, :func:`replay_with_what_ifs`;
- :mod:`~kvlab.device.replay.gen`: generated snapshots with their truth (tests and benchmarks).

This ``__init__`` imports nothing: :mod:`kvlab.device.snapshot` calls into ``seed`` and ``settings`` inside a
function, and importing those must not pull in the modules that import the snapshot reader.
"""
