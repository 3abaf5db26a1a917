"""Autotuning's choice and its on-disk cache (the timing itself needs a GPU: see test_kernels)."""

from __future__ import annotations

import json

import pytest

from flashtile.kernels.autotune import Autotuner, candidates, seqlen_bucket
from flashtile.kernels.configs import KernelConfig

A, B, C = KernelConfig(64, 64, 4, 2), KernelConfig(128, 64, 8, 3), KernelConfig(128, 128, 8, 3)


def fake_timer(times):
    """A timer that runs the launch and reports the time planted for its config."""
    calls = []

    def timer(run):
        cfg = run()
        calls.append(cfg)
        if times[cfg] is None:
            raise RuntimeError("out of resources")
        return times[cfg]

    return timer, calls


def test_chooses_fastest_and_skips_failing(tmp_path):
    timer, calls = fake_timer({A: 2.0, B: 1.0, C: None})
    tuner = Autotuner(tmp_path / "tune.json", timer)
    assert tuner.choose("fwd-d64", [A, B, C], lambda cfg: cfg) == B
    assert calls == [A, B, C]


def test_choice_is_cached_in_memory_and_on_disk(tmp_path):
    path = tmp_path / "sub" / "tune.json"
    timer, calls = fake_timer({A: 3.0, B: 1.0, C: 2.0})
    tuner = Autotuner(path, timer)
    assert tuner.choose("k", [A, B, C], lambda cfg: cfg) == B
    assert tuner.choose("k", [A, B, C], lambda cfg: cfg) == B
    assert len(calls) == 3, "the second call must not time anything"
    assert json.loads(path.read_text()) == {"k": [128, 64, 8, 3]}
    # A new process (a new tuner on the same file) reuses the choice without timing.
    timer2, calls2 = fake_timer({A: 0.1, B: 9.0, C: 9.0})
    assert Autotuner(path, timer2).choose("k", [A, B, C], lambda cfg: cfg) == B
    assert calls2 == []


def test_every_candidate_failing_is_an_error(tmp_path):
    timer, _ = fake_timer({A: None})
    with pytest.raises(RuntimeError, match="no candidate"):
        Autotuner(tmp_path / "t.json", timer).choose("k", [A], lambda cfg: cfg)


def test_corrupt_cache_file_is_ignored(tmp_path):
    path = tmp_path / "t.json"
    path.write_text("{not json")
    timer, _ = fake_timer({A: 1.0})
    assert Autotuner(path, timer).choose("k", [A], lambda cfg: cfg) == A


def test_candidates_and_buckets():
    base = KernelConfig(96, 96, 4, 1)
    for kind in ("fwd", "dkdv", "dq"):
        cands = candidates(kind, base)
        assert cands[0] == base and len(set(cands)) == len(cands) > 4
    assert [seqlen_bucket(n) for n in (1, 2, 3, 1000, 1024, 1025)] == [2, 2, 4, 1024, 1024, 2048]
