"""The host side and the guest side share tests/vm/cases.py as a top-level module
(`from cases import ...`); put its folder on the path, so that the host test also runs
on its own (`pytest tests/vm/test_guest_kernel.py`), not only when the guest folder's
conftest happens to be collected first."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
