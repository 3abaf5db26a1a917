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
