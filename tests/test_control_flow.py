"""Loop and If (csrc/ops/control.c): hand-built models against ONNX's
reference implementation, gradients by central finite differences through
a Loop's captured parameter and through an If, and nn.EmbeddingBag (which
the TorchScript exporter writes as a Loop) wrapped and compared to torch."""
import numpy as np
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import aidge_interop

F, I, B = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL
D = TensorProto.DOUBLE
R = np.random.default_rng(7)


def vi(name, t, shape=None):
    return helper.make_tensor_value_info(name, t, shape)


def model(nodes, inputs, outputs, inits=(), opset=20):
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def const(name, value):
    return numpy_helper.from_array(np.asarray(value), name)


def run_both(m, feeds, **load):
    """The engine's outputs and the reference's, for the feeds (a dict)."""
    ref = ReferenceEvaluator(m).run(None, feeds)
    g = aidge_interop.load_onnx(m, **load)
    got = g.forward([feeds[n] for n in g.input_names])
    return got, ref


def assert_same(got, ref):
    assert len(got) == len(ref)
    for a, b in zip(got, ref):
        assert a.dtype == b.dtype and a.shape == b.shape, (a.dtype, a.shape, b.dtype, b.shape)
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)


def counter_body(scan=True, cond_from=None):
    """Body (i, cond, acc) -> (cond, acc + x[i] * w, [acc + x[i] * w]): x and
    w are outer values read without being inputs (implicit captures)."""
    nodes = [
        helper.make_node("Unsqueeze", ["i", "zero_axis"], ["i1"]),
        helper.make_node("Gather", ["x", "i"], ["xi"], axis=0),
        helper.make_node("Mul", ["xi", "w"], ["xw"]),
        helper.make_node("Add", ["acc_in", "xw"], ["acc_out"]),
        helper.make_node("Identity", ["acc_out"], ["scan"]),
    ]
    if cond_from is None:
        nodes.append(helper.make_node("Identity", ["cond_in"], ["cond_out"]))
    else:  # go on while the sum stays below the limit
        nodes += [helper.make_node("ReduceSum", ["acc_out"], ["total"], keepdims=0),
                  helper.make_node("Less", ["total", cond_from], ["cond_out"])]
    outputs = [vi("cond_out", B, []), vi("acc_out", F, None)] + ([vi("scan", F, None)]
                                                                   if scan else [])
    return helper.make_graph(nodes, "body", [vi("i", I, []), vi("cond_in", B, []),
                                             vi("acc_in", F, None)], outputs,
                             [const("zero_axis", np.array([0], np.int64))])


def loop_model(m_input=True, cond_input=True, scan=True, cond_from=None, w_param=False):
    body = counter_body(scan, cond_from)
    ins = [vi("x", F, [6, 3]), vi("acc0", F, [3])]
    inits = [const("w", R.uniform(0.5, 1.5, 3).astype(np.float32))] if w_param else []
    if not w_param:
        ins.append(vi("w", F, [3]))
    if m_input:
        ins.append(vi("M", I, []))
    if cond_input:
        ins.append(vi("c", B, []))
    if cond_from:
        ins.append(vi(cond_from, F, []))
    outs = [vi("acc", F, None)] + ([vi("stack", F, None)] if scan else [])
    node = helper.make_node("Loop", ["M" if m_input else "", "c" if cond_input else "", "acc0"],
                            [o.name for o in outs], body=body)
    return model([node], ins, outs, inits)


def loop_feeds(m=None, c=None, limit=None):
    feeds = {"x": R.uniform(0, 1, (6, 3)).astype(np.float32),
             "acc0": R.uniform(0, 1, 3).astype(np.float32),
             "w": R.uniform(0.5, 1.5, 3).astype(np.float32)}
    if m is not None:
        feeds["M"] = np.array(m, np.int64)
    if c is not None:
        feeds["c"] = np.array(c)
    if limit is not None:
        feeds["limit"] = np.array(limit, np.float32)
    return feeds


@pytest.mark.parametrize("trips", [4, 6])
def test_loop_trip_count_scan_and_captures(trips):
    got, ref = run_both(loop_model(), loop_feeds(trips, True))
    assert got[1].shape == (trips, 3)
    assert_same(got, ref)


def test_loop_zero_trips():
    """M = 0: the carried value comes back and the scan output is empty
    (ONNX's reference cannot stack no iteration: checked by hand)."""
    feeds = loop_feeds(0, True)
    g = aidge_interop.load_onnx(loop_model())
    acc, stack = g.forward([feeds[n] for n in g.input_names])
    np.testing.assert_array_equal(acc, feeds["acc0"])
    assert stack.shape == (0, 3) and stack.dtype == np.float32


def test_loop_condition_false_at_start():
    got, ref = run_both(loop_model(scan=False), loop_feeds(5, False))
    assert_same(got, ref)  # no iteration: the carried value comes back


def test_loop_trip_count_and_condition_from_the_body():
    """The body's condition ends the loop before M (no scan output: the
    number of iterations is known only at run time)."""
    m = loop_model(scan=False, cond_from="limit")
    feeds = loop_feeds(6, True, limit=2.5)
    got, ref = run_both(m, feeds)
    assert_same(got, ref)
    # it stopped early: fewer than 6 iterations were summed
    full = feeds["acc0"] + (feeds["x"] * feeds["w"]).sum(0)
    assert got[0].sum() < full.sum()


