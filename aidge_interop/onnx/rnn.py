"""ONNX LSTM, GRU and RNN, unrolled over time into engine operators at import.

``expand_rnn(node, attrs, ...)`` writes one ONNX LSTM, GRU or RNN node as
the nodes of its equations, one time step after the other: a MatMul for
the input projection of all steps at once, then per step a MatMul with the
recurrent weights, the gates (Sigmoid, Tanh, Mul, Add) and the new state.
Forward, backward (through time) and SGD are then those of the engine's
operators, and the weights stay the graph values the exporter wrote (torch
reorders its gates with Slice and Concat on the parameters, whose
gradients flow back through them).

Supported: directions forward, reverse and bidirectional; layout 0 and 1;
initial_h and initial_c given or absent (zeros); GRU's
linear_before_reset 0 and 1; the default activations. Refused with the
node named: sequence_lens, peepholes (P), clip, input_forget, other
activations, and a sequence length unknown at import (the graph is
unrolled for it; the batch may stay dynamic).

The equations (ONNX's operator documentation; W, R, B are one direction's):
  RNN   H = tanh(X_t W^T + H R^T + Wb + Rb)
  LSTM  gates = X_t W^T + H R^T + Wb + Rb, split i, o, f, c
        C = sigmoid(f) C + sigmoid(i) tanh(c);  H = sigmoid(o) tanh(C)
  GRU   z, r, h parts of X_t W^T + Wb and of H R^T + Rb
        z = sigmoid(xz + hz);  r = sigmoid(xr + hr)
        linear_before_reset 1: n = tanh(xh + r (H Rh^T + Rbh))
        linear_before_reset 0: n = tanh(xh + (r H) Rh^T + Rbh)
        H = (1 - z) n + z H
"""
from __future__ import annotations

from .expand import Emitter

_DEFAULT_ACTIVATIONS = {"LSTM": ["Sigmoid", "Tanh", "Tanh"], "GRU": ["Sigmoid", "Tanh"],
                        "RNN": ["Tanh"]}
_GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}


def _check(node, attrs, inputs, where):
    op = node.op_type
    def refuse(what):
        raise NotImplementedError(f"{where}: {what}; the engine's {op} (unrolled at import) "
                                  "supports the default activations without clip, "
                                  "sequence_lens or peepholes")
    acts = attrs.get("activations")
    if acts is not None:
        n_dirs = 2 if attrs.get("direction", "forward") == "bidirectional" else 1
        names = acts.split(",") if isinstance(acts, str) else list(acts)
        if [a.lower() for a in names] != [a.lower() for a in _DEFAULT_ACTIVATIONS[op]] * n_dirs:
            refuse(f"activations {names}")
    if "clip" in attrs:
        refuse(f"clip = {attrs['clip']}")
    if attrs.get("input_forget", 0):
        refuse("input_forget = 1")
    if len(inputs) > 4 and inputs[4]:
        refuse(f"sequence_lens ('{inputs[4]}') given")
    if op == "LSTM" and len(inputs) > 7 and inputs[7]:
        refuse(f"peepholes (P, '{inputs[7]}') given")
    if attrs.get("direction", "forward") not in ("forward", "reverse", "bidirectional"):
        raise ValueError(f"{where}: direction '{attrs['direction']}' is not forward, reverse "
                         "or bidirectional")
    if attrs.get("layout", 0) not in (0, 1):
        raise ValueError(f"{where}: layout {attrs['layout']} is not 0 or 1")


