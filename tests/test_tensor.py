"""Round trips of raw tensors between torch / NumPy and the engine.

    pytest tests/test_tensor.py -k test_conversion_cpu    # the CPU round trips only

Every case checks values, dtype, shape, strides and whether memory is shared,
against torch and NumPy themselves.
"""
import ctypes
import gc
import os
import sys
import zlib

import numpy as np
import pytest
import torch

import aidge_interop
from aidge_interop import Tensor, _C
from aidge_interop.tensor_converter import aidge_tensor_to_torch, torch_tensor_to_aidge

DTYPES = [
    torch.float32, torch.float64, torch.float16, torch.int8, torch.uint8,
    torch.int16, torch.int32, torch.int64, torch.bool,
]


def _random(shape, dtype, gen):
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=gen).bool()
    if dtype.is_floating_point:
        return torch.randn(shape, generator=gen, dtype=torch.float64).to(dtype)
    info = torch.iinfo(dtype)
    return torch.randint(info.min, info.max, shape, generator=gen, dtype=torch.int64).to(dtype)


# each layout: a function making a tensor of that layout from a generator
LAYOUTS = {
    "scalar": lambda d, g: _random((), d, g),
    "empty": lambda d, g: _random((0, 3), d, g),
    "empty_middle": lambda d, g: _random((2, 0, 4), d, g),
    "1d": lambda d, g: _random((7,), d, g),
    "4d": lambda d, g: _random((2, 3, 4, 5), d, g),
    "large": lambda d, g: _random((1024, 1031), d, g),
    "transposed": lambda d, g: _random((6, 5), d, g).t(),
    "sliced": lambda d, g: _random((8, 9, 4), d, g)[1::2, ::3, 1:],
    "channels_last": lambda d, g: _random((2, 3, 4, 5), d, g).to(memory_format=torch.channels_last),
}


def _name(dtype):
    return str(dtype).removeprefix("torch.")


def _values_equal(a, b):
    """Bitwise equality of two torch tensors (NaN-safe)."""
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(a.cpu(), b.cpu())


def _poke(t):
    """Changes one element of t in place (to prove aliasing); returns the index."""
    idx = (0,) * t.dim()
    if t.dtype == torch.bool:
        t[idx] = not bool(t[idx])
    else:
        t[idx] = t[idx] + 1 if t.dtype.is_floating_point else t[idx] ^ 1
    return idx


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("dtype", DTYPES, ids=_name)
def test_conversion_cpu(dtype, layout):
    gen = torch.Generator().manual_seed(zlib.crc32(f"{dtype}/{layout}".encode()))
    t = LAYOUTS[layout](dtype, gen)
    expected = t.clone()

    a = torch_tensor_to_aidge(t)
    assert a.dtype == _name(dtype)
    assert a.shape == tuple(t.shape)
    assert a.strides == t.stride()
    assert a.ndim == t.dim() and a.numel == t.numel()
    np.testing.assert_array_equal(a.numpy(), expected.numpy())
    if t.numel():
        assert a.data_ptr == t.data_ptr(), "a CPU tensor must be viewed, not copied"

    back = aidge_tensor_to_torch(a)
    assert back.dtype == dtype and back.device.type == "cpu"
    assert _values_equal(back, expected)
    assert back.stride() == t.stride()
    if t.numel():
        assert back.data_ptr() == t.data_ptr()
        # one memory for all three: a write through torch shows everywhere
        idx = _poke(t)
        assert back[idx] == t[idx]
        assert a.numpy()[idx] == t.numpy()[idx]

    copied = torch_tensor_to_aidge(t, copy=True)
    copied_back = aidge_tensor_to_torch(copied, copy=True)
    assert _values_equal(copied_back, t)
    if t.numel():
        assert copied.data_ptr != t.data_ptr()
        assert copied_back.data_ptr() not in (t.data_ptr(), copied.data_ptr)
        before = copied_back.clone()
        _poke(t)
        assert _values_equal(copied_back, before)