def test_loop_while_condition_only():
    """No trip count: a while loop (ONNX's reference runs no iteration
    without M, against the standard: checked against NumPy)."""
    m = loop_model(m_input=False, scan=False, cond_from="limit")
    feeds = loop_feeds(None, True, limit=2.0)
    g = aidge_interop.load_onnx(m)
    (acc,) = g.forward([feeds[n] for n in g.input_names])
    want = feeds["acc0"].copy()
    for i in range(6):
        want = want + feeds["x"][i] * feeds["w"]
        if want.sum() >= 2.0:
            break
    np.testing.assert_allclose(acc, want, rtol=1e-6)


def test_loop_scan_needs_the_trip_count_when_planned():
    m = loop_model(m_input=False, scan=True, cond_from="limit")
    g = aidge_interop.load_onnx(m)
    feeds = loop_feeds(None, True, limit=2.0)
    with pytest.raises(NotImplementedError, match=r"Loop node .*scan output.*trip count M"):
        g.forward([feeds[n] for n in g.input_names])


def test_loop_condition_ending_a_scan_early_is_refused():
    m = loop_model(scan=True, cond_from="limit")
    g = aidge_interop.load_onnx(m)
    feeds = loop_feeds(6, True, limit=1.0)
    with pytest.raises(NotImplementedError, match=r"Loop node .*the loop ended after \d "
                                                  r"iterations, and its scan outputs were "
                                                  r"planned for 6"):
        g.forward([feeds[n] for n in g.input_names])


def test_loop_scan_of_changing_shape_is_refused():
    """A scan value whose shape changes per iteration (Range(0, i + 1))."""
    body = helper.make_graph(
        [helper.make_node("Add", ["i", "one"], ["n"]),
         helper.make_node("Range", ["zero", "n", "one"], ["r"]),
         helper.make_node("Identity", ["cond_in"], ["cond_out"])],
        "body", [vi("i", I, []), vi("cond_in", B, [])], [vi("cond_out", B, []), vi("r", I, None)],
        [const("one", np.array(1, np.int64)), const("zero", np.array(0, np.int64))])
    m = model([helper.make_node("Loop", ["M", ""], ["s"], body=body)], [vi("M", I, [])],
              [vi("s", I, None)])
    g = aidge_interop.load_onnx(m)
    with pytest.raises(NotImplementedError, match=r"Loop node .*scan output 0 is int64\(2\) "
                                                  r"at iteration 1 and int64\(1\) at iteration 0"):
        g.forward([np.array(3, np.int64)])


def test_loop_carried_value_that_grows_is_refused():
    body = helper.make_graph(
        [helper.make_node("Concat", ["acc_in", "acc_in"], ["acc_out"], axis=0),
         helper.make_node("Identity", ["cond_in"], ["cond_out"])],
        "body", [vi("i", I, []), vi("cond_in", B, []), vi("acc_in", F, None)],
        [vi("cond_out", B, []), vi("acc_out", F, None)])
    m = model([helper.make_node("Loop", ["M", "", "x"], ["y"], body=body)],
              [vi("x", F, [2])], [vi("y", F, None)], [const("M", np.array(3, np.int64))])
    g = aidge_interop.load_onnx(m)
    with pytest.raises(NotImplementedError, match=r"Loop node .*loop-carried value 0 comes in "
                                                  r"as float32\(2\) and leaves the body as "
                                                  r"float32\(4\)"):
        g.forward([np.ones(2, np.float32)])


def test_loop_body_with_changing_shapes():
    """Body shapes differ per iteration (a slice x[:i + 1] summed): the
    body is planned again for each; the scan value keeps its shape."""
    body = helper.make_graph(
        [helper.make_node("Add", ["i", "one"], ["n"]),
         helper.make_node("Unsqueeze", ["n", "zero1"], ["end"]),
         helper.make_node("Slice", ["x", "zero1", "end"], ["part"]),
         helper.make_node("ReduceSum", ["part", "zero1"], ["s"], keepdims=0),
         helper.make_node("Identity", ["cond_in"], ["cond_out"])],
        "body", [vi("i", I, []), vi("cond_in", B, [])], [vi("cond_out", B, []), vi("s", F, None)],
        [const("one", np.array(1, np.int64)), const("zero1", np.array([0], np.int64))])
    m = model([helper.make_node("Shape", ["x"], ["shape"]),
               helper.make_node("Gather", ["shape", "zero"], ["rows"], axis=0),
               helper.make_node("Loop", ["rows", "true"], ["cumsum"], body=body)],
              [vi("x", F, ["n", 3])], [vi("cumsum", F, None)],
              [const("zero", np.array(0)), const("true", np.array(True))])
    for rows in (5, 2):
        x = R.standard_normal((rows, 3)).astype(np.float32)
        got, ref = run_both(m, {"x": x})
        assert_same(got, ref)
        np.testing.assert_allclose(got[0], np.cumsum(x, 0), rtol=1e-5, atol=1e-6)


