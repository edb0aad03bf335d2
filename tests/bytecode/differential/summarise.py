"""Merge the JSON summaries of a long run's chunks into one table (markdown, on stdout).

make differential DIFFERENTIAL_EXAMPLES=2500 DIFFERENTIAL_SEED=1 DIFFERENTIAL_SUMMARY=/tmp/d1.json
...
python tests/bytecode/differential/summarise.py /tmp/d*.json
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from differential.run import Summary, merged  # noqa: E402

if __name__ == "__main__":
    parts = [Summary.from_json(Path(path).read_text()) for path in sys.argv[1:]]
    print(merged(parts).table())
