"""Graph recipes: rewrites of the engine's graph before inference or export.

::

    graph = aidge_interop.load_onnx("model.onnx")
    recipes.constant_fold(graph)      # shape subgraphs on constants -> constants
    recipes.fuse_batchnorm(graph)     # Conv/Gemm + BatchNormalization -> Conv/Gemm
    recipes.remove_flatten(graph)     # Flatten/Reshape + Gemm -> FusedGemm(flatten_axis)
    report = recipes.fuse_activation(graph)   # Conv/Gemm + Relu/Clip -> FusedConv/FusedGemm
    print(report)                     # what changed, and what was left alone and why
    recipes.expand_metaops(graph)     # FusedConv/FusedGemm -> Conv/Gemm, Relu/Clip (fusions only)
    recipes.restore_flatten(graph)    # FusedGemm(flatten_axis) -> Flatten, Gemm
    recipes.fuse_pad(graph)           # zero Pad + Conv -> Conv with the pads
    recipes.block_channels(graph)     # conv chains in blocked channels (inference)
    recipes.fuse_linear(graph)        # [Transpose(W) ->] MatMul [-> Add(b)] -> FusedMatMul
    recipes.fuse_gelu(graph)          # tanh GELU written out in Mul/Add/Pow/Tanh -> Gelu

Each recipe is one C call (``csrc/recipes.c``) that edits the graph in
place: weights are rewritten in the engine's own parameter storage (BatchNorm
folding is computed in double), absorbed nodes and the values nothing uses
any more are removed, and the graph is checked again. Value names are kept:
a fused node writes the value its last absorbed node wrote, so the graph
outputs and every consumer downstream are unchanged. The next forward
re-plans (shapes, schedule, memory); when the graph had run before, the
recipe runs one forward on zeros of the last input shapes at once, so that
:meth:`Graph.nodes` and pictures show shapes.

Each returns a :class:`RecipeReport`: a list of one line per change (``str``)
with ``skipped`` (the candidates left alone, each with the reason),
``nodes`` (name of the node each change concerns, same order) and
``recipe``. The graph's :attr:`Graph.history` keeps every report.

The fused operators live in domain ``aidge_interop`` (``csrc/ops/fused.c``):
``FusedConv`` and ``FusedGemm`` carry their base operator's attributes plus
``activation`` (``"Relu"``, ``"Clip"`` or none), ``activation_params``
(Clip's min and max) and, for FusedGemm, ``flatten_axis``; forward and
backward are exact (the same kernels as the unfused nodes). ``FusedMatMul``
(``csrc/ops/matmul.c``) is a Linear: ``A @ op(B) [+ bias]`` with ``transB``.
"""
from __future__ import annotations

__all__ = ["fuse_batchnorm", "remove_flatten", "fuse_activation", "expand_metaops",
           "restore_flatten", "constant_fold", "fuse_pad", "block_channels", "fuse_linear",
           "fuse_gelu", "RecipeReport", "RECIPES"]


class RecipeReport(list):
    """What a recipe did: one ``str`` per change; ``skipped``: one ``str``
    per candidate left alone, with the reason; ``nodes``: the node each
    change concerns (parallel to the list)."""

    def __init__(self, recipe: str, done, skipped):
        super().__init__(text for _, text in done)
        self.recipe = recipe
        self.nodes = [node for node, _ in done]
        self.skipped = [text for _, text in skipped]
        self.skipped_nodes = [node for node, _ in skipped]

    def __str__(self) -> str:
        lines = [f"{self.recipe}: {len(self)} change(s)"] + [f"  {t}" for t in self]
        if self.skipped:
            lines += [f"  skipped: {t}" for t in self.skipped]
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"RecipeReport({self.recipe!r}, {list(self)!r}, skipped={self.skipped!r})"


def _apply(name: str, graph) -> RecipeReport:
    from .graph import Graph

    if not isinstance(graph, Graph):
        raise TypeError(f"{name}: argument 'graph' must be an aidge_interop Graph (from "
                        f"load_onnx), not {type(graph).__name__}")
    done, skipped = graph._g.apply_recipe(name)
    report = RecipeReport(name, done, skipped)
    graph._after_edit(report)
    return report


