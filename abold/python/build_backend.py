"""A PEP 517 build backend for the flashattn package that needs nothing but the standard library, so
`pip install ./python` works offline (no setuptools or wheel to fetch into an isolated build).

It packs flashattn/*.py (and a libflashattn.so* copied next to them, if any) into a wheel, with
the version read from the one place it is written: include/flashattn.h (or the copy in an sdist).
"""
import base64
import hashlib
import io
import os
import re
import sysconfig
import tarfile
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
NAME = "flashattn"
SUMMARY = "ctypes bindings for libflashattn: exact FlashAttention-style attention on NVIDIA GPUs"


def _header():
    for path in (os.path.join(HERE, "flashattn.h"), os.path.join(HERE, "..", "include", "flashattn.h")):
        if os.path.exists(path):
            return path
    raise FileNotFoundError("include/flashattn.h not found next to python/ (it holds the version)")


def _version():
    with open(_header()) as f:
        text = f.read()
    return ".".join(re.search(rf"#define FLASHATTN_VERSION_{p} (\d+)", text).group(1)
                    for p in ("MAJOR", "MINOR", "PATCH"))


def _package_files():
    """(path inside the wheel, bytes) for every file of the package."""
    pkg = os.path.join(HERE, NAME)
    out = []
    for name in sorted(os.listdir(pkg)):
        full = os.path.join(pkg, name)
        if name == "_build_version.py" or not os.path.isfile(full):
            continue
        if name.endswith(".py") or name.startswith("libflashattn.so"):
            with open(full, "rb") as f:
                out.append((f"{NAME}/{name}", f.read()))
    out.append((f"{NAME}/_build_version.py",
                f'"""Written by build_backend.py from include/flashattn.h."""\nversion = "{_version()}"\n'.encode()))
    return out


def _tag(files):
    if any("libflashattn.so" in path for path, _ in files):
        return "py3-none-" + sysconfig.get_platform().replace("-", "_").replace(".", "_"), False
    return "py3-none-any", True


def _metadata():
    readme = ""
    if os.path.exists(os.path.join(HERE, "README.md")):
        with open(os.path.join(HERE, "README.md")) as f:
            readme = f.read()
    return (f"Metadata-Version: 2.1\nName: {NAME}\nVersion: {_version()}\nSummary: {SUMMARY}\n"
            f"License: BSD-3-Clause\nRequires-Python: >=3.8\nProvides-Extra: test\n"
            f"Requires-Dist: pytest; extra == \"test\"\nDescription-Content-Type: text/markdown\n\n{readme}")


def _dist_info(tag, purelib):
    d = f"{NAME}-{_version()}.dist-info"
    wheel = f"Wheel-Version: 1.0\nGenerator: flashattn build_backend\nRoot-Is-Purelib: {str(purelib).lower()}\nTag: {tag}\n"
    return d, [(f"{d}/METADATA", _metadata().encode()), (f"{d}/WHEEL", wheel.encode())]


def _write_wheel(directory, files, tag, purelib):
    d, meta = _dist_info(tag, purelib)
    files = files + meta
    name = f"{NAME}-{_version()}-{tag}.whl"
    record = []
    with zipfile.ZipFile(os.path.join(directory, name), "w", zipfile.ZIP_DEFLATED) as z:
        for path, data in files:
            z.writestr(path, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            record.append(f"{path},sha256={digest},{len(data)}")
        record.append(f"{d}/RECORD,,")
        z.writestr(f"{d}/RECORD", "\n".join(record) + "\n")
    return name


# ---- PEP 517 / 660 hooks ---------------------------------------------------------------------------

def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def get_requires_for_build_editable(config_settings=None):
    return []


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    tag, purelib = _tag(_package_files())
    d, meta = _dist_info(tag, purelib)
    os.makedirs(os.path.join(metadata_directory, d), exist_ok=True)
    for path, data in meta:
        with open(os.path.join(metadata_directory, path), "wb") as f:
            f.write(data)
    return d


prepare_metadata_for_build_editable = prepare_metadata_for_build_wheel


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    files = _package_files()
    tag, purelib = _tag(files)
    return _write_wheel(wheel_directory, files, tag, purelib)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    """A wheel holding one .pth file that puts this directory on sys.path (the version then comes from
    the header of the checkout)."""
    return _write_wheel(wheel_directory, [(f"{NAME}.pth", (HERE + "\n").encode())], "py3-none-any", True)


def build_sdist(sdist_directory, config_settings=None):
    base = f"{NAME}-{_version()}"
    name = f"{base}.tar.gz"
    with tarfile.open(os.path.join(sdist_directory, name), "w:gz") as tar:
        for rel in ("pyproject.toml", "build_backend.py", "README.md"):
            tar.add(os.path.join(HERE, rel), f"{base}/{rel}")
        tar.add(_header(), f"{base}/flashattn.h")
        for path, data in _package_files():
            if path.endswith("_build_version.py"):
                continue
            info = tarfile.TarInfo(f"{base}/{path}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        meta = _metadata().encode()
        info = tarfile.TarInfo(f"{base}/PKG-INFO")
        info.size = len(meta)
        tar.addfile(info, io.BytesIO(meta))
    return name
