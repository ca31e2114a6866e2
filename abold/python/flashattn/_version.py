"""The package version. Its one source is include/flashattn.h: an installed package carries the value
its build read from there (flashattn/_build_version.py, written by python/build_backend.py); a source
checkout reads the header directly."""
import os
import re


def _from_header(path):
    with open(path) as f:
        text = f.read()
    parts = [re.search(rf"#define FLASHATTN_VERSION_{p} (\d+)", text).group(1) for p in ("MAJOR", "MINOR", "PATCH")]
    return ".".join(parts)


def _find():
    try:
        from ._build_version import version
        return version
    except ImportError:
        pass
    header = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "include", "flashattn.h")
    return _from_header(header)


__version__ = _find()