def if_model(nested=False):
    """y = If(sum(x) > 0): then x * w, else (x - w) or, nested, another If."""
    then_g = helper.make_graph([helper.make_node("Mul", ["x", "w"], ["t"])], "then", [],
                               [vi("t", D, None)])
    else_nodes = [helper.make_node("Sub", ["x", "w"], ["e"])]
    if nested:
        inner_then = helper.make_graph([helper.make_node("Neg", ["x"], ["it"])], "it", [],
                                       [vi("it", D, None)])
        inner_else = helper.make_graph([helper.make_node("Add", ["x", "x"], ["ie"])], "ie", [],
                                       [vi("ie", D, None)])
        else_nodes = [helper.make_node("ReduceMax", ["x"], ["mx"], keepdims=0),
                      helper.make_node("Greater", ["mx", "lim"], ["c2"]),
                      helper.make_node("If", ["c2"], ["e"], then_branch=inner_then,
                                       else_branch=inner_else)]
    else_g = helper.make_graph(else_nodes, "else", [], [vi("e", D, None)])
    nodes = [helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
             helper.make_node("Greater", ["s", "zero"], ["c"]),
             helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g)]
    inits = [const("zero", np.array(0.0)), const("lim", np.array(0.5)),
             const("w", R.uniform(0.5, 1.5, (2, 3)))]
    return model(nodes, [vi("x", D, [2, 3])], [vi("y", D, None)], inits)


@pytest.mark.parametrize("nested", [False, True])
def test_if_runtime_condition(nested):
    m = if_model(nested)
    g = aidge_interop.load_onnx(m)
    ref = ReferenceEvaluator(m)
    for x in (np.abs(R.standard_normal((2, 3))), -np.abs(R.standard_normal((2, 3))),
              -np.abs(R.standard_normal((2, 3))) + [[0, 0, 2.0], [0, 0, 0]]):
        (got,) = g.forward([x])
        (want,) = ref.run(None, {"x": x})
        np.testing.assert_allclose(got, want, rtol=1e-12)


def test_if_condition_known_when_planned_plans_one_branch():
    """A constant condition: only the branch taken is planned, so the other
    may give another shape."""
    then_g = helper.make_graph([helper.make_node("Identity", ["x"], ["t"])], "t", [],
                               [vi("t", F, None)])
    else_g = helper.make_graph([helper.make_node("ReduceSum", ["x"], ["e"])], "e", [],
                               [vi("e", F, None)])
    m = model([helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g)],
              [vi("x", F, [2, 3])], [vi("y", F, None)], [const("c", np.array(True))])
    x = R.standard_normal((2, 3)).astype(np.float32)
    got, ref = run_both(m, {"x": x})
    assert_same(got, ref)


def test_if_branches_of_different_shapes_need_a_known_condition():
    then_g = helper.make_graph([helper.make_node("Identity", ["x"], ["t"])], "t", [],
                               [vi("t", F, None)])
    else_g = helper.make_graph([helper.make_node("ReduceSum", ["x"], ["e"])], "e", [],
                               [vi("e", F, None)])
    m = model([helper.make_node("ReduceMax", ["x"], ["mx"], keepdims=0),
               helper.make_node("Greater", ["mx", "zero"], ["c"]),
               helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g)],
              [vi("x", F, [2, 3])], [vi("y", F, None)], [const("zero", np.float32(0))])
    g = aidge_interop.load_onnx(m)
    with pytest.raises(NotImplementedError, match=r"If node .*output 0 is float32\(2, 3\) in "
                                                  r"then_branch and float32\(1, 1\) in else"):
        g.forward([np.ones((2, 3), np.float32)])


def test_if_bool_input_condition_is_read_when_planned():
    """A bool graph input as the condition is read when the graph is planned
    (as integer inputs a subgraph depends on): only that branch is planned,
    and a new value plans again."""
    then_g = helper.make_graph([helper.make_node("Identity", ["x"], ["t"])], "t", [],
                               [vi("t", F, None)])
    else_g = helper.make_graph([helper.make_node("ReduceSum", ["x"], ["e"])], "e", [],
                               [vi("e", F, None)])
    m = model([helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g)],
              [vi("x", F, [2, 3]), vi("c", B, [])], [vi("y", F, None)])
    x = R.standard_normal((2, 3)).astype(np.float32)
    for c in (True, False, True):
        got, ref = run_both(m, {"x": x, "c": np.array(c)})
        assert_same(got, ref)


def sequence_loop(new_axis=0, cond=True):
    """A loop that collects x * i per iteration in a sequence (the dynamo
    exporter's form), concatenated after the loop."""
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("Cast", ["i"], ["fi"], to=F),
         helper.make_node("Mul", ["x", "fi"], ["xi"]),
         helper.make_node("SequenceInsert", ["seq_in", "xi"], ["seq_out"])],
        "body", [vi("i", I, []), vi("cond_in", B, []),
                 helper.make_tensor_sequence_value_info("seq_in", F, None)],
        [vi("cond_out", B, []), helper.make_tensor_sequence_value_info("seq_out", F, None)])
    return model([helper.make_node("SequenceEmpty", [], ["s0"]),
                  helper.make_node("Loop", ["M", "c" if cond else "", "s0"], ["s"], body=body),
                  helper.make_node("ConcatFromSequence", ["s"], ["y"], axis=0,
                                   new_axis=new_axis)],
                 [vi("x", F, [2, 3]), vi("M", I, [])], [vi("y", F, None)],
                 [const("c", np.array(True))])


