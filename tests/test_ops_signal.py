"""The signal operators (signal.c): DFT and STFT against torch.fft and
torch.stft (values and gradients, every mode, power-of-two and other
lengths), their gradients against float64 finite differences, the windows
and MelWeightMatrix against onnx.reference."""
import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

import aidge_interop
from op_harness import check_op, make_model

DTYPES = [np.float32, np.float64]
DT_IDS = lambda d: np.dtype(d).name  # noqa: E731


def _complex(x):
    """[..., 1 or 2] -> a complex torch tensor"""
    if x.shape[-1] == 1:
        return x[..., 0].to(torch.complex128 if x.dtype == torch.float64 else torch.complex64)
    return torch.view_as_complex(x.contiguous())


def _torch_dft(x, axis, n, inverse, onesided):
    """What ONNX's DFT computes, in torch.fft."""
    c = _complex(x)
    if inverse and onesided:
        return torch.fft.irfft(c, n=n, dim=axis).unsqueeze(-1)
    y = (torch.fft.ifft if inverse else torch.fft.fft)(c, n=n, dim=axis)
    if onesided:
        y = y.narrow(axis, 0, n // 2 + 1)
    return torch.view_as_real(y)


# (shape, axis, dft_length or None): powers of two, other lengths (Bluestein),
# a prime, length 1, padding and truncation, an inner axis
CASES = [
    ((2, 8, 1), 1, None), ((3, 10, 2), 1, None), ((2, 7, 3, 2), 1, None),
    ((2, 3, 12, 1), -2, None), ((4, 1, 2), 1, None), ((2, 6, 2), 1, 9),
    ((2, 9, 1), 1, 4), ((2, 5, 4, 2), 2, 16), ((1, 13, 1), 1, None),
]
MODES = [(False, False), (False, True), (True, False), (True, True)]
MODE_IDS = ["fft", "rfft", "ifft", "irfft"]


def _dft_case(shape, axis, n, mode, dtype, opset):
    inverse, onesided = mode
    shape = list(shape)
    if onesided and not inverse:
        shape[-1] = 1  # RFFT: real input
    if inverse and onesided:
        shape[-1] = 2  # IRFFT: complex input
    x = np.random.default_rng(len(shape) + shape[1]).standard_normal(shape).astype(dtype)
    length = n if n is not None else (
        2 * (shape[axis] - 1) if inverse and onesided else shape[axis])
    if length < 1:
        pytest.skip("IRFFT of a length-1 axis has no default length")
    attrs = {"inverse": int(inverse), "onesided": int(onesided)}
    consts = {}
    if n is not None:
        consts["n"] = np.array(n, np.int64)
    if opset >= 20:
        consts["axis"] = np.array(axis, np.int64)
        order = ["x", "n" if n is not None else "", "axis"]
    else:
        attrs["axis"] = axis
        order = ["x"] + (["n"] if n is not None else [])
    norm_axis = axis % len(shape)
    return x, attrs, consts, order, lambda x_, *_: _torch_dft(x_, norm_axis, length, inverse,
                                                              onesided)


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("opset", [17, 20])
@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
@pytest.mark.parametrize("shape,axis,n", CASES, ids=str)
def test_dft(shape, axis, n, mode, opset, dtype):
    """Values and the input's gradient against torch.fft (torch's autograd
    of fft, rfft, ifft and irfft)."""
    x, attrs, consts, order, ref = _dft_case(shape, axis, n, mode, dtype, opset)
    check_op("DFT", {"x": x}, ref, attrs=attrs, consts=consts, input_order=order, opset=opset)


def _vjp_vs_finite_differences(model, inputs, wrt, seed=0):
    """The engine's gradient of <g, f(inputs)> for a random g against central
    differences in float64, for the inputs named in `wrt`."""
    g = aidge_interop.load_onnx(model)
    names = list(inputs)
    out = g.forward([inputs[k] for k in names], need_backward=True, input_grads=True)[0]
    go = np.random.default_rng(seed).standard_normal(out.shape)
    grads = g.backward([go])
    for k in wrt:
        x = inputs[k]
        fd = np.zeros_like(x)
        for i in range(x.size):
            vals = []
            for h in (1e-6, -1e-6):
                xs = dict(inputs)
                xs[k] = x.copy()
                xs[k].reshape(-1)[i] += h
                y = g.forward([xs[j] for j in names])[0]
                vals.append(float(np.sum(go * y)))
            fd.reshape(-1)[i] = (vals[0] - vals[1]) / 2e-6
        np.testing.assert_allclose(grads[names.index(k)], fd, rtol=1e-6, atol=1e-7,
                                   err_msg=f"gradient of '{k}'")


@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
@pytest.mark.parametrize("shape,axis,n", [((2, 6, 2), 1, 9), ((1, 5, 3, 2), 1, 4),
                                          ((2, 8, 2), 1, None)], ids=str)
def test_dft_gradient_finite_differences(shape, axis, n, mode):
    x, attrs, consts, order, _ = _dft_case(shape, axis, n, mode, np.float64, 20)
    model = make_model("DFT", {"x": x}, attrs, consts, input_order=order, opset=20)
    _vjp_vs_finite_differences(model, {"x": x}, ["x"])


def _torch_stft(step, flen, onesided, has_window):
    def ref(x, *rest):
        w = rest[0] if has_window else torch.ones(flen, dtype=x.dtype)
        sig = x[..., 0] if x.shape[-1] == 1 else _complex(x)
        y = torch.stft(sig, n_fft=flen, hop_length=step, win_length=flen, window=w,
                       center=False, onesided=onesided, return_complex=True)
        return torch.view_as_real(y.transpose(1, 2))
    return ref


STFT_CASES = [  # (batch, length, parts), frame_step, frame_length, onesided
    ((2, 32, 1), 4, 8, True), ((1, 30, 1), 3, 10, True), ((2, 25, 2), 5, 7, False),
    ((1, 16, 1), 16, 16, False), ((3, 20, 1), 2, 6, False),
]


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("window", ["none", "window", "window+frame_length"])
@pytest.mark.parametrize("shape,step,flen,onesided", STFT_CASES, ids=str)
def test_stft(shape, step, flen, onesided, window, dtype):
    """Values and the gradients of the signal and of the window (a graph
    input) against torch.stft (center=False)."""
    rng = np.random.default_rng(shape[1])
    x = rng.standard_normal(shape).astype(dtype)
    inputs = {"x": x}
    consts = {"step": np.array(step, np.int64)}
    order = ["x", "step"]
    if window == "none":
        consts["flen"] = np.array(flen, np.int64)
        order += ["", "flen"]
    else:
        inputs["w"] = rng.uniform(0.1, 1.0, flen).astype(dtype)
        order += ["w"]
        if window == "window+frame_length":
            consts["flen"] = np.array(flen, np.int64)
            order += ["flen"]
    has_w = window != "none"

    def ref(x_, *rest):  # torch_fn gets the inputs, then the constants
        return _torch_stft(step, flen, onesided, has_w)(x_, *rest[:1] if has_w else ())

    check_op("STFT", inputs, ref, attrs={"onesided": int(onesided)}, consts=consts,
             input_order=order, opset=17)


@pytest.mark.parametrize("parts,onesided", [(1, True), (2, False)])
def test_stft_gradient_finite_differences(parts, onesided):
    rng = np.random.default_rng(3)
    inputs = {"x": rng.standard_normal((2, 14, parts)), "w": rng.uniform(0.2, 1, 6)}
    model = make_model("STFT", inputs, {"onesided": int(onesided)},
                       {"step": np.array(3, np.int64)}, input_order=["x", "step", "w"],
                       opset=17)
    _vjp_vs_finite_differences(model, inputs, ["x", "w"])


def _generator(op, inputs, attrs):
    """A model whose inputs are constants (as the ONNX node tests feed them,
    the graph inputs are read when planned; constants are the same values)."""
    names = list(inputs)
    node = helper.make_node(op, names, ["y"], **attrs)
    inits = [onnx.numpy_helper.from_array(np.asarray(v), k) for k, v in inputs.items()]
    graph = helper.make_graph([node], op, [], [helper.make_tensor_value_info(
        "y", TensorProto.UNDEFINED, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("op", ["HannWindow", "HammingWindow", "BlackmanWindow"])
@pytest.mark.parametrize("size", [1, 2, 7, 16])
@pytest.mark.parametrize("periodic", [0, 1])
@pytest.mark.parametrize("out_type", [TensorProto.FLOAT, TensorProto.DOUBLE])
def test_windows(op, size, periodic, out_type):
    model = _generator(op, {"size": np.array(size, np.int64)},
                       {"periodic": periodic, "output_datatype": out_type})
    ours = aidge_interop.load_onnx(model).forward([])[0]
    with np.errstate(invalid="ignore", divide="ignore"):  # symmetric size 1: 0 / 0
        ref = ReferenceEvaluator(model).run(None, {})[0]
    assert ours.dtype == ref.dtype
    np.testing.assert_allclose(ours, ref, rtol=1e-6, atol=1e-7, equal_nan=True)


def test_windows_against_torch():
    """torch's windows (ONNX's Hamming window has alpha 25/46, torch's
    default 0.54)."""
    hamming = lambda n, **k: torch.hamming_window(n, alpha=25 / 46, beta=21 / 46, **k)  # noqa: E731
    for op, fn in [("HannWindow", torch.hann_window), ("HammingWindow", hamming),
                   ("BlackmanWindow", torch.blackman_window)]:
        for periodic in (0, 1):
            model = _generator(op, {"size": np.array(12, np.int64)},
                               {"periodic": periodic, "output_datatype": TensorProto.DOUBLE})
            ours = aidge_interop.load_onnx(model).forward([])[0]
            ref = fn(12, periodic=bool(periodic), dtype=torch.float64).numpy()
            np.testing.assert_allclose(ours, ref, rtol=1e-12, atol=1e-12, err_msg=op)


@pytest.mark.parametrize("mels,dft_len,rate,lo,hi", [
    (8, 16, 8192, 0.0, 8192 / 2.0), (10, 64, 16000, 100.0, 7000.0),
    (5, 31, 22050, 20.0, 11000.0), (3, 512, 16000, 0.0, 8000.0)])
def test_mel_weight_matrix(mels, dft_len, rate, lo, hi):
    inputs = {"num_mel_bins": np.array(mels, np.int32), "dft_length": np.array(dft_len, np.int32),
              "sample_rate": np.array(rate, np.int32), "lower_edge_hertz": np.float32(lo),
              "upper_edge_hertz": np.float32(hi)}
    model = _generator("MelWeightMatrix", inputs, {})
    ours = aidge_interop.load_onnx(model).forward([])[0]
    ref = ReferenceEvaluator(model).run(None, {})[0]
    assert ours.dtype == ref.dtype and ours.shape == ref.shape
    np.testing.assert_allclose(ours, ref, rtol=1e-6, atol=1e-7)


def test_bad_inputs_name_the_node():
    x = np.zeros((2, 8, 3), np.float32)
    with pytest.raises(ValueError, match="DFT node .*last dimension is 3"):
        check_op("DFT", {"x": x}, None, grad=False, opset=20)
    x = np.zeros((2, 8, 1), np.float32)
    with pytest.raises(ValueError, match="DFT node .*axis 2 is out of range"):
        check_op("DFT", {"x": x}, None, consts={"axis": np.array(2, np.int64)},
                 input_order=["x", "", "axis"], grad=False, opset=20)
    with pytest.raises(ValueError, match="STFT node .*frame_length is 9 for a signal of "
                                         "length 8"):
        check_op("STFT", {"x": x}, None, consts={"s": np.array(1, np.int64),
                                                 "f": np.array(9, np.int64)},
                 input_order=["x", "s", "", "f"], grad=False, opset=17)


class _Spectrogram(torch.nn.Module):
    """torch.stft with a Hann window (a buffer), and rfft / irfft."""

    def __init__(self):
        super().__init__()
        self.register_buffer("window", torch.hann_window(16))

    def forward(self, x):
        spec = torch.stft(x, 16, hop_length=4, window=self.window, center=False,
                          return_complex=True)
        back = torch.fft.irfft(torch.fft.rfft(x[:, :10]), n=10)
        return torch.view_as_real(spec), back


def test_wrapped_stft_and_fft():
    """torch.stft, torch.fft.rfft and irfft wrapped (the dynamo exporter
    writes an STFT and DFTs; the TorchScript exporter has no ONNX form for
    fft_rfft): outputs and the input's gradient against torch."""
    pytest.importorskip("onnxscript")
    from op_harness import check_wrapped_step

    model = _Spectrogram()
    x = torch.randn(2, 64)
    check_wrapped_step(model, aidge_interop.wrap(model, (x,), exporter="dynamo"), x)
