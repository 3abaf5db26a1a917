"""Optional autotuning of launch configs, cached per device on disk.

Off by default: the table in :mod:`.configs` is used and a first call compiles one
kernel per shape class. With ``FLASHTILE_AUTOTUNE=1`` the first call of each shape
class (kernel, padded head dim, dtype, causal, seqlen bucket) times a few candidate
configs and keeps the fastest; the choice is written to a JSON file keyed by GPU
name and Triton version (``$FLASHTILE_CACHE_DIR`` or ``~/.cache/flashtile``), so
later processes reuse it without timing anything.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Callable, Iterable

from .configs import KernelConfig, interpreting


def enabled() -> bool:
    return os.environ.get("FLASHTILE_AUTOTUNE", "0").lower() in ("1", "true", "on", "yes") and not interpreting()


def cache_dir() -> Path:
    return Path(os.environ.get("FLASHTILE_CACHE_DIR", Path.home() / ".cache" / "flashtile"))


def seqlen_bucket(seqlen: int) -> int:
    # Configs change with the number of tiles, not with every length: bucket by powers of two.
    return min(1 << max(seqlen - 1, 1).bit_length(), 1 << 17)


class Autotuner:
    """Chooses the fastest config per key and remembers it in memory and on disk.

    ``timer(run)`` returns the time of calling ``run()``; it is ``triton.testing.do_bench``
    (median) on a GPU, and a stub in the tests.
    """

    def __init__(self, path: Path, timer: Callable[[Callable[[], object]], float]):
        self.path = path
        self.timer = timer
        self._lock = threading.Lock()
        self._table: dict[str, list[int]] = {}
        if path.exists():
            try:
                self._table = json.loads(path.read_text())
            except (OSError, ValueError):
                self._table = {}  # an unreadable cache is only a lost optimisation

    def choose(self, key: str, candidates: Iterable[KernelConfig],
               launch: Callable[[KernelConfig], object]) -> KernelConfig:
        with self._lock:
            if key in self._table:
                return KernelConfig(*self._table[key])
            best, best_time = None, float("inf")
            for cfg in candidates:
                try:
                    t = self.timer(lambda: launch(cfg))
                except Exception:  # noqa: BLE001 - out of shared memory/registers: not a candidate
                    continue
                if t < best_time:
                    best, best_time = cfg, t
            if best is None:
                raise RuntimeError(f"autotuning {key}: no candidate config could be launched")
            self._table[key] = [best.BLOCK_M, best.BLOCK_N, best.num_warps, best.num_stages]
            self._save()
            return best

    def _save(self) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps(self._table, indent=1, sort_keys=True))
            tmp.replace(self.path)  # atomic: concurrent processes never read half a file
        except OSError:
            pass  # a read-only home directory keeps the choice in memory only


_tuners: dict[str, Autotuner] = {}


def tuner_for(device) -> Autotuner:
    """The autotuner of one CUDA device; its file is named after the GPU and Triton version."""
    import torch
    import triton
    from triton.testing import do_bench

    name = torch.cuda.get_device_name(device).replace(" ", "_").replace("/", "_")
    file = cache_dir() / f"autotune-{name}-triton{triton.__version__}.json"
    key = str(file)
    if key not in _tuners:
        _tuners[key] = Autotuner(file, lambda run: do_bench(run, warmup=5, rep=20, return_mode="median"))
    return _tuners[key]


def candidates(kind: str, base: KernelConfig) -> list[KernelConfig]:
    """A small neighbourhood of the table's config: tile shapes × warps × stages."""
    shapes = {
        "fwd": [(128, 128), (128, 64), (64, 64), (64, 128)],
        "dkdv": [(64, 128), (32, 128), (64, 64)],
        "dq": [(128, 64), (64, 64), (128, 128)],
    }[kind]
    out = [base]
    for (bm, bn) in shapes:
        for warps in (4, 8):
            for stages in (2, 3):
                cfg = KernelConfig(bm, bn, warps, stages)
                if cfg not in out:
                    out.append(cfg)
    return out