@pytest.mark.parametrize("new_axis", [0, 1])
def test_loop_collecting_a_sequence_runs_as_a_scan(new_axis):
    m = sequence_loop(new_axis)
    x = R.standard_normal((2, 3)).astype(np.float32)
    got, ref = run_both(m, {"x": x, "M": np.array(4, np.int64)})
    assert got[0].shape == ((8, 3) if new_axis == 0 else (4, 2, 3))
    assert_same(got, ref)


def test_other_sequence_use_is_refused_by_name():
    m = sequence_loop()
    m.graph.node[2].op_type = "SequenceAt"
    del m.graph.node[2].attribute[:]
    m.graph.node[2].input.append("M")
    with pytest.raises(NotImplementedError,
                       match=r"Loop node 'Loop_1': its trip count \('M'\) is computed by the "
                             r"graph; the engine runs sequences only with positions and splits "
                             r"known at import"):
        aidge_interop.load_onnx(m)


def test_an_operator_the_engine_lacks_is_named_with_what_to_try():
    """A sequence operator inside a loop body (where the import does not
    write sequences as tensors): the operator, its node, its opset and
    what the export could do instead."""
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("SequenceConstruct", ["x", "x"], ["pair"], name="pair_up"),
         helper.make_node("ConcatFromSequence", ["pair"], ["xx"], axis=0)],
        "body", [vi("i", I, []), vi("cond_in", B, [])], [vi("cond_out", B, []), vi("xx", F, None)])
    m = model([helper.make_node("Loop", ["M", "c"], ["y"], body=body)],
              [vi("x", F, [2, 3]), vi("M", I, [])], [vi("y", F, None)],
              [const("c", np.array(True))])
    with pytest.raises(NotImplementedError,
                       match=r"operator SequenceConstruct \(node 'pair_up', opset 20\) is not "
                             r"supported by the engine; a list of tensors kept as a list "
                             r"exports one; return a tuple"):
        aidge_interop.load_onnx(m)


def test_while_loop_whose_length_folds_when_planned():
    """No trip count; the condition i + 1 < rows(x) is known when the graph
    is planned (rows from x's shape), so the scan output's length is too."""
    body = helper.make_graph(
        [helper.make_node("Add", ["i", "one"], ["next"]),
         helper.make_node("Less", ["next", "rows"], ["cond_out"]),
         helper.make_node("Unsqueeze", ["i", "zero1"], ["start"]),
         helper.make_node("Unsqueeze", ["next", "zero1"], ["end"]),
         helper.make_node("Slice", ["x", "start", "end"], ["row"]),
         helper.make_node("Mul", ["row", "row"], ["sq"])],
        "body", [vi("i", I, []), vi("cond_in", B, [])], [vi("cond_out", B, []), vi("sq", F, None)],
        [const("one", np.array(1, np.int64)), const("zero1", np.array([0], np.int64))])
    m = model([helper.make_node("Shape", ["x"], ["shape"], end=1),
               helper.make_node("Squeeze", ["shape"], ["rows"]),
               helper.make_node("Loop", ["", "true"], ["squares"], body=body)],
              [vi("x", F, ["n", 3])], [vi("squares", F, None)], [const("true", np.array(True))])
    g = aidge_interop.load_onnx(m)
    for rows in (4, 1):
        x = R.standard_normal((rows, 3)).astype(np.float32)
        (got,) = g.forward([x])
        np.testing.assert_allclose(got, (x * x)[:, None, :], rtol=1e-6)


# ---------------------------------------------------------------- gradients


def _finite_differences(f, values, k, h=1e-6):
    flat = values[k].reshape(-1)
    numeric = np.zeros(flat.size)
    for i in range(flat.size):
        old = flat[i]
        flat[i] = old + h
        yp = f()
        flat[i] = old - h
        ym = f()
        flat[i] = old
        numeric[i] = (yp - ym) / (2 * h)
    return numeric.reshape(values[k].shape)


def test_loop_gradient_of_a_captured_parameter_and_carried_value():
    """Loop in float64 with a captured parameter w (an initializer read
    inside the body): d/dw, d/dacc0 and d/dx of sum(gy * outputs) against
    central finite differences."""
    body = helper.make_graph(
        [helper.make_node("Gather", ["x", "i"], ["xi"], axis=0),
         helper.make_node("Mul", ["acc_in", "w"], ["aw"]),
         helper.make_node("Tanh", ["aw"], ["t"]),
         helper.make_node("Add", ["t", "xi"], ["acc_out"]),
         helper.make_node("Mul", ["acc_out", "acc_out"], ["scan"]),
         helper.make_node("Identity", ["cond_in"], ["cond_out"])],
        "body", [vi("i", I, []), vi("cond_in", B, []), vi("acc_in", D, None)],
        [vi("cond_out", B, []), vi("acc_out", D, None), vi("scan", D, None)])
    m = model([helper.make_node("Loop", ["M", "true", "acc0"], ["acc", "stack"], body=body)],
              [vi("x", D, [4, 3]), vi("acc0", D, [3])], [vi("acc", D, None), vi("stack", D, None)],
              [const("M", np.array(4, np.int64)), const("true", np.array(True)),
               const("w", R.uniform(0.5, 1.5, 3))])
    g = aidge_interop.load_onnx(m)
    x, acc0 = R.standard_normal((4, 3)), R.standard_normal(3)
    ref = ReferenceEvaluator(m).run(None, {"x": x, "acc0": acc0})
    outs = g.forward([x, acc0], need_backward=True, input_grads=True)
    assert_same(outs, ref)
    gys = [R.standard_normal(o.shape) for o in outs]
    g.zero_grad()
    dx, dacc0 = g.backward(gys)
    dw = g.grads()["w"].copy()
    values = [x, acc0, g.parameters()["w"].copy()]

    def loss():
        run = ReferenceEvaluator(_with_w(m, values[2]))
        return sum(np.sum(gy * o) for gy, o in
                   zip(gys, run.run(None, {"x": values[0], "acc0": values[1]})))

    for k, analytic in enumerate([dx, dacc0, dw]):
        np.testing.assert_allclose(analytic, _finite_differences(loss, values, k),
                                   rtol=1e-5, atol=1e-7, err_msg=f"input {k}")