@pytest.mark.parametrize("dtype", DTYPES, ids=_name)
def test_conversion_cpu_numpy_negative_strides(dtype):
    base = _random((6, 8), dtype, torch.Generator().manual_seed(1)).numpy()
    view = base[::-1, 1::3]
    a = torch_tensor_to_aidge(view)
    assert a.shape == view.shape
    assert a.strides == tuple(s // view.itemsize for s in view.strides)
    assert a.strides[0] < 0
    # a strided view of the NumPy memory, not a copy
    assert a.data_ptr == view.__array_interface__["data"][0]
    np.testing.assert_array_equal(a.numpy(), view)
    # torch has no negative strides: the return trip is a contiguous copy
    back = aidge_tensor_to_torch(a)
    assert back.is_contiguous()
    np.testing.assert_array_equal(back.numpy(), view)


def test_conversion_cpu_numpy_interfaces():
    arr = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    a = Tensor(arr)
    assert a.data_ptr == arr.ctypes.data
    via_interface = np.asarray(a)
    via_buffer = np.frombuffer(memoryview(a), dtype=np.float32).reshape(2, 3, 4)
    via_dlpack = np.from_dlpack(a)
    for v in (via_interface, via_buffer, via_dlpack):
        assert v.ctypes.data == arr.ctypes.data
        np.testing.assert_array_equal(v, arr)
    t = a.numpy()[:, 1:, ::2]  # a strided engine tensor
    s = Tensor(t)
    assert not s.is_contiguous()
    np.testing.assert_array_equal(np.asarray(s), t)
    assert memoryview(s).tolist() == t.tolist()
    with pytest.raises(BufferError, match="not C-contiguous"):
        np.frombuffer(s, dtype=np.float32)  # asks for a flat buffer


def test_conversion_cpu_keeps_memory_alive():
    t = torch.arange(1000, dtype=torch.float64)
    a = torch_tensor_to_aidge(t)
    del t
    gc.collect()
    assert a.numpy()[999] == 999.0
    arr = np.arange(10, dtype=np.int16)
    b = Tensor(arr)
    del arr
    gc.collect()
    assert b.numpy().tolist() == list(range(10))
    back = aidge_tensor_to_torch(b)
    del b
    gc.collect()
    assert back.tolist() == list(range(10))


def test_conversion_cpu_requires_grad_is_detached():
    w = torch.randn(3, 4, requires_grad=True)
    a = torch_tensor_to_aidge(w)
    back = aidge_tensor_to_torch(a)
    assert not back.requires_grad
    assert back.data_ptr() == w.data_ptr()
    assert torch.equal(back, w.detach())


def test_conversion_cpu_readonly_numpy_is_copied_for_torch():
    arr = np.arange(6.0)
    arr.flags.writeable = False
    a = Tensor(arr)
    assert a.readonly
    with pytest.raises(TypeError, match="not writable"):
        (ctypes.c_char * a.nbytes).from_buffer(a)  # asks for a writable buffer
    assert memoryview(a).readonly
    back = aidge_tensor_to_torch(a)
    back[0] = 42.0  # torch tensors are writable: it must be a copy
    assert arr[0] == 0.0


def test_conversion_cpu_float16_matches_numpy():
    rng = np.random.default_rng(0)
    x = np.concatenate([
        rng.standard_normal(10000).astype(np.float32) * 10.0 ** rng.integers(-9, 6, 10000),
        np.array([0.0, -0.0, 65504, 65519, 65520, 1e-8, 6e-8, np.inf, -np.inf], np.float32),
    ])
    ours = Tensor(x).astype("float16").numpy()
    with np.errstate(over="ignore"):
        ref = x.astype(np.float16)
    np.testing.assert_array_equal(ours.view(np.uint16), ref.view(np.uint16))
    np.testing.assert_array_equal(Tensor(ref).astype("float32").numpy(), ref.astype(np.float32))


def test_repr_and_numpy():
    a = Tensor(np.arange(10, dtype=np.int32).reshape(2, 5))
    r = repr(a)
    assert r.startswith("Tensor(dtype=int32, shape=(2, 5)")
    assert "0, 1, 2, 3, 4, 5, ..." in r
    assert "values=[1.5]" in repr(Tensor(np.float64(1.5)))
    assert "True" in repr(Tensor(np.array([True])))
    assert "strided" in repr(Tensor(np.ones((3, 3))[:, ::2]))
    assert len(a) == 2
    with pytest.raises(TypeError, match="0-d"):
        len(Tensor(np.float32(1)))


def test_zeros():
    z = aidge_interop.zeros((3, 0, 2), "int64")
    assert z.shape == (3, 0, 2) and z.dtype == "int64"
    z = aidge_interop.zeros([4], np.float16)
    assert z.numpy().tolist() == [0.0] * 4
    with pytest.raises(ValueError, match="negative"):
        aidge_interop.zeros((2, -1))
    with pytest.raises(MemoryError):
        aidge_interop.zeros((2**40, 2**40))


# ---------------------------------------------------------------- bad input

@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128], ids=str)
def test_bad_input_unsupported_torch_dtype(dtype):
    t = torch.zeros(3).to(dtype)
    with pytest.raises(TypeError, match=str(dtype).removeprefix("torch.")):
        torch_tensor_to_aidge(t)


