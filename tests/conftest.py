import sys
from pathlib import Path

# The shared test helpers (tests/jobs.py) import as a plain module.
sys.path.insert(0, str(Path(__file__).resolve().parent))