def test_nested_loops_forward_and_gradient():
    """A Loop in a Loop's body: the inner body reads the outer body's row
    (a capture of a capture) and the parameter w; the outer scan output is
    each row's tanh-recurrence. Against the reference, and w's and x's
    gradients against central finite differences (float64)."""
    inner = helper.make_graph(
        [helper.make_node("Gather", ["row", "j"], ["xj"], axis=0),
         helper.make_node("Gather", ["w", "j"], ["wj"], axis=0),
         helper.make_node("Mul", ["h_in", "wj"], ["hw"]),
         helper.make_node("Add", ["hw", "xj"], ["pre"]),
         helper.make_node("Tanh", ["pre"], ["h_out"]),
         helper.make_node("Identity", ["c_in"], ["c_out"])],
        "inner", [vi("j", I, []), vi("c_in", B, []), vi("h_in", D, [])],
        [vi("c_out", B, []), vi("h_out", D, [])])
    outer = helper.make_graph(
        [helper.make_node("Gather", ["x", "i"], ["row"], axis=0),
         helper.make_node("Loop", ["cols", "true", "h0"], ["h"], body=inner),
         helper.make_node("Identity", ["cond_in"], ["cond_out"])],
        "outer", [vi("i", I, []), vi("cond_in", B, [])], [vi("cond_out", B, []), vi("h", D, [])])
    m = model([helper.make_node("Loop", ["rows", "true"], ["hs"], body=outer)],
              [vi("x", D, [3, 4])], [vi("hs", D, None)],
              [const("rows", np.array(3, np.int64)), const("cols", np.array(4, np.int64)),
               const("true", np.array(True)), const("h0", np.array(0.1)),
               const("w", R.uniform(0.5, 1.5, 4))])
    g = aidge_interop.load_onnx(m)
    x = R.standard_normal((3, 4))
    (hs,) = g.forward([x], need_backward=True, input_grads=True)
    (want,) = ReferenceEvaluator(m).run(None, {"x": x})
    np.testing.assert_allclose(hs, want.reshape(hs.shape), rtol=1e-12)
    gy = R.standard_normal(hs.shape)
    g.zero_grad()
    (dx,) = g.backward([gy])
    values = [x, g.parameters()["w"].copy()]

    def loss():
        (y,) = ReferenceEvaluator(_with_w(m, values[1])).run(None, {"x": values[0]})
        return np.sum(gy * y.reshape(gy.shape))

    for k, analytic in enumerate([dx, g.grads()["w"]]):
        np.testing.assert_allclose(analytic, _finite_differences(loss, values, k),
                                   rtol=1e-5, atol=1e-8, err_msg=f"input {k}")


def _with_w(m, w):
    out = type(m)()
    out.CopyFrom(m)
    for init in out.graph.initializer:
        if init.name == "w":
            init.CopyFrom(const("w", w))
    return out


def test_if_gradient_through_the_branch_taken():
    m = if_model(nested=True)
    g = aidge_interop.load_onnx(m)
    for x in (np.abs(R.standard_normal((2, 3))), -np.abs(R.standard_normal((2, 3))),
              -np.abs(R.standard_normal((2, 3))) + [[0, 0, 2.0], [0, 0, 0]]):
        (y,) = g.forward([x], need_backward=True, input_grads=True)
        gy = R.standard_normal(y.shape)
        g.zero_grad()
        (dx,) = g.backward([gy])
        dw = g.grads()["w"].copy()
        ref = ReferenceEvaluator(m)
        values = [x.copy()]
        np.testing.assert_allclose(
            dx, _finite_differences(lambda: np.sum(gy * ref.run(None, {"x": values[0]})[0]),
                                    values, 0), rtol=1e-5, atol=1e-7)
        wv = [g.parameters()["w"].copy()]
        np.testing.assert_allclose(
            dw, _finite_differences(
                lambda: np.sum(gy * ReferenceEvaluator(_with_w(m, wv[0])).run(
                    None, {"x": x})[0]), wv, 0), rtol=1e-5, atol=1e-7)


# ---------------------------------------------------------------- nn.EmbeddingBag