def fuse_batchnorm(graph) -> RecipeReport:
    """Folds every inference BatchNormalization that follows a Conv or Gemm
    (plain or fused without activation) into its weight and bias:
    ``W' = W * s``, ``b' = (beta * b - mean) * s + shift`` with
    ``s = scale / sqrt(var + eps)`` per output channel, in double, written
    back in place; a node without bias gets a new one (``<weight stem>.bias``).
    Raises ValueError when the graph is in training mode (batch statistics
    cannot be folded). BatchNorms whose producer's output, weight or bias is
    shared, or whose node says ``training_mode=1``, are skipped (see
    ``report.skipped``)."""
    return _apply("fuse_batchnorm", graph)


def batchnorm_epilogue(graph) -> RecipeReport:
    """Moves every inference BatchNormalization that follows a Conv or Gemm
    (plain or fused without activation) into it, as an epilogue on its
    output: ``FusedConv``/``FusedGemm`` with the BatchNorm's scale, bias,
    mean and variance as inputs 3 to 6 and ``bn_epsilon``; each forward
    computes ``y * s + (bias - mean * s)`` with ``s = scale / sqrt(var +
    eps)`` from their current values. Unlike :func:`fuse_batchnorm` the
    weights are not touched, so they may be shared (with other nodes, or
    with a model that keeps training); the fused node has no backward.
    Raises ValueError when the graph is in training mode; BatchNorms that
    cannot be moved are in ``report.skipped``; :func:`expand_metaops` undoes
    it."""
    return _apply("batchnorm_epilogue", graph)


def remove_flatten(graph) -> RecipeReport:
    """Removes each Flatten, or Reshape to 2-D that keeps the batch free
    (``[-1, n]`` or ``[0, -1]``, constant target shape), whose output only
    feeds Gemms (as A): those Gemms become ``FusedGemm`` with
    ``flatten_axis``, which reads A of any rank as a matrix."""
    return _apply("remove_flatten", graph)


def fuse_activation(graph) -> RecipeReport:
    """Fuses each Relu, and each Clip with constant bounds, into the Conv or
    Gemm before it when it is that node's only reader: ``FusedConv`` or
    ``FusedGemm`` with ``activation``."""
    return _apply("fuse_activation", graph)


def expand_metaops(graph) -> RecipeReport:
    """Undoes the fusions, :func:`fuse_activation` and
    :func:`batchnorm_epilogue`: every FusedConv/FusedGemm becomes Conv/Gemm
    [, BatchNormalization] [, Relu/Clip] again, with the node and value
    names they had. The Flatten that :func:`remove_flatten` removed stays
    removed (a graph prepared for export keeps it so, whatever the order of
    the recipes): a FusedGemm with ``flatten_axis`` keeps it, and one that
    fuses nothing else is left alone (in ``report.skipped``).
    :func:`restore_flatten` gives the Flatten back."""
    return _apply("expand_metaops", graph)


def restore_flatten(graph) -> RecipeReport:
    """Undoes :func:`remove_flatten`: a Flatten is put back before each
    FusedGemm with ``flatten_axis`` (one per removed node, with its node and
    value names); the FusedGemm becomes a Gemm again unless an activation or
    a BatchNorm epilogue is still fused into it."""
    return _apply("restore_flatten", graph)


def constant_fold(graph) -> RecipeReport:
    """Computes every node whose inputs are all constants (not parameters,
    not graph inputs) and replaces it by constant values; nodes that are
    random (Dropout) are left alone."""
    return _apply("constant_fold", graph)


def fuse_pad(graph) -> RecipeReport:
    """Removes each Pad that pads the spatial axes with zeros (mode
    ``constant``, value +0, constant pads, none on the batch and channel
    axes, no cropping) when only Convs read its output, as their input:
    each of them adds the padding to its own ``pads`` (``auto_pad`` unset)
    and reads the Pad's input (a ``ZeroPad2d`` before a ``Conv2d``, or
    TensorFlow's "same" padding exported as a Pad). The Conv pads each
    image where its kernel reads it, instead of one node writing the whole
    padded tensor for the next to read. Not undone by
    :func:`expand_metaops`."""
    return _apply("fuse_pad", graph)


