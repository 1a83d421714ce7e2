# %% [markdown]
# # Quantized LeNet, exported to standalone C
#
# A LeNet trained in seconds on scikit-learn's bundled digits (8x8 images, no
# download), quantized to int8 after training, exported as a C99 project that
# needs nothing but libc, compiled, and checked layer by layer against the
# engine. The same file runs as a script:
#
#     python examples/quantized_lenet_export.py [--out export_lenet_int8]
#
# and as the notebook `quantized_lenet_export.ipynb` (same cells).

# %%
import argparse
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import aidge_interop
from aidge_interop.quant import accuracy, compile_and_run, export_c, quantize

parser = argparse.ArgumentParser(description=__doc__)
parser.add_argument("--out", default=None, help="export folder (default: a temporary one)")
parser.add_argument("--epochs", type=int, default=30)
args, _ = parser.parse_known_args()  # notebooks pass their own arguments

# %% [markdown]
# ## 1. Data and a float LeNet

# %%
digits = load_digits()
x = (digits.images / 16.0).astype(np.float32)[:, None]  # (1797, 1, 8, 8) in [0, 1]
y = digits.target.astype(np.int64)
x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.2, random_state=0,
                                                    stratify=y)
print(f"train {x_train.shape}, test {x_test.shape}")

torch.set_num_threads(1)  # a model this small trains fastest on one thread
torch.manual_seed(0)
model = torch.nn.Sequential(
    torch.nn.Conv2d(1, 6, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),   # 6x4x4
    torch.nn.Conv2d(6, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),  # 16x2x2
    torch.nn.Flatten(),
    torch.nn.Linear(64, 120), torch.nn.ReLU(),
    torch.nn.Linear(120, 84), torch.nn.ReLU(),
    torch.nn.Linear(84, 10),
)
optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
xt, yt = torch.from_numpy(x_train), torch.from_numpy(y_train)
start = time.perf_counter()
for epoch in range(args.epochs):
    for i in torch.randperm(len(xt)).split(64):
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(xt[i]), yt[i]).backward()
        optimizer.step()
model.eval()
print(f"trained {args.epochs} epochs in {time.perf_counter() - start:.1f} s")

# %% [markdown]
# ## 2. The float model in the engine, then int8
#
# `wrap` runs the model on the engine; `quantize` calibrates it on 200
# training images: power-of-two scales so that every layer rescales with a
# single shift (`single_shift=True`; one per output channel, whose weights
# have their own scale), ReLU fused into the layer before.

# %%
engine_model = aidge_interop.wrap(model, [(1, 1, 8, 8)]).eval()
float_acc = accuracy(engine_model, x_test, y_test)
print(f"float accuracy (engine): {100 * float_acc:.2f} %  "
      f"(torch: {100 * accuracy(model, x_test, y_test):.2f} %)")

q = quantize(engine_model, x_train[:200], nb_bits=8, single_shift=True, clipping="max")
int8_acc = q.accuracy(x_test, y_test)
print(f"int8 accuracy (engine):  {100 * int8_acc:.2f} %")
print(q.summary())
picture = Path(tempfile.gettempdir()) / "lenet_int8.svg"
q.graph.visualize(picture, title="int8 LeNet")  # quantized nodes show their bits and shift
print(f"graph picture: {picture}")

# %% [markdown]
# ## 3. Export, compile, run
#
# The export embeds the first test image and the engine's output of every
# layer for it: the program checks each layer as it runs it.

# %%
folder = Path(args.out) if args.out else Path(tempfile.mkdtemp()) / "export_lenet_int8"
if folder.exists() and (folder / ".aidge_interop_export").exists():
    shutil.rmtree(folder)  # a previous run's export
result = export_c(q, folder, inputs=[x_test[:1]], compare=True)
print(sorted(p.name for p in folder.iterdir()))

embedded = compile_and_run(folder)  # runs the layer check, raises if a layer differs
print("program output on the embedded image:", embedded[0])

# %% [markdown]
# ## 4. The whole test split through the compiled program
#
# The program reads samples from a file; its int8 outputs must equal the
# engine's bit for bit.

# %%
x_test_q = q.quantize_inputs(x_test)[0]                     # (360, 1, 8, 8) int8
program = compile_and_run(folder, [x_test_q])[0]           # (360, 10)
engine = q.run(x_test_q)[0]                                 # (360, 10)
identical = np.array_equal(program, engine)
print(f"compiled program == engine on {len(x_test)} test images: {identical}")
program_acc = float(np.mean(program.argmax(1) == y_test))
print(f"int8 accuracy (compiled C): {100 * program_acc:.2f} %")
print(f"RAM {result.ram_bytes} bytes, ROM {result.rom_bytes} bytes")

assert identical, "the compiled program differs from the engine"
assert float_acc - int8_acc <= 0.01, "int8 accuracy more than 1 point below float"
