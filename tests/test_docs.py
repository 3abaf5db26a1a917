"""docs/algorithm.md reads beside reference/tiled.py by name: each name it cites must be there."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = (ROOT / "docs" / "algorithm.md").read_text()
TILED = (ROOT / "src" / "flashtile" / "reference" / "tiled.py").read_text()

# The reference column of the doc's two side-by-side tables and the sentences around them.
CITED_IN_TILED = [
    "tiled_attention_forward", "for start_m", "for start_n", "key_range", "_aligned", "_score_tile",
    "# -- update m_i and l_i", "# -- rescale the output", "# -- epilogue", "_group_heads", "m_safe", "seen",
    "# -- _bwd_preprocess", "tile_grads", "_probs_from_lse", "# -- _bwd_dkdv", "# -- _bwd_dq", "chain",
    "delta - dlse",
]


def test_every_cited_name_is_in_the_doc_and_in_tiled_py():
    for name in CITED_IN_TILED:
        assert f"`{name}" in DOC, f"docs/algorithm.md no longer cites {name!r}: update CITED_IN_TILED"
        assert name in TILED, f"docs/algorithm.md cites {name!r}, which reference/tiled.py no longer has"


def test_no_line_numbers():
    # Line numbers went stale with every edit of tiled.py; names do not.
    assert not re.search(r"\bL\d+", DOC), "docs/algorithm.md cites tiled.py by line number"


# docs/hopper.md explains the Gluon kernels by the names in their files.
HOPPER_DOC = (ROOT / "docs" / "hopper.md").read_text()
KERNEL_FILES = "".join((ROOT / "src" / "flashtile" / "kernels" / name).read_text()
                       for name in ("gluon_fwd.py", "gluon_bwd.py", "gluon_common.py", "hopper.py", "bwd.py"))
CITED_IN_KERNELS = [
    "eligible", "setting", "measured_faster", "falls_back", "_gluon", "_fwd_pingpong_kernel", "_consumer", "_loader",
    "stream_kv_tiles", "_softmax_update", "CONSUMER_REGS", "LOADER_REGS", "STATS_ROWS", "_dkdv_kernel", "_dq_kernel",
    "assert_trivial=True", "warp_specialize",
]


def test_every_name_docs_hopper_cites_is_in_the_kernels():
    for name in CITED_IN_KERNELS:
        assert name in HOPPER_DOC, f"docs/hopper.md no longer cites {name!r}: update CITED_IN_KERNELS"
        assert re.search(rf"\b{re.escape(name)}\b", KERNEL_FILES), f"docs/hopper.md cites {name!r}: not in the kernels"
