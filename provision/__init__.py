"""hotcache's host side: the CLI and everything it drives (spec, plan, apply, mapping).

Kept import-light on purpose: `hotcache --help` and `hotcache status` must start fast.
"""

__version__ = "0.1.0"