def expand_rnn(node, attrs, seq_len, hidden_size, emit_node, emit_const, where):
    """Writes LSTM, GRU or RNN `node` through emit_node(name, op_type, inputs,
    outputs, attrs) and emit_const(name, Tensor). ``seq_len``: the number of
    time steps (int), ``hidden_size``: H."""
    op = node.op_type
    inputs = list(node.input) + [""] * (8 - len(node.input))
    outputs = list(node.output)
    _check(node, attrs, list(node.input), where)
    direction = attrs.get("direction", "forward")
    layout = attrs.get("layout", 0)
    lbr = attrs.get("linear_before_reset", 0)
    n_dirs = 2 if direction == "bidirectional" else 1
    H, G, T = hidden_size, _GATES[op], seq_len
    e = Emitter(node.name or f"{op}_{outputs[0]}", emit_node, emit_const)

    X = inputs[0]
    if layout == 1:  # (batch, seq, input) -> (seq, batch, input); states (batch, dirs, H)
        X = e.op("Transpose", [X], perm=[1, 0, 2])
        for k in (5, 6):
            if inputs[k]:
                inputs[k] = e.op("Transpose", [inputs[k]], perm=[1, 0, 2])

    def direction_part(name, d):
        """Direction d of a (n_dirs, ...) input, without that axis."""
        part = e.slice(name, d, d + 1, 0) if n_dirs > 1 else name
        return e.op("Squeeze", [part, e.const([0])])

    ys, hs, cs = [], [], []
    for d in range(n_dirs):
        reverse = direction == "reverse" or d == 1
        Wt = e.op("Transpose", [direction_part(inputs[1], d)], perm=[1, 0])  # (I, G H)
        Rt = e.op("Transpose", [direction_part(inputs[2], d)], perm=[1, 0])  # (H, G H)
        Wb = Rb = None
        if inputs[3]:
            Wb, Rb = e.split(direction_part(inputs[3], d), [G * H, G * H], 0)
        h = e.slice(inputs[5], d, d + 1, 0) if inputs[5] else None  # (1, batch, H)
        c = e.slice(inputs[6], d, d + 1, 0) if op == "LSTM" and inputs[6] else None
        xw = e.op("MatMul", [X, Wt])  # (T, batch, G H): every step's input projection
        # the length the graph is unrolled for, checked at run time: another
        # one fails here, naming this node, instead of dropping steps
        xw = e.op("Reshape", [xw, e.const([T, 0, G * H])],
                  node_name=f"{e.prefix}/sequence_length_must_be_{T}")
        if op != "GRU" and Wb is not None:
            xw = e.op("Add", [xw, e.op("Add", [Wb, Rb])])
        elif op == "GRU" and Wb is not None:
            xw = e.op("Add", [xw, Wb])
        if op == "GRU":
            Rzr, Rh = e.split(Rt, [2 * H, H], 1)
            Rbzr, Rbh = e.split(Rb, [2 * H, H], 0) if Rb is not None else (None, None)
        steps = {}
        for t in (range(T - 1, -1, -1) if reverse else range(T)):
            x_t = e.slice(xw, t, t + 1, 0)  # (1, batch, G H)
            if op == "RNN":
                h = e.op("Tanh", [x_t if h is None else e.op("Add", [x_t, e.op("MatMul", [h, Rt])])])
            elif op == "LSTM":
                g = x_t if h is None else e.op("Add", [x_t, e.op("MatMul", [h, Rt])])
                gi, go, gf, gc = e.split(g, [H] * 4, 2)
                i, o = e.op("Sigmoid", [gi]), e.op("Sigmoid", [go])
                new_c = e.op("Mul", [i, e.op("Tanh", [gc])])
                if c is not None:
                    new_c = e.op("Add", [e.op("Mul", [e.op("Sigmoid", [gf]), c]), new_c])
                c = new_c
                h = e.op("Mul", [o, e.op("Tanh", [c])])
            else:
                xz, xr, xh = e.split(x_t, [H] * 3, 2)
                if h is None:  # a zero state: the recurrent products vanish
                    hz, hr = e.split(Rbzr, [H, H], 0) if Rbzr is not None else (None, None)
                else:
                    hzr = e.op("MatMul", [h, Rzr])
                    if Rbzr is not None:
                        hzr = e.op("Add", [hzr, Rbzr])
                    hz, hr = e.split(hzr, [H, H], 2)
                z = e.op("Sigmoid", [xz if hz is None else e.op("Add", [xz, hz])])
                r = e.op("Sigmoid", [xr if hr is None else e.op("Add", [xr, hr])])
                if h is None:
                    rec = None if Rbh is None else (e.op("Mul", [r, Rbh]) if lbr else Rbh)
                elif lbr:
                    hh = e.op("MatMul", [h, Rh])
                    if Rbh is not None:
                        hh = e.op("Add", [hh, Rbh])
                    rec = e.op("Mul", [r, hh])
                else:
                    rec = e.op("MatMul", [e.op("Mul", [r, h]), Rh])
                    if Rbh is not None:
                        rec = e.op("Add", [rec, Rbh])
                n = e.op("Tanh", [xh if rec is None else e.op("Add", [xh, rec])])
                # H = (1 - z) n + z H, as torch rounds it: n + z (H - n)
                if h is None:
                    h = e.op("Sub", [n, e.op("Mul", [z, n])])
                else:
                    h = e.op("Add", [n, e.op("Mul", [z, e.op("Sub", [h, n])])])
            steps[t] = h
        ys.append(e.concat([steps[t] for t in range(T)], 0))  # (T, batch, H)
        hs.append(h)
        cs.append(c)

    def done(value, name):
        emit_node(e.name("Identity_node"), "Identity", [value], [name], {})

    # Y (T, n_dirs, batch, H); Y_h, Y_c (n_dirs, batch, H); layout 1:
    # (batch, T, n_dirs, H) and (batch, n_dirs, H)
    if len(outputs) > 0 and outputs[0]:
        y = e.concat([e.op("Unsqueeze", [v, e.const([1])]) for v in ys], 1)
        done(e.op("Transpose", [y], perm=[2, 0, 1, 3]) if layout == 1 else y, outputs[0])
    for k, states in ((1, hs), (2, cs)):
        if len(outputs) > k and outputs[k]:
            s = e.concat(states, 0)
            done(e.op("Transpose", [s], perm=[1, 0, 2]) if layout == 1 else s, outputs[k])