@pytest.mark.parametrize("dtype", ["complex128", "U3", "object", "datetime64[s]", "float128"])
def test_bad_input_unsupported_numpy_dtype(dtype):
    try:
        arr = np.zeros(3, dtype=dtype)
    except TypeError:
        pytest.skip(f"NumPy has no {dtype} here")
    with pytest.raises(TypeError, match="unsupported dtype"):
        torch_tensor_to_aidge(arr)


@pytest.mark.parametrize("obj", [object(), "abc", {"a": 1}, None], ids=lambda o: type(o).__name__)
def test_bad_input_not_a_tensor(obj):
    with pytest.raises(TypeError, match="argument 'torch_tensor'"):
        torch_tensor_to_aidge(obj)
    with pytest.raises(TypeError, match="argument 'aidge_tensor'"):
        aidge_tensor_to_torch(obj)


@pytest.mark.parametrize("copy", [None, True])
def test_conversion_cpu_overlapping_is_copied(copy):
    # expand / broadcast_to address an element more than once: no engine view
    # can hold them, so the converter copies (copy=None) as copy=True does
    src = torch.arange(3.0).reshape(3, 1)
    t = src.expand(3, 4)
    expected = t.clone()
    a = torch_tensor_to_aidge(t, copy=copy)
    assert a.is_contiguous() and a.strides == (4, 1)
    assert torch.equal(aidge_tensor_to_torch(a), expected)
    arr = np.broadcast_to(np.arange(4.0), (5, 4))
    b = torch_tensor_to_aidge(arr, copy=copy)
    assert b.is_contiguous()
    np.testing.assert_array_equal(b.numpy(), arr)
    src.add_(1)  # a copy: independent of the source
    np.testing.assert_array_equal(a.numpy(), expected.numpy())


def test_bad_input_view_demanded():
    # copy=False demands a view and says why there can be none
    t = torch.arange(3.0).reshape(3, 1).expand(3, 4)
    with pytest.raises(ValueError, match="argument 'torch_tensor'.*more than once"):
        torch_tensor_to_aidge(t, copy=False)
    arr = np.broadcast_to(np.arange(4.0), (5, 4))
    with pytest.raises(ValueError, match="more than once"):
        torch_tensor_to_aidge(arr, copy=False)
    with pytest.raises(ValueError, match="more than once"):
        Tensor(arr)  # the engine's own constructor views or copies as told (copy=False)
    with pytest.raises(ValueError, match="argument 'torch_tensor' is on meta"):
        torch_tensor_to_aidge(torch.empty(2, device="meta"), copy=False)
    readonly = np.arange(6.0)
    readonly.flags.writeable = False
    with pytest.raises(ValueError, match="argument 'aidge_tensor'.*read-only"):
        aidge_tensor_to_torch(Tensor(readonly), copy=False)
    reversed_ = Tensor(np.arange(6.0)[::-1])
    with pytest.raises(ValueError, match="argument 'aidge_tensor'.*negative strides"):
        aidge_tensor_to_torch(reversed_, copy=False)
    with pytest.raises(ValueError, match="argument 'aidge_tensor'.*goes to cuda"):
        aidge_tensor_to_torch(Tensor(np.arange(6.0)), device="cuda", copy=False)
    # where a view exists, copy=False gives it
    x = torch.randn(4, 5).t()
    a = torch_tensor_to_aidge(x, copy=False)
    assert a.data_ptr == x.data_ptr() and a.strides == x.stride()
    assert aidge_tensor_to_torch(a, copy=False).data_ptr() == x.data_ptr()