def _bags(n_ids, offsets, seed, num=20):
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, num, (n_ids,), generator=gen), torch.tensor(offsets)


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
def test_embeddingbag_wrapped(mode, exporter):
    """The TorchScript export: a Loop with a scan output; the dynamo export:
    a while loop collecting a sequence, with an If per bag (empty or not)."""
    if exporter == "dynamo":
        pytest.importorskip("onnxscript")
    torch.manual_seed(0)
    bag = torch.nn.EmbeddingBag(20, 4, mode=mode)
    ids, offsets = _bags(10, [0, 3, 7], 0)
    engine = aidge_interop.wrap(bag, (ids, offsets), exporter=exporter)
    # eval, then other lengths and another number of bags through the same module
    for n_ids, offs, seed in ((10, [0, 3, 7], 0), (90, [0, 1, 30, 31, 60, 77, 80], 1),
                              (5, [0, 2], 2)):
        ids, offsets = _bags(n_ids, offs, seed)
        with torch.no_grad():
            torch.testing.assert_close(engine(ids, offsets), bag(ids, offsets),
                                       rtol=1e-6, atol=1e-6)
    # training: the weight's gradient flows out of the loop
    engine.train()
    bag.train()
    for n_ids, offs, seed in ((10, [0, 3, 7], 3), (40, [0, 11, 12, 25], 4)):
        ids, offsets = _bags(n_ids, offs, seed)
        gy = torch.randn(len(offs), 4)
        bag.zero_grad()
        engine.zero_grad()
        (bag(ids, offsets) * gy).sum().backward()
        (engine(ids, offsets) * gy).sum().backward()
        (w_engine,) = [p for p in engine.parameters()]
        torch.testing.assert_close(w_engine.grad, bag.weight.grad, rtol=1e-6, atol=1e-6)


def test_embeddingbag_per_sample_weights():
    torch.manual_seed(1)
    bag = torch.nn.EmbeddingBag(20, 4, mode="sum")
    ids, offsets = _bags(12, [0, 5, 6], 5)
    psw = torch.rand(12)
    engine = aidge_interop.wrap(bag, (ids, offsets, psw))
    with torch.no_grad():
        torch.testing.assert_close(engine(ids, offsets, psw), bag(ids, offsets, psw),
                                   rtol=1e-6, atol=1e-6)
    engine.train()
    psw_t, psw_e = psw.clone().requires_grad_(), psw.clone().requires_grad_()
    gy = torch.randn(3, 4)
    (bag(ids, offsets, psw_t) * gy).sum().backward()
    (engine(ids, offsets, psw_e) * gy).sum().backward()
    torch.testing.assert_close(psw_e.grad, psw_t.grad, rtol=1e-6, atol=1e-6)
    (w_engine,) = [p for p in engine.parameters()]
    torch.testing.assert_close(w_engine.grad, bag.weight.grad, rtol=1e-6, atol=1e-6)


def test_loop_training_through_dropout_is_refused():
    """Backward runs each iteration again: a Dropout in the body would draw
    another mask, so training through it is refused (eval runs)."""
    body = helper.make_graph(
        [helper.make_node("Dropout", ["acc_in", "ratio"], ["d"]),
         helper.make_node("Add", ["d", "acc_in"], ["acc_out"]),
         helper.make_node("Identity", ["cond_in"], ["cond_out"])],
        "body", [vi("i", I, []), vi("cond_in", B, []), vi("acc_in", F, None)],
        [vi("cond_out", B, []), vi("acc_out", F, None)],
        [const("ratio", np.float32(0.5))])
    m = model([helper.make_node("Loop", ["M", "", "x"], ["y"], body=body)],
              [vi("x", F, [3])], [vi("y", F, None)], [const("M", np.array(2, np.int64))])
    g = aidge_interop.load_onnx(m)
    x = np.ones(3, np.float32)
    np.testing.assert_allclose(g.forward([x], need_backward=True)[0], 4 * x)  # eval
    g.training = True
    with pytest.raises(NotImplementedError, match=r"Loop node .*Dropout or BatchNormalization"):
        g.forward([x], need_backward=True)


