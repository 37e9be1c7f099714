from __future__ import annotations

import sys
from pathlib import Path

# Tests are not a package: make tests/support.py importable from every test module.
sys.path.insert(0, str(Path(__file__).parent))