def test_bad_input_rank_too_high():
    arr = np.zeros((1,) * (aidge_interop.MAX_DIMS + 1))
    with pytest.raises(ValueError, match="rank"):
        Tensor(arr)


def test_bad_input_bad_dlpack_requests():
    a = Tensor(np.ones(3))
    with pytest.raises(ValueError, match="stream"):
        a.__dlpack__(stream=5)
    with pytest.raises(BufferError):
        a.__dlpack__(dl_device=(2, 0))
    with pytest.raises(TypeError, match="no __dlpack__"):
        Tensor.from_dlpack([1, 2])
    cap = torch.ones(2).__dlpack__()
    Tensor.from_dlpack(cap)
    with pytest.raises(TypeError, match="consumed"):
        Tensor.from_dlpack(cap)  # a capsule is consumed once


# ---------------------------------------------------------------- GPU

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA is not available")


@cuda
@pytest.mark.cuda
@pytest.mark.parametrize("layout", ["scalar", "empty", "4d", "transposed", "channels_last"])
@pytest.mark.parametrize("dtype", DTYPES, ids=_name)
def test_conversion_gpu(dtype, layout):
    t = LAYOUTS[layout](dtype, torch.Generator().manual_seed(0)).cuda()
    a = torch_tensor_to_aidge(t)
    assert a.origin_device == str(t.device)
    assert a.shape == tuple(t.shape) and a.dtype == _name(dtype)
    np.testing.assert_array_equal(a.numpy(), t.cpu().numpy())
    back = aidge_tensor_to_torch(a)
    assert back.device == t.device  # back to where it came from
    assert _values_equal(back, t)
    assert aidge_tensor_to_torch(a, device="cpu").device.type == "cpu"
    cpu_side = torch_tensor_to_aidge(t.cpu())
    assert aidge_tensor_to_torch(cpu_side, device=t.device).device == t.device


# ---------------------------------------------------------------- leaks

LEAK_CHECK = r"""
import gc, os, sys
import numpy as np, torch
from aidge_interop import _C
from aidge_interop.tensor_converter import aidge_tensor_to_torch, torch_tensor_to_aidge

def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

t = torch.randn(4, 8)
arr = np.arange(32, dtype=np.int32).reshape(4, 8)[::-1]

def cycle(n):
    for _ in range(n):
        back = aidge_tensor_to_torch(torch_tensor_to_aidge(t))
        np.asarray(torch_tensor_to_aidge(arr))
        assert back.data_ptr() == t.data_ptr()

cycle(2000)
gc.collect()
rss0, objs0, refs0, live0 = rss(), len(gc.get_objects()), sys.getrefcount(t), _C._debug_counters()
cycle(100_000)
gc.collect()
print(rss() - rss0, len(gc.get_objects()) - objs0, sys.getrefcount(t) - refs0,
      _C._debug_counters() == live0)
"""


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="needs Linux /proc")
def test_no_leak_100k_round_trips(tmp_path):
    # in a fresh interpreter: the test process's own allocations (other tests,
    # pytest-xdist) must not count; run from tmp_path so that the installed
    # package is imported, not a source checkout
    import subprocess

    proc = subprocess.run([sys.executable, "-c", LEAK_CHECK], capture_output=True, text=True,
                          timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout.split()
    grown, objects, refs, counters_flat = int(out[0]), int(out[1]), int(out[2]), out[3]
    assert grown < 4 << 20, f"resident memory grew by {grown / 2**20:.1f} MiB"
    assert objects < 100, f"{objects} more Python objects"
    assert refs == 0, "the source tensor gained references"
    assert counters_flat == "True", "engine tensors or storages were not freed"
