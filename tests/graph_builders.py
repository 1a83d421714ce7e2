"""ONNX graphs built node by node for the recipe and picture suites (and
benchmarks/bench_visualize.py): a deep residual network of any size, and
small graphs around one rewrite."""
import numpy as np
from onnx import TensorProto, helper, numpy_helper

OPSET = 17


def model(nodes, inputs, outputs, initializers, opset: int = OPSET):
    """An ONNX model from lists of nodes, (name, shape) inputs/outputs (float32,
    dimension 0 dynamic) and name -> array initializers."""
    def info(name, shape):
        return helper.make_tensor_value_info(name, TensorProto.FLOAT, ["N", *shape[1:]])

    graph = helper.make_graph(nodes, "g", [info(*i) for i in inputs],
                              [info(*o) for o in outputs],
                              [numpy_helper.from_array(np.asarray(a), n)
                               for n, a in initializers.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def residual_chain(n_blocks: int, channels: int = 4, skip_every: int = 10, seed: int = 0):
    """Input (N, channels, 6, 6); n_blocks blocks of 5 nodes (Conv 3x3 -> Relu ->
    Conv 1x1 -> Add(block input) -> Relu), and every ``skip_every`` blocks an
    Add of the output of ``skip_every`` blocks earlier (long edges): about
    5 * n_blocks + n_blocks / skip_every nodes."""
    rng = np.random.default_rng(seed)
    nodes, inits, x = [], {}, "x"
    outs = [x]
    for b in range(n_blocks):
        p = f"b{b}"
        inits[f"{p}.w1"] = rng.normal(0, 0.2, (channels, channels, 3, 3)).astype(np.float32)
        inits[f"{p}.w2"] = rng.normal(0, 0.2, (channels, channels, 1, 1)).astype(np.float32)
        nodes += [
            helper.make_node("Conv", [x, f"{p}.w1"], [f"{p}.c1"], name=f"{p}/conv1",
                             pads=[1, 1, 1, 1]),
            helper.make_node("Relu", [f"{p}.c1"], [f"{p}.r1"], name=f"{p}/relu1"),
            helper.make_node("Conv", [f"{p}.r1", f"{p}.w2"], [f"{p}.c2"], name=f"{p}/conv2"),
            helper.make_node("Add", [f"{p}.c2", x], [f"{p}.a"], name=f"{p}/add"),
            helper.make_node("Relu", [f"{p}.a"], [f"{p}.y"], name=f"{p}/relu2"),
        ]
        x = f"{p}.y"
        if b and b % skip_every == 0:
            nodes.append(helper.make_node("Add", [x, outs[b - skip_every + 1]], [f"{p}.s"],
                                          name=f"{p}/skip"))
            x = f"{p}.s"
        outs.append(x)
    return model(nodes, [("x", (1, channels, 6, 6))], [(x, (1, channels, 6, 6))], inits)