@pytest.mark.parametrize("mode", [
    "sum",
    pytest.param("mean", marks=pytest.mark.xfail(strict=True, raises=AssertionError, reason=(
        "the TorchScript export reduces an empty bag's empty slice: ReduceMean gives NaN "
        "(0 / 0) as ONNX defines it, torch gives 0; the engine computes the graph it is "
        "given"))),
    pytest.param("max", marks=pytest.mark.xfail(strict=True, raises=AssertionError, reason=(
        "the TorchScript export reduces an empty bag's empty slice: ReduceMax gives -inf "
        "as ONNX defines it, torch gives 0"))),
])
def test_embeddingbag_empty_bag(mode):
    torch.manual_seed(2)
    bag = torch.nn.EmbeddingBag(20, 4, mode=mode)
    ids, offsets = _bags(10, [0, 3, 7], 6)
    engine = aidge_interop.wrap(bag, (ids, offsets))
    offsets = torch.tensor([0, 3, 3, 7])  # bag 1 is empty
    with torch.no_grad():
        torch.testing.assert_close(engine(ids, offsets), bag(ids, offsets), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
def test_embeddingbag_empty_bag_dynamo(mode):
    """The dynamo export gives an empty bag zeros itself (an If), as torch."""
    pytest.importorskip("onnxscript")
    torch.manual_seed(2)
    bag = torch.nn.EmbeddingBag(20, 4, mode=mode)
    ids, offsets = _bags(10, [0, 3, 7], 6)
    engine = aidge_interop.wrap(bag, (ids, offsets), exporter="dynamo")
    offsets = torch.tensor([0, 3, 3, 7])  # bag 1 is empty
    with torch.no_grad():
        torch.testing.assert_close(engine(ids, offsets), bag(ids, offsets), rtol=1e-6, atol=1e-6)


# ---------------------------------------------------------------- Scan


def scan_body(dtype=F):
    """(h, x_t, y_t) -> (h' = tanh(h * w + x_t + sum(y_t)), [h'], [y_t * y_t]);
    w is an outer value (a capture)."""
    return helper.make_graph(
        [helper.make_node("Mul", ["h_in", "w"], ["hw"]),
         helper.make_node("Add", ["hw", "x_t"], ["a"]),
         helper.make_node("ReduceSum", ["y_t"], ["ys"], keepdims=1),
         helper.make_node("Add", ["a", "ys"], ["b"]),
         helper.make_node("Tanh", ["b"], ["h_out"]),
         helper.make_node("Identity", ["h_out"], ["hs"]),
         helper.make_node("Mul", ["y_t", "y_t"], ["y2"])],
        "body", [vi("h_in", dtype, [3]), vi("x_t", dtype, [3]), vi("y_t", dtype, [2])],
        [vi("h_out", dtype, [3]), vi("hs", dtype, [3]), vi("y2", dtype, [2])])


def scan_oracle(h, xs, ys, w, in_axes=(0, 0), in_dirs=(0, 0), out_axes=(0, 0),
                out_dirs=(0, 0)):
    """What Scan computes with scan_body, in numpy."""
    T = xs.shape[in_axes[0]]
    outs = []
    for t in range(T):
        x = np.take(xs, T - 1 - t if in_dirs[0] else t, axis=in_axes[0])
        y = np.take(ys, T - 1 - t if in_dirs[1] else t, axis=in_axes[1])
        h = np.tanh(h * w + x + y.sum())
        outs.append((h, y * y))
    stacked = []
    for k in range(2):
        seq = [o[k] for o in outs][::-1 if out_dirs[k] else 1]
        stacked.append(np.stack(seq, axis=out_axes[k]) if seq else
                       np.zeros((0, 3 if k == 0 else 2), h.dtype))
    return [h] + stacked


def scan_model(opset=16, dtype=F, T=4, in_axes=(0, 0), in_dirs=(0, 0), out_axes=(0, 0),
               out_dirs=(0, 0)):
    attrs = {"num_scan_inputs": 2}
    if in_axes != (0, 0):
        attrs["scan_input_axes"] = list(in_axes)
    if in_dirs != (0, 0):
        attrs["scan_input_directions"] = list(in_dirs)
    if out_axes != (0, 0):
        attrs["scan_output_axes"] = list(out_axes)
    if out_dirs != (0, 0):
        attrs["scan_output_directions"] = list(out_dirs)
    xshape = [T, 3] if in_axes[0] == 0 else [3, T]
    yshape = [T, 2] if in_axes[1] == 0 else [2, T]
    node = helper.make_node("Scan", ["h0", "x", "y"], ["h", "hs", "y2"], body=scan_body(dtype),
                            **attrs)
    return model([node], [vi("h0", dtype, [3]), vi("x", dtype, xshape), vi("y", dtype, yshape)],
                 [vi("h", dtype, None), vi("hs", dtype, None), vi("y2", dtype, None)],
                 [const("w", R.uniform(0.5, 1.5, 3).astype(np.float32 if dtype == F
                                                           else np.float64))], opset=opset)


def scan_feeds(m, dtype=np.float32, seed=0):
    rng = np.random.default_rng(seed)
    return {i.name: rng.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim])
            .astype(dtype) for i in m.graph.input}


def _w(m):
    return numpy_helper.to_array(next(i for i in m.graph.initializer if i.name == "w"))


@pytest.mark.parametrize("opset", [9, 11, 16, 19, 21, 23, 25])
def test_scan_against_the_reference(opset):
    """Two scan inputs, a state, two scan outputs and a captured initializer,
    at every opset of Scan's current form, against onnx.reference."""
    m = scan_model(opset)
    got, ref = run_both(m, scan_feeds(m))
    assert_same(got, ref)


@pytest.mark.parametrize("in_axes,in_dirs,out_axes,out_dirs", [
    ((1, 0), (0, 0), (0, 0), (0, 0)), ((0, 0), (1, 0), (0, 0), (0, 1)),
    ((-1, 1), (1, 1), (1, -1), (1, 0)), ((0, 1), (0, 1), (-2, 1), (0, 0))],
    ids=["input_axis", "directions", "all", "negative_axes"])
def test_scan_axes_and_directions(in_axes, in_dirs, out_axes, out_dirs):
    """scan_input_axes, scan_input_directions, scan_output_axes and
    scan_output_directions (which onnx.reference does not implement) against
    numpy and ONNX Runtime."""
    import onnxruntime

    m = scan_model(16, in_axes=in_axes, in_dirs=in_dirs, out_axes=out_axes, out_dirs=out_dirs)
    feeds = scan_feeds(m)
    g = aidge_interop.load_onnx(m)
    got = g.forward([feeds[n] for n in g.input_names])
    norm = lambda a: a % 2  # noqa: E731  (all the tensors here have rank 2)
    expected = scan_oracle(feeds["h0"], feeds["x"], feeds["y"], _w(m),
                           tuple(map(norm, in_axes)), in_dirs, tuple(map(norm, out_axes)),
                           out_dirs)
    assert_same(got, [e.astype(np.float32) for e in expected])
    ort = onnxruntime.InferenceSession(m.SerializeToString()).run(None, feeds)
    assert_same(got, ort)


