# %% [markdown]
# # Quantized LeNet C export (Aidge's tutorial, on aidge_interop)
#
# The steps of Eclipse Aidge's "Quantized LeNet CPP Export" notebook, with
# `import aidge_interop as ait` in place of the Aidge modules:
#
# 1. import an ONNX LeNet, simplify its graph with recipes, test it;
# 2. quantize it to int8 (power-of-two scales: one shift per output channel);
# 3. export it as standalone C, with the engine's feature maps as references;
# 4. compile the export and run it.
#
# Aidge's notebook downloads a LeNet trained on MNIST (and MNIST itself); to
# run offline and in seconds this one trains the same network on
# scikit-learn's bundled 8x8 digits and exports it to ONNX for batch 1, as
# the download is. Every path is relative: run it from its folder,
#
#     python quantized_lenet_cpp_export.py
#
# or open `quantized_lenet_cpp_export.ipynb` (the same cells).

# %% [markdown]
# ## 1. Import the ONNX model

# %%
# Utils
import shutil
from pathlib import Path

import numpy as np

# Database
from sklearn.datasets import load_digits

# aidge_interop: graph, recipes, quantization, C export, Model Explorer
import aidge_interop as ait
from aidge_interop import explorer, recipes
from aidge_interop.export import compile_and_run

# %% [markdown]
# Get the model. Aidge's notebook downloads `lenet_mnist.onnx`; here a LeNet
# is trained on 1437 digits (a few seconds) and exported once.

# %%
file_path = "lenet_digits.onnx"
digits = load_digits()
images = (digits.images / 16.0).astype(np.float32)  # (1797, 8, 8) in [0, 1]
train, test = slice(0, 1437), slice(1437, None)

if not Path(file_path).exists():
    import torch

    torch.manual_seed(0)
    torch.set_num_threads(1)
    lenet = torch.nn.Sequential(
        torch.nn.Conv2d(1, 6, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(6, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Flatten(),
        torch.nn.Linear(64, 120), torch.nn.ReLU(),
        torch.nn.Linear(120, 84), torch.nn.ReLU(),
        torch.nn.Linear(84, 10),
    )
    optimizer = torch.optim.Adam(lenet.parameters(), lr=3e-3)
    x_train = torch.from_numpy(images[train, None])
    y_train = torch.from_numpy(digits.target[train])
    for epoch in range(20):
        for i in torch.randperm(len(x_train)).split(64):
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(lenet(x_train[i]), y_train[i]).backward()
            optimizer.step()
    torch.onnx.export(lenet.eval(), (torch.zeros(1, 1, 8, 8),), file_path, dynamo=False,
                      input_names=["input"], output_names=["output"])

# Load the model
model = ait.load_onnx(file_path, verbose=False)

# %% [markdown]
# The graph shows itself inline in a notebook (`model`, or
# `model.visualize(title=...)`); `explorer.visualize(model, "Imported LeNet")`
# opens it in Google's Model Explorer when it is installed
# (`pip install "aidge_interop[explorer]"`), and `explorer.save` writes the
# file Model Explorer opens.

# %%
explorer.save(model, "imported_lenet.json", "Imported LeNet")
model.visualize(title="Imported LeNet")

# %% [markdown]
# ## Modify the graph
#
# The imported graph has a Flatten layer, which the export does not need:
# `remove_flatten` lets the first Gemm read the pooled maps as a matrix.

# %%
recipes.remove_flatten(model)
model.visualize("removed_flatten.svg", title="Removed Flatten")
print([node["op_type"] for node in model.nodes()])

# %% [markdown]
# BatchNorms are folded into the convolutions' weights and biases (LeNet
# has none), and `expand_metaops` splits fused nodes into one operator each
# (it leaves the Flatten removed).

# %%
recipes.fuse_batchnorm(model)
recipes.expand_metaops(model)

# %% [markdown]
# ## Test the model
#
# NB_TEST samples for inference, NB_CALIB for calibration, one tensor per
# sample (batch 1, as the model was exported).

# %%
NB_TEST = 10    # Validation dataset
NB_CALIB = 100  # Calibration dataset

tensors = []
labels = []
for i, (image, label) in enumerate(zip(images[test], digits.target[test])):
    tensor = np.reshape(image, (1, 1, 8, 8))
    tensor = ait.Tensor(tensor)
    tensors.append(tensor)
    labels.append(int(label))
    if i >= max(NB_TEST, NB_CALIB):
        break

# %% [markdown]
# `propagate` forwards a tensor through the graph and returns the output.

# %%
def propagate(model, tensor):
    return model.forward([tensor])[0]


score = 0
for i in range(NB_TEST):
    output_tensor = propagate(model, tensors[i])
    prediction = np.argmax(output_tensor)
    confidence = np.max(output_tensor)
    print(f"Ref vs Pred (Conf) : {labels[i]} vs {prediction} ({confidence:.2f})")
    if prediction == labels[i]:
        score += 1

print(f"\nSCORE : {score}/{NB_TEST} ({round(score / NB_TEST * 100)} %)")

# %% [markdown]
# ## 2. Quantize the model
#
# Post-training quantization: 8-bit weights and activations, int32 biases,
# power-of-two scales so that each output channel rescales with a single shift. The
# calibration set is the list of sample tensors.

# %%
NB_BITS = 8

quantized = ait.quantize(model, tensors[0:NB_CALIB], nb_bits=NB_BITS, single_shift=True)
print(quantized.summary())
quantized.graph.visualize(title="Quantized LeNet")

# %% [markdown]
# ## Create the quantized dataset
#
# The quantized graph takes int8 inputs: each sample divided by the input
# scale the calibration chose, rounded and clamped to [-127, 127].

# %%
print(f"input scale: {quantized.input_scales[0]}")
tensors_q = [quantized.quantize_inputs(np.asarray(tensors[i]))[0] for i in range(NB_TEST)]

# %% [markdown]
# ## Test the quantized model

# %%
score_q = 0
outputs_q = []
for i in range(NB_TEST):
    output_tensor = quantized.run(tensors_q[i])[0]
    outputs_q.append(output_tensor)
    prediction = np.argmax(output_tensor)
    confidence = np.max(output_tensor)
    print(f"Ref vs Pred (Conf) : {labels[i]} vs {prediction} ({int(confidence)})")
    if prediction == labels[i]:
        score_q += 1

print(f"\nSCORE : {score_q}/{NB_TEST} ({round(score_q / NB_TEST * 100)} %)")

# %% [markdown]
# ## 3. Export the model
#
# The export embeds the first sample and the engine's output of every layer
# for it (`compare=True`, Aidge's `aidge_cmp`): the program checks each
# layer as it runs it and stops at the first difference.

# %%
export_folder_name = Path("export_lenet_int8")

# Remove existing export
if export_folder_name.is_dir():
    print("Removing existing export directory...")
    shutil.rmtree(export_folder_name)

result = ait.export_c(quantized, export_folder_name, inputs=[tensors_q[0]], compare=True)

# %% [markdown]
# ## 4. Compile the export and run it

# %%
print("\n### Compiling and running the export ###")
output = compile_and_run(export_folder_name)[0]  # raises if a layer differs
prediction = np.argmax(output)
print(f"Ref vs Pred (Conf) : {labels[0]} vs {prediction} ({int(np.max(output))})")

# The NB_TEST samples through the compiled program, against the engine
program = compile_and_run(export_folder_name, [np.concatenate(tensors_q)])[0]
same = np.array_equal(program, np.concatenate(outputs_q))
print(f"compiled program == engine on {NB_TEST} samples: {same}")
