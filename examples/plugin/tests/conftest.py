"""Let the tests import the plugin from a source checkout too (``pip install -e .`` is not required)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