def block_channels(graph) -> RecipeReport:
    """Runs each chain of float32 2-D convs (plain or fused, one group or
    depthwise, with the Adds and Relus between them) in blocked channels:
    ``(N, ceil(C / 8), H, W, 8)``, eight channels per position side by side,
    the layout the conv kernels compute in (``csrc/kernels/conv.h``); the
    convs become ``FusedConv`` with ``x_blocked``/``y_blocked``, and an
    ``UnblockChannels`` gives a value back in NCHW where something else reads
    it (a pool, a graph output); a pool averaging each channel over its whole
    plane (GlobalAveragePool, or an unpadded whole-plane AveragePool in a
    planned graph) becomes a ``BlockedGlobalAveragePool`` reading the
    blocks. Values read only inside a chain exist in
    blocked form only (``<name>_blocked``). Inference only: the blocked
    nodes have no backward, and :func:`expand_metaops` does not undo it. A
    conv with no conv, Add or Relu next to it is left alone (see
    ``report.skipped``). An Add of a conv's output (no activation, read
    nowhere else) and a value of the same shape, with the Relu after it,
    fuses into the conv as a residual input (a ResNet block's): this needs
    the shapes of a planned graph (run a forward first)."""
    return _apply("block_channels", graph)


def fuse_linear(graph) -> RecipeReport:
    """Makes each product of a 2-D weight one ``FusedMatMul`` node, the form
    in which torch's exporter writes ``nn.Linear`` on 3-D inputs:
    ``Transpose(W) -> MatMul(x, W^T) [-> Add(b)]``. The MatMul reads the
    weight in place (``transB=1``), so neither the Transpose nor its backward
    runs, and adds the bias of the Add that is its only reader (a vector of
    one value per output column) after its product, as the Add did. The
    same products and sums: outputs, gradients and SGD steps are bit for
    bit those of the unrewritten graph where OpenBLAS runs its packed
    kernels (products beyond about 64^3 multiply-adds: a transformer's),
    within float32 rounding below that (its small-matrix kernels sum in an
    order that depends on the layout). The weight and bias stay the same
    values (parameters keep their names, layouts and gradients). A
    Transpose that something else also reads is kept for it; a Transpose
    that is not a swap of a 2-D initializer's axes, and an Add whose other
    input is not such a bias, are left alone (see ``report.skipped``).
    Applied by :func:`aidge_interop.wrap` to the graphs it builds."""
    return _apply("fuse_linear", graph)


def fuse_gelu(graph) -> RecipeReport:
    """Makes each GELU of the tanh approximation that the graph writes out
    element by element, ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))``
    (transformers' ``gelu_new``, GPT-2's activation: eight Mul, Add, Pow and
    Tanh nodes, ``x^3`` as ``Pow(x, 3)`` or ``x x x``, the factors in either
    order), one ``Gelu`` node with ``approximate="tanh"``: one pass over the
    activations instead of eight. The same function, not the same float32
    operations: the outputs differ from the unrewritten graph's within float32
    rounding (about 1e-7 relative; Gelu's backward is its exact derivative).
    Only a chain whose intermediate values nothing else reads is rewritten.
    Applied by :func:`aidge_interop.wrap` to the graph of eval forwards
    (``fuse_inference``)."""
    return _apply("fuse_gelu", graph)


#: name -> recipe, in the order ``aidge-interop show --recipes all`` applies them
RECIPES = {
    "constant_fold": constant_fold,
    "fuse_batchnorm": fuse_batchnorm,
    "batchnorm_epilogue": batchnorm_epilogue,
    "remove_flatten": remove_flatten,
    "fuse_activation": fuse_activation,
    "expand_metaops": expand_metaops,
    "restore_flatten": restore_flatten,
    "fuse_pad": fuse_pad,
    "block_channels": block_channels,
    "fuse_linear": fuse_linear,
    "fuse_gelu": fuse_gelu,
}
