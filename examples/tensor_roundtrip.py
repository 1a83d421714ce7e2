"""Round-trip demo: torch -> engine -> torch for every dtype and a few layouts.

Prints, for each case, whether values, dtype, shape and strides survive and
whether memory was shared (a view) or copied, and the cost of a conversion.

    python examples/tensor_roundtrip.py
"""
import time

import numpy as np
import torch

from aidge_interop.tensor_converter import aidge_tensor_to_torch, torch_tensor_to_aidge

DTYPES = ["float32", "float64", "float16", "int8", "uint8", "int16", "int32", "int64", "bool"]
LAYOUTS = {
    "scalar": lambda t: t.reshape(-1)[0].clone(),
    "contiguous 4-D": lambda t: t,
    "transposed": lambda t: t.flatten(2).transpose(0, 2),
    "channels_last": lambda t: t.to(memory_format=torch.channels_last),
    "empty": lambda t: t[:, :0],
}


def main():
    print(f"{'dtype':<8} {'layout':<15} {'values':<7} {'strides':<8} {'memory':<7} {'us/trip':>8}")
    for name in DTYPES:
        dtype = getattr(torch, name)
        base = (torch.randn(2, 3, 4, 5) * 50).to(dtype)
        for label, make in LAYOUTS.items():
            t = make(base)
            a = torch_tensor_to_aidge(t)
            back = aidge_tensor_to_torch(a)
            same_values = torch.equal(back, t) and back.dtype == t.dtype and back.shape == t.shape
            same_strides = back.stride() == t.stride()
            shared = t.numel() == 0 or back.data_ptr() == t.data_ptr()
            n = 2000
            t0 = time.perf_counter()
            for _ in range(n):
                aidge_tensor_to_torch(torch_tensor_to_aidge(t))
            us = (time.perf_counter() - t0) / n * 1e6
            print(f"{name:<8} {label:<15} {'ok' if same_values else 'WRONG':<7} "
                  f"{'ok' if same_strides else 'changed':<8} {'view' if shared else 'copy':<7} {us:8.2f}")
    rev = np.arange(12.0).reshape(3, 4)[::-1]
    back = aidge_tensor_to_torch(torch_tensor_to_aidge(rev))
    print(f"\nNumPy view with negative strides {rev.strides}: engine view, torch copy "
          f"(values {'ok' if np.array_equal(back.numpy(), rev) else 'WRONG'})")


if __name__ == "__main__":
    main()
