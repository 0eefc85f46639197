"""The diagnosis tests import their shared fakes from ``evidence_fakes`` (beside this file): this folder on sys.path."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
