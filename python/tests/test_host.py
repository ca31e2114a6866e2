"""Host-only tests of the Python package: loading, version check, ABI layout, errors, and behaviour
without a GPU. They need libflashattn.so (FLASHATTN_LIBRARY) but no GPU."""
import ctypes
import importlib
import os

import pytest

import flashattn
from flashattn import _lib


def has_gpu():
    try:
        flashattn.Handle(0).close()
        return True
    except flashattn.FlashAttnError as e:
        assert e.name == "FLASHATTN_STATUS_NO_DEVICE"
        return False


def test_library_loads_and_versions_match():
    lib = flashattn.load_library()
    assert flashattn.library_version() == flashattn.__version__
    assert lib.flashattn_version() == 100


def test_struct_layouts_match_the_c_header():
    assert ctypes.sizeof(flashattn.FwdParams) == 248
    assert flashattn.FwdParams.alibi_batch_stride.offset == 240
    assert flashattn.FwdParams.softmax_scale.offset == 208
    assert ctypes.sizeof(flashattn.PlanInfo) == 320
    assert flashattn.PlanInfo.description.offset == 128


def test_params_defaults_come_from_the_library():
    p = flashattn.FwdParams.new()
    assert p.struct_size == 248
    assert (p.window_left, p.window_right) == (-1, -1)
    assert p.backend == flashattn.Backend.AUTO


def test_status_constants_match_library_names():
    lib = flashattn.load_library()
    for name, value in vars(flashattn.Status).items():
        if name.isupper():
            assert lib.flashattn_status_name(value).decode() == "FLASHATTN_STATUS_" + name


def test_handle_without_gpu_raises_no_device():
    if has_gpu():
        pytest.skip("a GPU is present: NO_DEVICE cannot be provoked")
    with pytest.raises(flashattn.FlashAttnError) as e:
        flashattn.Handle(0)
    assert e.value.name == "FLASHATTN_STATUS_NO_DEVICE"
    assert e.value.status == flashattn.Status.NO_DEVICE
    assert "device" in str(e.value)


def test_handle_with_bad_ordinal_raises():
    with pytest.raises(flashattn.FlashAttnError) as e:
        flashattn.Handle(4096)
    assert e.value.name == "FLASHATTN_STATUS_NO_DEVICE"


def test_dropout_is_refused_by_name():
    with pytest.raises(ValueError, match="dropout_p"):
        flashattn.flash_attn_func(None, None, None, dropout_p=0.1)


def test_non_cuda_inputs_are_refused():
    with pytest.raises(TypeError, match="q: list is not a CUDA array"):
        flashattn.flash_attn_func([1.0], [1.0], [1.0])


def test_version_mismatch_is_refused(monkeypatch):
    monkeypatch.setattr(_lib, "EXPECTED_VERSION", (9, 9, 0))
    with pytest.raises(ImportError, match="version 0.1.0; this package needs 9.9.0"):
        _lib.load_library(os.environ.get("FLASHATTN_LIBRARY") or "libflashattn.so.0")


def test_missing_library_says_where_it_looked(monkeypatch):
    monkeypatch.setenv("FLASHATTN_LIBRARY", "/nonexistent/libflashattn.so")
    monkeypatch.setattr(_lib, "_LIB", None)
    with pytest.raises(OSError, match="/nonexistent/libflashattn.so"):
        _lib.load_library()