def scan8_model(lens_input=True):
    """Opset 8: batch axis 0, sequence axis 1, sequence_lens, directions."""
    node = helper.make_node("Scan", ["lens" if lens_input else "", "h0", "x", "y"],
                            ["h", "hs", "y2"], body=scan_body(D), num_scan_inputs=2,
                            directions=[0, 1])
    inputs = [vi("h0", D, [3, 3]), vi("x", D, [3, 5, 3]), vi("y", D, [3, 5, 2])]
    if lens_input:
        inputs.insert(0, vi("lens", I, [3]))
    return model([node], inputs, [vi("h", D, None), vi("hs", D, None), vi("y2", D, None)],
                 [const("w", R.uniform(0.5, 1.5, 3))], opset=8)


def scan8_oracle(lens, h0, x, y, w):
    outs = [np.zeros_like(h0), np.zeros(x.shape), np.zeros(y.shape)]
    for b, n in enumerate(lens):
        h, hs, y2 = scan_oracle(h0[b], x[b, :n], y[b, :n], w, in_dirs=(0, 1))
        outs[0][b], outs[1][b, :n], outs[2][b, :n] = h, hs, y2
    return outs


@pytest.mark.parametrize("lens", [None, [5, 5, 5], [5, 2, 1]], ids=str)
def test_scan_opset8_batches_and_sequence_lens(lens):
    """Against numpy and ONNX Runtime: each batch scanned to its length, the
    scan outputs zero after it."""
    import onnxruntime

    m = scan8_model(lens is not None)
    feeds = scan_feeds(m, np.float64)
    if lens is not None:
        feeds["lens"] = np.array(lens, np.int64)
    g = aidge_interop.load_onnx(m)
    got = g.forward([feeds[n] for n in g.input_names])
    expected = scan8_oracle(lens or [5, 5, 5], feeds["h0"], feeds["x"], feeds["y"], _w(m))
    assert_same(got, expected)
    assert_same(got, onnxruntime.InferenceSession(m.SerializeToString()).run(None, feeds))


def _scan_gradient_check(m, feeds):
    """Gradients of sum(gy * outputs) in every float input and in the
    captured parameter w against central finite differences of the
    engine's forward (float64)."""
    g = aidge_interop.load_onnx(m)
    names = g.input_names
    outs = g.forward([feeds[n] for n in names], need_backward=True, input_grads=True)
    gys = [R.standard_normal(o.shape) for o in outs]
    g.zero_grad()
    grads = g.backward(gys)
    dw = g.grads()["w"].copy()
    values = [feeds[n].copy() for n in names] + [_w(m).copy()]

    def loss():
        run = aidge_interop.load_onnx(_with_w(m, values[-1]))
        return sum(np.sum(gy * o) for gy, o in zip(gys, run.forward(values[:-1])))

    for k, name in enumerate(names + ["w"]):
        if values[k].dtype != np.float64:
            continue
        analytic = dw if name == "w" else grads[k]
        np.testing.assert_allclose(analytic, _finite_differences(loss, values, k),
                                   rtol=1e-6, atol=1e-8, err_msg=f"gradient of '{name}'")


@pytest.mark.parametrize("in_axes,in_dirs,out_axes,out_dirs", [
    ((0, 0), (0, 0), (0, 0), (0, 0)), ((1, 0), (1, 0), (1, 0), (0, 1))],
    ids=["plain", "axes_and_directions"])
def test_scan_gradient_finite_differences(in_axes, in_dirs, out_axes, out_dirs):
    m = scan_model(16, D, in_axes=in_axes, in_dirs=in_dirs, out_axes=out_axes,
                   out_dirs=out_dirs)
    _scan_gradient_check(m, scan_feeds(m, np.float64, seed=1))


def test_scan_opset8_gradient_finite_differences():
    m = scan8_model()
    feeds = scan_feeds(m, np.float64, seed=2)
    feeds["lens"] = np.array([5, 3, 1], np.int64)
    _scan_gradient_check(m, feeds)


def test_scan_inputs_of_different_lengths_are_refused():
    node = helper.make_node("Scan", ["h0", "x", "y"], ["h", "hs", "y2"], body=scan_body(),
                            num_scan_inputs=2, name="scan_me")
    m = model([node], [vi("h0", F, [3]), vi("x", F, [4, 3]), vi("y", F, [5, 2])],
              [vi("h", F, None), vi("hs", F, None), vi("y2", F, None)],
              [const("w", np.ones(3, np.float32))], opset=16)
    g = aidge_interop.load_onnx(m)
    with pytest.raises(ValueError, match="Scan node 'scan_me': scan input 1 has 5 steps"):
        g.forward([np.zeros((3,), np.float32), np.zeros((4, 3), np.float32),
                   np.zeros((5, 2), np.float32)])
