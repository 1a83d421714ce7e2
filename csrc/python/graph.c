/*
 * graph.c — the Graph type of aidge_interop._C: the engine's graph as
 * Python sees it (built by load_onnx).
 *
 * Building (inputs, initializers, nodes with their attributes), running
 * (forward and backward: one C call each, the GIL released; an optional
 * bridge takes foreign tensors in and gives results back as DLPack
 * capsules), reading values and gradients without a copy, the recipes of
 * recipes.c by name, and the flags of a run. One call at a time per graph.
 */
#define NO_IMPORT_ARRAY
#include "bindings.h"

#include <stdatomic.h>
#include <string.h>

#include "graph.h"

typedef struct {
    PyObject_HEAD
    ai_graph *g;
    PyTypeObject *tensor_type; /* strong reference */
    atomic_int busy;           /* one call at a time on a graph */
    unsigned long forward_thread; /* the thread of the latest forward (its state is kept) */
} GraphObject;

static int graph_enter(GraphObject *self)
{
    int expected = 0;
    if (!atomic_compare_exchange_strong(&self->busy, &expected, 1)) {
        PyErr_SetString(PyExc_RuntimeError,
                        "this graph is being used by another thread; a graph runs one "
                        "call at a time (use one graph per thread)");
        return -1;
    }
    return 0;
}

static void graph_leave(GraphObject *self) { atomic_store(&self->busy, 0); }

static PyObject *Graph_new(PyTypeObject *tp, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, ":Graph", kwlist))
        return NULL;
    PyObject *m = PyType_GetModuleByDef(tp, &aidge_module);
    if (!m)
        return NULL;
    GraphObject *self = (GraphObject *)tp->tp_alloc(tp, 0);
    if (!self)
        return NULL;
    module_state *st = PyModule_GetState(m);
    self->tensor_type = (PyTypeObject *)Py_NewRef(st->tensor_type);
    atomic_init(&self->busy, 0);
    ai_status s = ai_graph_new(&self->g);
    if (s) {
        Py_DECREF(self);
        return raise_status(s);
    }
    return (PyObject *)self;
}

static int Graph_traverse(GraphObject *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(self->tensor_type);
    return 0;
}

static void Graph_dealloc(GraphObject *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    ai_graph_free(self->g);
    Py_CLEAR(self->tensor_type);
    tp->tp_free((PyObject *)self);
    Py_DECREF(tp);
}

static int is_tensor(GraphObject *self, PyObject *o)
{
    return PyObject_TypeCheck(o, self->tensor_type);
}

/* A Python sequence of str -> C array of borrowed UTF-8 pointers. */
static int str_list(PyObject *seq_obj, const char *what, PyObject **keep, const char **out,
                    int *n)
{
    PyObject *seq = PySequence_Fast(seq_obj, what);
    if (!seq)
        return -1;
    Py_ssize_t len = PySequence_Fast_GET_SIZE(seq);
    if (len > AI_MAX_IO) {
        Py_DECREF(seq);
        PyErr_Format(PyExc_ValueError, "%s: %zd names; at most %d", what, len, AI_MAX_IO);
        return -1;
    }
    for (Py_ssize_t i = 0; i < len; i++) {
        PyObject *o = PySequence_Fast_GET_ITEM(seq, i);
        if (!PyUnicode_Check(o) || !(out[i] = PyUnicode_AsUTF8(o))) {
            Py_DECREF(seq);
            if (!PyErr_Occurred())
                PyErr_Format(PyExc_TypeError, "%s must hold str, not %.100s", what,
                             Py_TYPE(o)->tp_name);
            return -1;
        }
    }
    *keep = seq;
    *n = (int)len;
    return 0;
}

static PyObject *Graph_add_input(GraphObject *self, PyObject *args)
{
    const char *name;
    ai_dtype dt;
    PyObject *dims = Py_None;
    if (!PyArg_ParseTuple(args, "sO&|O:add_input", &name, dtype_converter, &dt, &dims))
        return NULL;
    ai_status st = ai_graph_add_input(self->g, name, dt);
    if (st)
        return raise_status(st);
    if (dims == Py_None)
        return Py_NewRef(Py_None);
    /* the declared dims: ints, None for a free one */
    PyObject *seq = PySequence_Fast(dims, "add_input: dims must be a sequence");
    if (!seq)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    int64_t d[AI_MAX_DIMS];
    for (Py_ssize_t i = 0; i < n && i < AI_MAX_DIMS; i++) {
        PyObject *o = PySequence_Fast_GET_ITEM(seq, i);
        d[i] = o == Py_None ? -1 : PyLong_AsLongLong(o);
        if (d[i] == -1 && PyErr_Occurred()) {
            Py_DECREF(seq);
            return NULL;
        }
    }
    Py_DECREF(seq);
    if (n > AI_MAX_DIMS)
        return PyErr_Format(PyExc_ValueError, "graph input '%s': %zd dims, at most %d", name,
                            n, AI_MAX_DIMS);
    st = ai_graph_set_input_dims(self->g, name, (int)n, d);
    return st ? raise_status(st) : Py_NewRef(Py_None);
}

static PyObject *Graph_share_grad(GraphObject *self, PyObject *args)
{
    const char *name;
    PyObject *t;
    if (!PyArg_ParseTuple(args, "sO:share_grad", &name, &t))
        return NULL;
    if (!is_tensor(self, t))
        return PyErr_Format(PyExc_TypeError, "share_grad: the gradient of '%s' must be a "
                            "Tensor", name);
    ai_status st = ai_graph_share_grad(self->g, name, ((TensorObject *)t)->t);
    return st ? raise_status(st) : Py_NewRef(Py_None);
}

static PyObject *Graph_add_initializer(GraphObject *self, PyObject *args)
{
    const char *name, *kind_s;
    PyObject *t;
    int share = 0;
    if (!PyArg_ParseTuple(args, "sOs|p:add_initializer", &name, &t, &kind_s, &share))
        return NULL;
    if (!is_tensor(self, t))
        return PyErr_Format(PyExc_TypeError, "initializer '%s' must be a Tensor", name);
    ai_value_kind kind;
    if (!strcmp(kind_s, "param"))
        kind = AI_VAL_PARAM;
    else if (!strcmp(kind_s, "buffer"))
        kind = AI_VAL_BUFFER;
    else if (!strcmp(kind_s, "const"))
        kind = AI_VAL_CONST;
    else
        return PyErr_Format(PyExc_ValueError,
                            "initializer '%s': kind must be 'param', 'buffer' or 'const', "
                            "not '%s'", name, kind_s);
    const ai_tensor *src = ((TensorObject *)t)->t;
    if (share && (!ai_tensor_is_contiguous(src) || (src->flags & AI_TENSOR_READONLY)))
        return PyErr_Format(PyExc_ValueError, "initializer '%s': share=True needs a "
                            "contiguous, writable tensor (the graph would copy it)", name);
    ai_tensor *c;
    /* the graph owns its copy, or shares the tensor's storage (refcounted) */
    ai_status st = share ? ai_tensor_share(&c, src) : clone_maybe_nogil(&c, src);
    if (st == AI_OK)
        st = ai_graph_add_initializer(self->g, name, kind, c);
    return st ? raise_status(st) : Py_NewRef(Py_None);
}

static void attrs_free(ai_attr *attrs, int n)
{
    for (int i = 0; i < n; i++) {
        PyMem_Free(attrs[i].ints);
        PyMem_Free(attrs[i].floats);
    }
    PyMem_Free(attrs);
}

/* {name: int | float | str | bytes | [int] | [float] | Tensor | Graph} -> ai_attr[] */
static int attrs_from_dict(GraphObject *self, PyObject *dict, const char *node, ai_attr **out,
                           int *n_out)
{
    Py_ssize_t n = PyDict_Size(dict), pos = 0;
    ai_attr *attrs = PyMem_Calloc((size_t)n + 1, sizeof *attrs);
    if (!attrs) {
        PyErr_NoMemory();
        return -1;
    }
    PyObject *key, *val;
    int i = 0;
    while (PyDict_Next(dict, &pos, &key, &val)) {
        ai_attr *a = &attrs[i++];
        if (!PyUnicode_Check(key) || !(a->name = (char *)PyUnicode_AsUTF8(key)))
            goto bad;
        if (PyBool_Check(val) || PyLong_Check(val)) {
            a->type = AI_ATTR_INT;
            a->i = PyLong_AsLongLong(val);
            if (a->i == -1 && PyErr_Occurred())
                goto fail;
        } else if (PyFloat_Check(val)) {
            a->type = AI_ATTR_FLOAT;
            a->f = PyFloat_AsDouble(val);
        } else if (PyUnicode_Check(val)) {
            a->type = AI_ATTR_STRING;
            if (!(a->s = (char *)PyUnicode_AsUTF8(val)))
                goto fail;
        } else if (PyBytes_Check(val)) {
            a->type = AI_ATTR_STRING;
            a->s = PyBytes_AsString(val);
        } else if (is_tensor(self, val)) {
            a->type = AI_ATTR_TENSOR;
            a->t = ((TensorObject *)val)->t;
        } else if (PyObject_TypeCheck(val, Py_TYPE(self))) {
            /* a subgraph (Loop's body, If's branches): the node shares it */
            ai_graph *sub = ((GraphObject *)val)->g;
            if (sub == self->g || sub->refs > 0) {
                PyErr_Format(PyExc_ValueError, "node '%s': attribute %R is %s; a subgraph "
                             "belongs to one node", node, key,
                             sub == self->g ? "the graph itself" : "another node's subgraph");
                goto fail;
            }
            a->type = AI_ATTR_GRAPH;
            a->graph = sub;
        } else if (PyList_Check(val) || PyTuple_Check(val)) {
            Py_ssize_t len = PySequence_Size(val);
            bool all_int = true;
            for (Py_ssize_t k = 0; k < len; k++) {
                PyObject *e = PySequence_Fast_GET_ITEM(val, k);
                if (!PyLong_Check(e) && !PyFloat_Check(e))
                    goto bad;
                all_int &= PyLong_Check(e);
            }
            a->n = len;
            if (all_int) {
                a->type = AI_ATTR_INTS;
                if (!(a->ints = PyMem_Calloc((size_t)len + 1, sizeof(int64_t))))
                    goto nomem;
                for (Py_ssize_t k = 0; k < len; k++) {
                    a->ints[k] = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(val, k));
                    if (a->ints[k] == -1 && PyErr_Occurred())
                        goto fail;
                }
            } else {
                a->type = AI_ATTR_FLOATS;
                if (!(a->floats = PyMem_Calloc((size_t)len + 1, sizeof(double))))
                    goto nomem;
                for (Py_ssize_t k = 0; k < len; k++)
                    a->floats[k] = PyFloat_AsDouble(PySequence_Fast_GET_ITEM(val, k));
            }
        } else {
            goto bad;
        }
    }
    *out = attrs;
    *n_out = i;
    return 0;
bad:
    PyErr_Format(PyExc_TypeError,
                 "node '%s': attribute %R has an unsupported value %.200R (int, float, str, "
                 "list of int or float, Tensor, or Graph)", node, key, val);
    goto fail;
nomem:
    PyErr_NoMemory();
fail:
    attrs_free(attrs, i);
    return -1;
}

static PyObject *Graph_add_node(GraphObject *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"name", "op_type", "inputs", "outputs", "attrs", "domain",
                             "opset", NULL};
    const char *name, *op_type, *domain = "";
    PyObject *ins, *outs, *attrs_d = NULL, *keep_in = NULL, *keep_out = NULL;
    int opset = 17;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "ssOO|O!si:add_node", kwlist, &name, &op_type,
                                     &ins, &outs, &PyDict_Type, &attrs_d, &domain, &opset))
        return NULL;
    const char *in_names[AI_MAX_IO], *out_names[AI_MAX_IO];
    int n_in, n_out, n_attrs = 0;
    ai_attr *attrs = NULL;
    if (str_list(ins, "inputs", &keep_in, in_names, &n_in) < 0)
        return NULL;
    if (str_list(outs, "outputs", &keep_out, out_names, &n_out) < 0 ||
        (attrs_d && attrs_from_dict(self, attrs_d, name, &attrs, &n_attrs) < 0)) {
        Py_XDECREF(keep_in);
        Py_XDECREF(keep_out);
        return NULL;
    }
    ai_status st = ai_graph_add_node(self->g, name, domain, op_type, opset, n_in, in_names,
                                     n_out, out_names, n_attrs, attrs);
    attrs_free(attrs, n_attrs);
    Py_DECREF(keep_in);
    Py_DECREF(keep_out);
    return st ? raise_status(st) : Py_NewRef(Py_None);
}

static PyObject *Graph_set_outputs(GraphObject *self, PyObject *arg)
{
    PyObject *keep;
    const char *names[AI_MAX_IO];
    int n;
    if (str_list(arg, "outputs", &keep, names, &n) < 0)
        return NULL;
    ai_status st = ai_graph_set_outputs(self->g, n, names);
    Py_DECREF(keep);
    return st ? raise_status(st) : Py_NewRef(Py_None);
}

static PyObject *Graph_finalize(GraphObject *self, PyObject *unused)
{
    (void)unused;
    ai_status st = ai_graph_finalize(self->g);
    return st ? raise_status(st) : Py_NewRef(Py_None);
}

/* The optional bridge of forward and backward: (to_capsule, from_capsule),
 * two callables between foreign tensors and DLPack capsules (torch's
 * _to_dlpack and _from_dlpack). Arguments that are not Tensors are viewed
 * through to_capsule without a Tensor object, results come back through
 * from_capsule: the per-call cost of a wrapped module. */
typedef struct {
    PyObject *to_capsule, *from_capsule;
} bridge;

static int parse_bridge(PyObject *const *args, Py_ssize_t nargs, const char *what,
                        bridge *b)
{
    b->to_capsule = b->from_capsule = NULL;
    if (nargs < 1 || nargs > 2)
        return fail_format(PyExc_TypeError, "%s() takes 1 or 2 arguments (%zd given)", what,
                           nargs);
    if (nargs == 2 && args[1] != Py_None) {
        PyObject *p = args[1];
        if (!PyTuple_Check(p) || PyTuple_GET_SIZE(p) != 2 ||
            !PyCallable_Check(PyTuple_GET_ITEM(p, 0)) ||
            !PyCallable_Check(PyTuple_GET_ITEM(p, 1)))
            return fail_format(PyExc_TypeError,
                               "%s(): argument 'bridge' must be a tuple of two callables "
                               "(to_capsule, from_capsule)", what);
        b->to_capsule = PyTuple_GET_ITEM(p, 0);
        b->from_capsule = PyTuple_GET_ITEM(p, 1);
    }
    return 0;
}

/* A list of Tensors (or None where allowed) -> borrowed ai_tensor pointers;
 * with a bridge, views of foreign tensors land in owned[] (freed by the
 * caller). 0, -1 with an exception, or 1 (no exception) when a foreign
 * tensor does not go through the bridge: the caller takes its slow path. */
static int tensor_args(GraphObject *self, PyObject *seq_obj, const char *what, int expected,
                       bool allow_none, const bridge *b, PyObject **keep,
                       const ai_tensor **out, ai_tensor **owned)
{
    PyObject *seq = PySequence_Fast(seq_obj, what);
    if (!seq)
        return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (n != expected) {
        Py_DECREF(seq);
        PyErr_Format(PyExc_ValueError, "%s: expected %d tensors, got %zd", what, expected, n);
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *o = PySequence_Fast_GET_ITEM(seq, i);
        if (o == Py_None && allow_none) {
            out[i] = NULL;
        } else if (is_tensor(self, o)) {
            out[i] = ((TensorObject *)o)->t;
        } else if (b->to_capsule) {
            PyObject *cap = PyObject_CallOneArg(b->to_capsule, o);
            int bad = !cap || capsule_view(cap, 0, &owned[i]) < 0;
            Py_XDECREF(cap);
            if (bad) { /* a device, layout or type the slow path handles or names */
                PyErr_Clear();
                Py_DECREF(seq);
                return 1;
            }
            out[i] = owned[i];
        } else {
            Py_DECREF(seq);
            PyErr_Format(PyExc_TypeError, "%s[%zd] must be a Tensor%s, not %.100s", what, i,
                         allow_none ? " or None" : "", Py_TYPE(o)->tp_name);
            return -1;
        }
    }
    *keep = seq;
    return 0;
}

/* Whether result_capsule exports `t` as it is: a writable tensor without
 * negative strides (tensor_capsule copies or refuses the others). */
static bool result_exportable(const ai_tensor *t)
{
    return !(t->flags & AI_TENSOR_READONLY) && !negative_strides(t);
}

/* The results as Tensors, or through the bridge's from_capsule; a result
 * that is an argument as it is, as the caller's object (same[i]). */
static PyObject *tensor_list(GraphObject *self, ai_tensor **ts, int n, const bridge *b,
                             PyObject *const *same)
{
    PyObject *list = PyList_New(n);
    for (int i = 0; list && i < n; i++) {
        PyObject *o;
        if (same[i]) {
            o = Py_NewRef(same[i]);
        } else if (ts[i] && b->from_capsule && result_exportable(ts[i])) {
            PyObject *cap = result_capsule(ts[i]);
            ts[i] = NULL;
            o = cap ? PyObject_CallOneArg(b->from_capsule, cap) : NULL;
            Py_XDECREF(cap);
        } else if (ts[i]) {
            o = tensor_wrap(self->tensor_type, ts[i]);
            ts[i] = NULL;
            if (o && b->from_capsule) {
                PyObject *cap = tensor_capsule((TensorObject *)o, 0, Py_None);
                Py_SETREF(o, cap ? PyObject_CallOneArg(b->from_capsule, cap) : NULL);
                Py_XDECREF(cap);
            }
        } else {
            o = Py_NewRef(Py_None);
        }
        if (!o) {
            Py_CLEAR(list);
            break;
        }
        PyList_SET_ITEM(list, i, o);
    }
    for (int i = 0; i < n; i++)
        ai_tensor_free(ts[i]);
    return list;
}

/* forward and backward: tensors in, new tensors out, one C call without the GIL */
typedef ai_status (*graph_call)(ai_graph *, int, const ai_tensor *const *, int, ai_tensor **);

static PyObject *graph_run(GraphObject *self, PyObject *arg, const bridge *b, const char *what,
                           int n_args, bool allow_none, int n_results, graph_call call)
{
    const ai_tensor *args[AI_MAX_IO * 4];
    ai_tensor *owned[AI_MAX_IO * 4] = {0};
    ai_tensor *results[AI_MAX_IO * 4] = {0};
    PyObject *keep = NULL, *res = NULL;
    if (!self->g->finalized)
        return PyErr_Format(PyExc_ValueError, "finalize() the graph first");
    if (n_args > AI_MAX_IO * 4 || n_results > AI_MAX_IO * 4)
        return PyErr_Format(PyExc_ValueError, "too many graph inputs or outputs");
    int r = tensor_args(self, arg, what, n_args, allow_none, b, &keep, args, owned);
    if (r == 0 && graph_enter(self) == 0) {
        ai_status st;
        Py_BEGIN_ALLOW_THREADS
        st = call(self->g, n_args, args, n_results, results);
        Py_END_ALLOW_THREADS
        graph_leave(self);
        /* A result that is an argument's tensor (backward's gradient of an
         * input that is an output's gradient unchanged, plan.c: "gradients
         * that are dy") comes back as the caller's object, as torch's
         * autograd hands one gradient to both inputs of an addition: two
         * tensors over one memory would let torch take both as .grad. */
        PyObject *same[AI_MAX_IO * 4] = {0};
        for (int i = 0; !st && i < n_results; i++)
            for (int k = 0; results[i] && k < n_args && !same[i]; k++)
                if (args[k] && results[i]->storage && args[k]->storage == results[i]->storage)
                    same[i] = PySequence_Fast_GET_ITEM(keep, k);
        res = st ? raise_status(st) : tensor_list(self, results, n_results, b, same);
    } else if (r == 1) {
        res = Py_NewRef(Py_None);
    }
    Py_XDECREF(keep);
    for (int i = 0; i < n_args; i++)
        ai_tensor_free(owned[i]);
    return res;
}

static PyObject *Graph_forward(GraphObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    bridge b;
    if (parse_bridge(args, nargs, "forward", &b) < 0)
        return NULL;
    PyObject *out = graph_run(self, args[0], &b, "inputs", self->g->n_inputs, false,
                              self->g->n_outputs, ai_graph_forward);
    if (out && out != Py_None) /* the GIL is held: no other thread's call came in between */
        self->forward_thread = PyThread_get_thread_ident();
    return out;
}

static PyObject *Graph_backward(GraphObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    bridge b;
    if (parse_bridge(args, nargs, "backward", &b) < 0)
        return NULL;
    if (self->forward_thread && self->forward_thread != PyThread_get_thread_ident())
        return PyErr_Format(PyExc_RuntimeError,
                            "backward in another thread than the latest forward (thread "
                            "%lu): a graph keeps the state of its latest forward only, so "
                            "another thread's forward came in between; use one graph per "
                            "thread", self->forward_thread);
    return graph_run(self, args[0], &b, "grad_outputs", self->g->n_outputs, true,
                     self->g->n_inputs, ai_graph_backward);
}

/* Whether a module with parameters is in the steady state of its backward
 * (AidgeModule._backward, bridge/wrapping.py): module._steady_backward is
 * (rows, backwards, idle) or None (padding rows, set_learning_rate); each
 * row (parameter, engine gradient) has no gradient hook, requires grad, and
 * its .grad is the engine's buffer itself; and the backward about to run is
 * neither the first nor the idle-th (_check_stepping's, Python's). Then 1
 * and *count the backwards list, *next its next count; 0 where Python runs
 * it (it raises the hook error, zeroes fresh buffers...), -1 on an error. */
enum { AB_CALL, AB_SAVED, AB_IS_NEG, AB_STEADY, AB_HOOKS, AB_POST_HOOKS, AB_REQUIRES, AB_GRAD,
       AB_N_NAMES };
static PyObject *ab_names[AB_N_NAMES];

static int params_steady(PyObject *module, PyObject **count, long *next)
{
    PyObject *st = PyObject_GetAttr(module, ab_names[AB_STEADY]);
    if (!st)
        return -1;
    int ok = 0;
    if (st == Py_None)
        goto done;
    PyObject *rows, *backwards;
    long idle;
    if (!PyTuple_Check(st) || PyTuple_GET_SIZE(st) != 3 ||
        !PyTuple_Check(rows = PyTuple_GET_ITEM(st, 0)) ||
        !PyList_Check(backwards = PyTuple_GET_ITEM(st, 1)) || !PyList_GET_SIZE(backwards) ||
        ((idle = PyLong_AsLong(PyTuple_GET_ITEM(st, 2))) == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        PyErr_SetString(PyExc_TypeError, "module._steady_backward must be None or "
                                         "(rows, [backwards, ...], idle)");
        ok = -1;
        goto done;
    }
    long n = PyLong_AsLong(PyList_GET_ITEM(backwards, 0));
    if (n == -1 && PyErr_Occurred()) {
        ok = -1;
        goto done;
    }
    if (n + 1 == 1 || n + 1 == idle)
        goto done;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(rows); i++) {
        PyObject *row = PyTuple_GET_ITEM(rows, i);
        if (!PyTuple_Check(row) || PyTuple_GET_SIZE(row) != 2) {
            PyErr_SetString(PyExc_TypeError, "module._steady_backward's rows must be "
                                             "(parameter, engine gradient) pairs");
            ok = -1;
            goto done;
        }
        PyObject *p = PyTuple_GET_ITEM(row, 0);
        static const int empty[] = {AB_HOOKS, AB_POST_HOOKS};
        for (int k = 0; k < 2; k++) {
            PyObject *h = PyObject_GetAttr(p, ab_names[empty[k]]);
            int set = h ? PyObject_IsTrue(h) : -1;
            Py_XDECREF(h);
            if (set) {
                ok = set < 0 ? -1 : 0;
                goto done;
            }
        }
        PyObject *r = PyObject_GetAttr(p, ab_names[AB_REQUIRES]);
        if (!r || r != Py_True) {
            ok = r ? 0 : -1;
            Py_XDECREF(r);
            goto done;
        }
        Py_DECREF(r);
        PyObject *g = PyObject_GetAttr(p, ab_names[AB_GRAD]);
        if (!g) {
            ok = -1;
            goto done;
        }
        const bool engines = g == PyTuple_GET_ITEM(row, 1);
        Py_DECREF(g);
        if (!engines)
            goto done;
    }
    *count = Py_NewRef(backwards);
    *next = n + 1;
    ok = 1;
done:
    Py_DECREF(st);
    return ok;
}

/* autograd_backward(ctx, grad_outputs, bridge): the checks of the torch
 * bridge's backward (bridge/wrapping.py, _EngineFunction) and, for a module
 * without parameters or one whose parameters are in the steady state
 * (params_steady), whose gradients all go through the bridge, the engine
 * call itself, in one C call: (None, None, *input gradients). None when the
 * checks passed but the rest is Python's (parameters outside the steady
 * state, or a gradient with a lazy negation bit, which torch's DLPack export
 * ignores). ctx.call is (module, graph, module._calls, this forward's
 * number, whether the module has parameters), set by the forward. The
 * checks, in the order the Python had them: where the backward reads
 * outputs or inputs, ctx.saved_tensors (torch's in-place and freed-graph errors), then
 * that the engine still holds this forward (module._calls[0] unchanged). A
 * wrapped Relu's backward inside torch's autograd engine:
 * benchmarks/results/overhead.md. */
PyObject *py_autograd_backward(PyObject *unused, PyObject *const *args, Py_ssize_t nargs)
{
    (void)unused;
    static const char *const spelled[AB_N_NAMES] = {
        "call", "saved_tensors", "is_neg", "_steady_backward", "_backward_hooks",
        "_post_accumulate_grad_hooks", "requires_grad", "grad"};
    for (int i = 0; i < AB_N_NAMES; i++)
        if (!ab_names[i] && !(ab_names[i] = PyUnicode_InternFromString(spelled[i])))
            return NULL;
    if (nargs != 3 || !PyTuple_Check(args[1]))
        return PyErr_Format(PyExc_TypeError,
                            "autograd_backward(ctx, grad_outputs, bridge) takes a ctx, a "
                            "tuple and a bridge");
    PyObject *grads = args[1], *res = NULL, *count = NULL;
    long next = 0;
    PyObject *call = PyObject_GetAttr(args[0], ab_names[AB_CALL]);
    if (!call)
        return NULL;
    if (!PyTuple_Check(call) || PyTuple_GET_SIZE(call) != 5 ||
        Py_TYPE(PyTuple_GET_ITEM(call, 1))->tp_dealloc != (destructor)Graph_dealloc ||
        !PyList_Check(PyTuple_GET_ITEM(call, 2)) || !PyList_GET_SIZE(PyTuple_GET_ITEM(call, 2))) {
        PyErr_SetString(PyExc_TypeError, "ctx.call must be (module, Graph, [calls, ...], "
                                         "forward number, has parameters)");
        goto done;
    }
    GraphObject *self = (GraphObject *)PyTuple_GET_ITEM(call, 1);
    if (ai_graph_backward_reads_outputs(self->g) || ai_graph_backward_reads_inputs(self->g)) {
        PyObject *saved = PyObject_GetAttr(args[0], ab_names[AB_SAVED]);
        if (!saved)
            goto done;
        Py_DECREF(saved);
    }
    int same = PyObject_RichCompareBool(PyTuple_GET_ITEM(call, 3),
                                        PyList_GET_ITEM(PyTuple_GET_ITEM(call, 2), 0), Py_EQ);
    if (same < 0)
        goto done;
    if (!same) {
        PyErr_SetString(PyExc_RuntimeError,
                        "AidgeModule: backward of an older forward. The engine keeps the "
                        "state of the latest forward only: run backward before the next "
                        "forward.");
        goto done;
    }
    bool bridged = true;
    if (PyTuple_GET_ITEM(call, 4) != Py_False) {
        int steady = params_steady(PyTuple_GET_ITEM(call, 0), &count, &next);
        if (steady < 0)
            goto done;
        bridged = steady;
    }
    for (Py_ssize_t i = 0; bridged && i < PyTuple_GET_SIZE(grads); i++) {
        PyObject *x = PyTuple_GET_ITEM(grads, i);
        if (x == Py_None || is_tensor(self, x))
            continue;
        PyObject *neg = PyObject_CallMethodNoArgs(x, ab_names[AB_IS_NEG]);
        if (!neg)
            goto done;
        bridged = neg == Py_False;
        Py_DECREF(neg);
    }
    PyObject *outs = bridged ? Graph_backward(self, args + 1, 2) : Py_NewRef(Py_None);
    if (!outs || outs == Py_None) {
        res = outs;
        goto done;
    }
    if (count) { /* AidgeModule._backwards[0] += 1, as _backward counts */
        PyObject *n = PyLong_FromLong(next);
        if (!n) {
            Py_DECREF(outs);
            goto done;
        }
        PyList_SetItem(count, 0, n);
    }
    const Py_ssize_t m = PyList_GET_SIZE(outs);
    res = PyTuple_New(m + 2);
    if (res) {
        PyTuple_SET_ITEM(res, 0, Py_NewRef(Py_None));
        PyTuple_SET_ITEM(res, 1, Py_NewRef(Py_None));
        for (Py_ssize_t i = 0; i < m; i++)
            PyTuple_SET_ITEM(res, i + 2, Py_NewRef(PyList_GET_ITEM(outs, i)));
    }
    Py_DECREF(outs);
done:
    Py_XDECREF(count);
    Py_DECREF(call);
    return res;
}

/* node_apply(bridge, rest): the apply of the bridge's autograd node class
 * (the autograd engine calls node.apply(*grad_outputs)): autograd_backward
 * with `bridge`, then rest(ctx, grad_outputs) where it answers None; a method
 * descriptor, so that no Python frame runs in between. */
static PyObject *node_bridge, *node_rest;

static PyObject *node_apply_call(PyObject *ctx, PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *grads = PyTuple_New(nargs);
    if (!grads)
        return NULL;
    for (Py_ssize_t i = 0; i < nargs; i++)
        PyTuple_SET_ITEM(grads, i, Py_NewRef(args[i]));
    PyObject *call[3] = {ctx, grads, node_bridge};
    PyObject *res = py_autograd_backward(NULL, call, 3);
    if (res == Py_None) {
        Py_DECREF(res);
        res = PyObject_CallFunctionObjArgs(node_rest, ctx, grads, NULL);
    }
    Py_DECREF(grads);
    return res;
}

static PyMethodDef node_apply_def = {"apply", (PyCFunction)(void (*)(void))node_apply_call,
                                     METH_FASTCALL, "the bridge's backward (node_apply)"};

PyObject *py_node_apply(PyObject *unused, PyObject *const *args, Py_ssize_t nargs)
{
    (void)unused;
    if (nargs != 2 || !PyCallable_Check(args[1]))
        return PyErr_Format(PyExc_TypeError, "node_apply(bridge, rest) takes a bridge and a "
                                             "callable");
    Py_XSETREF(node_bridge, Py_NewRef(args[0]));
    Py_XSETREF(node_rest, Py_NewRef(args[1]));
    return PyDescr_NewMethod(&PyBaseObject_Type, &node_apply_def);
}

/* module_call(cls, bridge, slow, graph_call, torch.Tensor, torch.nn.modules.module,
 * torch._C._get_tracing_state, torch._C.is_grad_enabled, data_reads,
 * torch._C.DisableTorchFunctionSubclass): the
 * `__call__` of the torch bridge's AidgeModule (bridge/wrapping.py) as a
 * method descriptor: its steady-state call without grad (an eval or
 * no_grad forward) in C, no Python frame between the caller and the
 * engine. Where a condition of that path does not hold, it calls slow(self,
 * *args, **kwargs) (the Python __call__) before changing anything: hooks,
 * keyword arguments, torch.compile or jit tracing, grad mode, forward
 * replaced on the instance, a call that is not plain (forward's
 * condition), an input that is not a plain torch.Tensor or has a lazy
 * negation bit, moved parameter memory (_relink), a first fused forward,
 * BatchNorm counters, a subclass. The path, in the Python's order: the hook
 * tests, _run's data_moved test, the graph's flags, the forward counter,
 * the packed weights' version, the fused graph, the engine call through the
 * bridge (graph_call, Python's _graph_call, where the bridge declines a
 * tensor), forward's retry of a ValueError as a call of another signature.
 * What each part costs: benchmarks/results/overhead.md. */
enum {
    MC_FORWARD, MC_PRE_HOOKS, MC_HOOKS, MC_BW_HOOKS, MC_BW_PRE_HOOKS, MC_COMPILED,
    MC_G_PRE_HOOKS, MC_G_HOOKS, MC_G_BW_HOOKS, MC_G_BW_PRE_HOOKS, MC_PLAIN, MC_N_INPUTS,
    MC_OUT_SINGLE, MC_OUT_TUPLE, MC_ENGINE_DATA, MC_ENGINE_PTRS, MC_TRAINING, MC_GRAPH,
    MC_CALLS, MC_FUSED, MC_FUSED_CALL, MC_BATCH_COUNTS, MC_BATCH_COUNTERS, MC_DATA_PTR,
    MC_VERSION, MC_IS_NEG, MC_DECLARES, MC_FORWARD_CALL, MC_ENTER, MC_EXIT, MC_N_NAMES
};
static const char *const mc_spelled[MC_N_NAMES] = {
    "forward", "_forward_pre_hooks", "_forward_hooks", "_backward_hooks",
    "_backward_pre_hooks", "_compiled_call_impl", "_global_forward_pre_hooks",
    "_global_forward_hooks", "_global_backward_hooks", "_global_backward_pre_hooks",
    "_plain", "_n_inputs", "_out_single", "_out_tuple", "_engine_data", "_engine_ptrs",
    "training", "_graph", "_calls", "_fused", "_fused_call", "_batch_counts",
    "_batch_counters", "data_ptr", "_version", "is_neg", "_declares_otherwise",
    "_forward_call", "__enter__", "__exit__"};
static PyObject *mc_names[MC_N_NAMES];
enum { MC_CLS, MC_BRIDGE, MC_SLOW, MC_GRAPH_CALL, MC_TENSOR, MC_NN_MODULE, MC_TRACING,
       MC_GRAD_ENABLED, MC_DATA_READS, MC_NO_SUBCLASS_TF, MC_N_ARGS };
static PyObject *mc_args[MC_N_ARGS];

/* self.__dict__[name] (borrowed), NULL where it is missing (or an error) */
static PyObject *mc_item(PyObject *d, int name)
{
    return PyDict_GetItemWithError(d, mc_names[name]);
}

/* 1: hooks (a dict with entries, or not a dict), 0: an empty dict, -1: error */
static int mc_hooks(PyObject *o)
{
    if (!o)
        return PyErr_Occurred() ? -1 : 1;
    return PyDict_Check(o) ? PyDict_GET_SIZE(o) != 0 : 1;
}

/* 1 where the steady-state path applies, 0 where not, -1 on error; reads only */
static int mc_applies(PyObject *self, PyObject *d, PyObject *const *args, Py_ssize_t nargs,
                      PyObject *kwnames)
{
    if ((kwnames && PyTuple_GET_SIZE(kwnames)) || Py_TYPE(self) != (PyTypeObject *)mc_args[MC_CLS])
        return 0;
    if (mc_item(d, MC_FORWARD)) /* forward replaced on the instance */
        return 0;
    for (int k = MC_PRE_HOOKS; k <= MC_BW_PRE_HOOKS; k++) {
        int r = mc_hooks(mc_item(d, k));
        if (r)
            return r < 0 ? -1 : 0;
    }
    PyObject *compiled = mc_item(d, MC_COMPILED); /* Module.compile sets it */
    if (compiled && compiled != Py_None)
        return 0;
    if (!compiled) { /* the class's (borrowed, through the type's method cache) */
        if (PyErr_Occurred())
            return -1;
        compiled = _PyType_Lookup((PyTypeObject *)mc_args[MC_CLS], mc_names[MC_COMPILED]);
        if (compiled != Py_None)
            return 0;
    }
    PyObject *globals = PyModule_GetDict(mc_args[MC_NN_MODULE]); /* (borrowed) */
    for (int k = MC_G_PRE_HOOKS; k <= MC_G_BW_PRE_HOOKS; k++) {
        int r = mc_hooks(globals ? mc_item(globals, k) : NULL);
        if (r)
            return r < 0 ? -1 : 0;
    }
    for (int k = MC_TRACING; k <= MC_GRAD_ENABLED; k++) { /* None / False expected */
        PyObject *state = PyObject_CallNoArgs(mc_args[k]);
        if (!state)
            return -1;
        Py_DECREF(state);
        if (state != (k == MC_TRACING ? Py_None : Py_False))
            return 0;
    }
    PyObject *n_inputs = mc_item(d, MC_N_INPUTS);
    if (mc_item(d, MC_PLAIN) != Py_True || !n_inputs || !PyLong_CheckExact(n_inputs) ||
        PyLong_AsSsize_t(n_inputs) != nargs ||
        (mc_item(d, MC_OUT_SINGLE) != Py_True && mc_item(d, MC_OUT_TUPLE) != Py_True))
        return PyErr_Occurred() ? -1 : 0;
    for (Py_ssize_t i = 0; i < nargs; i++) { /* (to_dlpack ignores a negation bit) */
        if (Py_TYPE(args[i]) != (PyTypeObject *)mc_args[MC_TENSOR])
            return 0;
        PyObject *neg = PyObject_CallMethodNoArgs(args[i], mc_names[MC_IS_NEG]);
        if (!neg)
            return -1;
        Py_DECREF(neg);
        if (neg != Py_False)
            return 0;
    }
    PyObject *data = mc_item(d, MC_ENGINE_DATA), *ptrs = mc_item(d, MC_ENGINE_PTRS);
    if (!data || !ptrs || !PyList_Check(data) || !PyList_Check(ptrs) ||
        PyList_GET_SIZE(data) != PyList_GET_SIZE(ptrs))
        return PyErr_Occurred() ? -1 : 0;
    PyObject *graph = mc_item(d, MC_GRAPH), *calls = mc_item(d, MC_CALLS);
    PyObject *training = mc_item(d, MC_TRAINING);
    if (!graph || Py_TYPE(graph)->tp_dealloc != (destructor)Graph_dealloc || !calls ||
        !PyList_Check(calls) || PyList_GET_SIZE(calls) != 1 ||
        !PyLong_CheckExact(PyList_GET_ITEM(calls, 0)) || !training || !PyBool_Check(training))
        return PyErr_Occurred() ? -1 : 0;
    if (training == Py_True) { /* BatchNorm's counters: Python's */
        PyObject *counts = mc_item(d, MC_BATCH_COUNTS);
        PyObject *counters = mc_item(d, MC_BATCH_COUNTERS);
        if (counts != Py_None || !counters || !PyList_Check(counters) ||
            PyList_GET_SIZE(counters))
            return PyErr_Occurred() ? -1 : 0;
    } else { /* the fused graph built (a Graph) or none (False); None: its first use */
        PyObject *fused = mc_item(d, MC_FUSED), *fused_call = mc_item(d, MC_FUSED_CALL);
        if (!fused || !(fused == Py_False ||
                        Py_TYPE(fused)->tp_dealloc == (destructor)Graph_dealloc) ||
            !fused_call || !PyList_Check(fused_call) || PyList_GET_SIZE(fused_call) != 1)
            return PyErr_Occurred() ? -1 : 0;
    }
    return 1;
}

/* Reads of the module's parameters and buffers (_engine_data): whether each
 * still has the data pointer of _engine_ptrs (a storage swap, `p.data = t`:
 * the Python path relinks it), then, where `version` is not NULL, _run's
 * version of the packed weights, sum(t._version) + data_reads[0]. 1: in
 * place, 0: moved, -1: error. Each of these torch calls on a parameter,
 * whose type is a Python subclass (_EngineParameter), first looks its
 * class's __torch_function__ up (about 1.4k of its 1.7k instructions);
 * for more than one parameter the reads run with that lookup off
 * (DisableTorchFunctionSubclass: the same values, that class's
 * __torch_function__ is torch's disabled one). */
static int mc_tensor_reads(PyObject *d, long long *version)
{
    PyObject *data = mc_item(d, MC_ENGINE_DATA), *ptrs = mc_item(d, MC_ENGINE_PTRS);
    const Py_ssize_t n = PyList_GET_SIZE(data);
    PyObject *guard = NULL;
    int same = 1;
    if (n > 1) {
        PyObject *entered = (guard = PyObject_CallNoArgs(mc_args[MC_NO_SUBCLASS_TF]))
                                ? PyObject_CallMethodNoArgs(guard, mc_names[MC_ENTER])
                                : NULL;
        if (!entered) {
            Py_XDECREF(guard);
            return -1;
        }
        Py_DECREF(entered);
    }
    for (Py_ssize_t i = 0; same > 0 && i < n && i < PyList_GET_SIZE(data); i++) {
        PyObject *t = Py_NewRef(PyList_GET_ITEM(data, i));
        PyObject *ptr = PyObject_CallMethodNoArgs(t, mc_names[MC_DATA_PTR]);
        Py_DECREF(t);
        /* (the lists' sizes again: a tensor subclass's Python could change them) */
        same = !ptr ? -1 : i < PyList_GET_SIZE(ptrs) &&
                               PyObject_RichCompareBool(ptr, PyList_GET_ITEM(ptrs, i), Py_EQ);
        Py_XDECREF(ptr);
    }
    if (same > 0 && version) {
        long long sum = PyLong_AsLongLong(PyList_GET_ITEM(mc_args[MC_DATA_READS], 0));
        for (Py_ssize_t i = 0; sum >= 0 && i < PyList_GET_SIZE(data); i++) {
            PyObject *v = PyObject_GetAttr(PyList_GET_ITEM(data, i), mc_names[MC_VERSION]);
            long long x = v ? PyLong_AsLongLong(v) : -1;
            Py_XDECREF(v);
            sum = x < 0 ? -1 : sum + x;
        }
        if (sum < 0 && !PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "AidgeModule: a negative version counter");
        same = sum < 0 ? -1 : 1;
        *version = sum;
    }
    if (guard) { /* __exit__ keeping the reads' exception, if any */
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        PyObject *args[4] = {guard, Py_None, Py_None, Py_None};
        PyObject *left = PyObject_VectorcallMethod(mc_names[MC_EXIT], args,
                                                   4 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
        Py_DECREF(guard);
        if (!left) {
            Py_XDECREF(type);
            Py_XDECREF(value);
            Py_XDECREF(tb);
            return -1;
        }
        Py_DECREF(left);
        PyErr_Restore(type, value, tb);
    }
    return same;
}

/* slow(self, *args, **kwargs) */
static PyObject *mc_slow(PyObject *self, PyObject *const *args, Py_ssize_t nargs,
                         PyObject *kwnames)
{
    Py_ssize_t n = nargs + (kwnames ? PyTuple_GET_SIZE(kwnames) : 0);
    PyObject **stack = PyMem_Malloc((size_t)(n + 1) * sizeof *stack);
    if (!stack)
        return PyErr_NoMemory();
    stack[0] = self;
    for (Py_ssize_t i = 0; i < n; i++)
        stack[i + 1] = args[i];
    PyObject *res = PyObject_Vectorcall(mc_args[MC_SLOW], stack, (size_t)(nargs + 1), kwnames);
    PyMem_Free(stack);
    return res;
}

/* forward's ValueError: a call of another signature when the inputs
 * contradict the dims the graph declares (self._forward_call), else raised
 * as it is */
static PyObject *mc_retry(PyObject *self, PyObject *inputs)
{
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyObject *other = PyObject_CallMethodOneArg(self, mc_names[MC_DECLARES], inputs);
    int r = other ? PyObject_IsTrue(other) : -1;
    Py_XDECREF(other);
    if (r == 0) {
        PyErr_Restore(type, value, tb);
        return NULL;
    }
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
    if (r < 0) /* _declares_otherwise's own error */
        return NULL;
    PyObject *kwargs = PyDict_New();
    PyObject *res = kwargs ? PyObject_CallMethodObjArgs(self, mc_names[MC_FORWARD_CALL],
                                                        inputs, kwargs, NULL)
                           : NULL;
    Py_XDECREF(kwargs);
    return res;
}

static PyObject *mc_call(PyObject *self, PyObject *const *args, Py_ssize_t nargs,
                         PyObject *kwnames)
{
    PyObject *d = PyObject_GenericGetDict(self, NULL), *res = NULL, *inputs = NULL;
    if (!d)
        return NULL;
    int fast = mc_applies(self, d, args, nargs, kwnames);
    if (fast <= 0) {
        res = fast == 0 ? mc_slow(self, args, nargs, kwnames) : NULL;
        Py_DECREF(d);
        return res;
    }
    /* _run: the memory in place, the flags, the forward counter, the weights'
     * version, the graph */
    const bool training = mc_item(d, MC_TRAINING) == Py_True;
    GraphObject *g = (GraphObject *)mc_item(d, MC_GRAPH), *run = g;
    if (!training && mc_item(d, MC_FUSED) != Py_False)
        run = (GraphObject *)mc_item(d, MC_FUSED);
    long long version = -1;
    const bool versioned = !training && run->g->weights_packable;
    fast = mc_tensor_reads(d, versioned ? &version : NULL);
    if (fast <= 0) {
        res = fast == 0 ? mc_slow(self, args, nargs, kwnames) : NULL;
        Py_DECREF(d);
        return res;
    }
    if (graph_enter(g) < 0) /* not while another thread runs it */
        goto done;
    g->g->training = training;
    g->g->need_backward = false;
    g->g->input_grads = false;
    graph_leave(g);
    PyObject *calls = mc_item(d, MC_CALLS);
    long long number = PyLong_AsLongLong(PyList_GET_ITEM(calls, 0));
    PyObject *next = number == -1 && PyErr_Occurred() ? NULL : PyLong_FromLongLong(number + 1);
    if (!next)
        goto done;
    PyList_SetItem(calls, 0, next); /* (steals next; calls keeps it alive) */
    if (versioned) {
        if (graph_enter(run) < 0)
            goto done;
        run->g->weights_version = version;
        graph_leave(run);
    }
    if (run != g) /* _run_fused's mark, for memory_stats */
        PyList_SetItem(mc_item(d, MC_FUSED_CALL), 0, Py_NewRef(next));
    if (!(inputs = PyTuple_New(nargs)))
        goto done;
    for (Py_ssize_t i = 0; i < nargs; i++)
        PyTuple_SET_ITEM(inputs, i, Py_NewRef(args[i]));
    PyObject *bridge_args[2] = {inputs, mc_args[MC_BRIDGE]};
    PyObject *outs = Graph_forward(run, bridge_args, 2);
    if (outs == Py_None) { /* a tensor the bridge declines: Python's _graph_call */
        Py_DECREF(outs);
        PyObject *forward = PyObject_GetAttr((PyObject *)run, mc_names[MC_FORWARD]);
        outs = forward ? PyObject_CallFunctionObjArgs(mc_args[MC_GRAPH_CALL], forward, inputs,
                                                      NULL)
                       : NULL;
        Py_XDECREF(forward);
    }
    if (!outs) {
        if (PyErr_ExceptionMatches(PyExc_ValueError))
            res = mc_retry(self, inputs);
        goto done;
    }
    if (!PyList_Check(outs) || !PyList_GET_SIZE(outs))
        PyErr_SetString(PyExc_TypeError, "AidgeModule: the graph returned no output list");
    else if (mc_item(d, MC_OUT_SINGLE) == Py_True)
        res = Py_NewRef(PyList_GET_ITEM(outs, 0));
    else
        res = PyList_AsTuple(outs);
    Py_DECREF(outs);
done:
    Py_XDECREF(inputs);
    Py_DECREF(d);
    return res;
}

static PyMethodDef module_call_def = {"__call__", (PyCFunction)(void (*)(void))mc_call,
                                      METH_FASTCALL | METH_KEYWORDS,
                                      "AidgeModule's call (module_call)"};

PyObject *py_module_call(PyObject *unused, PyObject *const *args, Py_ssize_t nargs)
{
    (void)unused;
    if (nargs != MC_N_ARGS || !PyType_Check(args[MC_CLS]) || !PyType_Check(args[MC_TENSOR]) ||
        !PyCallable_Check(args[MC_NO_SUBCLASS_TF]) || !PyModule_Check(args[MC_NN_MODULE]) ||
        !PyTuple_Check(args[MC_BRIDGE]) || PyTuple_GET_SIZE(args[MC_BRIDGE]) != 2 ||
        !PyList_Check(args[MC_DATA_READS]) || PyList_GET_SIZE(args[MC_DATA_READS]) != 1)
        return PyErr_Format(PyExc_TypeError,
                            "module_call(cls, bridge, slow, graph_call, tensor_type, "
                            "nn_module, tracing_state, grad_enabled, data_reads, "
                            "no_subclass_tf) takes %d arguments: a class, a bridge (2-tuple), "
                            "6 objects, a 1-list, a class",
                            MC_N_ARGS);
    for (int i = 0; i < MC_N_NAMES; i++)
        if (!mc_names[i] && !(mc_names[i] = PyUnicode_InternFromString(mc_spelled[i])))
            return NULL;
    for (int i = 0; i < MC_N_ARGS; i++)
        Py_XSETREF(mc_args[i], Py_NewRef(args[i]));
    return PyDescr_NewMethod((PyTypeObject *)args[MC_CLS], &module_call_def);
}

static PyObject *Graph_zero_grad(GraphObject *self, PyObject *unused)
{
    (void)unused;
    if (graph_enter(self) < 0)
        return NULL;
    ai_graph_zero_grad(self->g);
    graph_leave(self);
    return Py_NewRef(Py_None);
}

static int find_value(GraphObject *self, PyObject *name_obj, int *v)
{
    const char *name = PyUnicode_AsUTF8(name_obj);
    if (!name)
        return -1;
    *v = ai_graph_find_value(self->g, name);
    if (*v < 0) {
        PyErr_Format(PyExc_KeyError, "no value named '%s' in the graph", name);
        return -1;
    }
    return 0;
}

/* Zero-copy views of a value's data or gradient. */
static PyObject *Graph_value_tensor(GraphObject *self, PyObject *args, bool grad)
{
    PyObject *name;
    int v;
    if (!PyArg_ParseTuple(args, "U", &name) || find_value(self, name, &v) < 0)
        return NULL;
    if (graph_enter(self) < 0)
        return NULL;
    ai_tensor *src = grad ? self->g->values[v].grad : self->g->values[v].data, *t = NULL;
    ai_status st = src ? ai_tensor_share(&t, src) : AI_OK;
    graph_leave(self);
    if (!src)
        return PyErr_Format(PyExc_ValueError, "value %R has no %s (not an initializer%s)",
                            name, grad ? "gradient" : "data", grad ? " parameter" : "");
    return st ? raise_status(st) : tensor_wrap(self->tensor_type, t);
}

static PyObject *Graph_value(GraphObject *self, PyObject *args)
{
    return Graph_value_tensor(self, args, false);
}

static PyObject *Graph_grad(GraphObject *self, PyObject *args)
{
    return Graph_value_tensor(self, args, true);
}

static PyObject *Graph_intermediate(GraphObject *self, PyObject *args)
{
    const char *name;
    if (!PyArg_ParseTuple(args, "s:intermediate", &name))
        return NULL;
    ai_tensor *t;
    if (graph_enter(self) < 0) /* the plan may change under a running forward */
        return NULL;
    ai_status st = ai_graph_intermediate(self->g, name, &t);
    graph_leave(self);
    return st ? raise_status(st) : tensor_wrap(self->tensor_type, t);
}

static PyObject *meta_tuple(const ai_meta *m)
{
    PyObject *shape = int64_tuple(m->ndim, m->shape, 1);
    return shape ? Py_BuildValue("(sN)", ai_dtype_name(m->dtype), shape) : NULL;
}

/* Description of every value: name, kind, producer, dtype, shape (when planned). */
static PyObject *Graph_values(GraphObject *self, PyObject *unused)
{
    (void)unused;
    static const char *kinds[] = {"input", "param", "buffer", "const", "activation"};
    const ai_graph *g = self->g;
    if (graph_enter(self) < 0) /* the metas are the plan's */
        return NULL;
    PyObject *list = PyList_New(0);
    for (int v = 0; list && v < g->n_values; v++) {
        const ai_value *val = &g->values[v];
        ai_meta m;
        PyObject *meta = ai_graph_value_meta(g, v, &m) ? meta_tuple(&m) : Py_NewRef(Py_None);
        PyObject *item = meta ? Py_BuildValue("{s:s,s:s,s:i,s:N}", "name", val->name, "kind",
                                              kinds[val->kind], "producer", val->producer,
                                              "meta", meta)
                              : NULL;
        if (!item || PyList_Append(list, item) < 0)
            Py_CLEAR(list);
        Py_XDECREF(item);
    }
    graph_leave(self);
    return list;
}

static PyObject *attr_to_py(GraphObject *self, const ai_attr *a)
{
    switch (a->type) {
    case AI_ATTR_INT: return PyLong_FromLongLong(a->i);
    case AI_ATTR_FLOAT: return PyFloat_FromDouble(a->f);
    case AI_ATTR_STRING: return PyUnicode_FromString(a->s ? a->s : "");
    case AI_ATTR_INTS: return int64_tuple((int)a->n, a->ints, 1);
    case AI_ATTR_FLOATS: {
        PyObject *t = PyTuple_New(a->n);
        for (int64_t i = 0; t && i < a->n; i++)
            PyTuple_SET_ITEM(t, i, PyFloat_FromDouble(a->floats[i]));
        return t;
    }
    case AI_ATTR_TENSOR: {
        ai_tensor *t;
        ai_status st = ai_tensor_clone(&t, a->t);
        return st ? raise_status(st) : tensor_wrap(self->tensor_type, t);
    }
    case AI_ATTR_GRAPH: /* a subgraph: what it is, not a handle that could outlive it */
        return PyUnicode_FromFormat("graph(%d inputs, %d nodes, %d outputs)",
                                    a->graph->n_inputs, a->graph->n_nodes,
                                    a->graph->n_outputs);
    }
    return Py_NewRef(Py_None);
}

static PyObject *Graph_nodes(GraphObject *self, PyObject *unused)
{
    (void)unused;
    const ai_graph *g = self->g;
    PyObject *list = PyList_New(0);
    for (int i = 0; list && i < g->n_nodes; i++) {
        const ai_node *n = &g->nodes[i];
        PyObject *ins = PyList_New(n->n_in), *outs = PyList_New(n->n_out), *attrs = PyDict_New();
        if (!ins || !outs || !attrs)
            goto fail_item;
        for (int k = 0; k < n->n_in; k++)
            PyList_SET_ITEM(ins, k, PyUnicode_FromString(n->in[k] >= 0 ? g->values[n->in[k]].name : ""));
        for (int k = 0; k < n->n_out; k++)
            PyList_SET_ITEM(outs, k, PyUnicode_FromString(g->values[n->out[k]].name));
        for (int k = 0; k < n->n_attrs; k++) {
            PyObject *v = attr_to_py(self, &n->attrs[k]);
            if (!v || PyDict_SetItemString(attrs, n->attrs[k].name, v) < 0) {
                Py_XDECREF(v);
                goto fail_item;
            }
            Py_DECREF(v);
        }
        PyObject *item = Py_BuildValue("{s:s,s:s,s:s,s:i,s:N,s:N,s:N}", "name", n->name,
                                       "op_type", n->op_type, "domain", n->domain, "opset",
                                       n->opset, "inputs", ins, "outputs", outs, "attrs", attrs);
        if (!item || PyList_Append(list, item) < 0) {
            Py_XDECREF(item);
            Py_CLEAR(list);
            break;
        }
        Py_DECREF(item);
        continue;
    fail_item:
        Py_XDECREF(ins);
        Py_XDECREF(outs);
        Py_XDECREF(attrs);
        Py_CLEAR(list);
    }
    return list;
}

static PyObject *Graph_memory_stats(GraphObject *self, PyObject *unused)
{
    (void)unused;
    ai_memory_stats m;
    if (graph_enter(self) < 0)
        return NULL;
    ai_status st = ai_graph_memory_stats(self->g, &m);
    const int64_t packed = ai_packed_bytes(self->g);
    graph_leave(self);
    if (st)
        return raise_status(st);
    return Py_BuildValue("{s:n,s:n,s:n,s:n,s:n,s:n,s:i,s:n}", "peak_bytes",
                         (Py_ssize_t)(m.arena_bytes + m.workspace_bytes + m.state_bytes),
                         "arena_bytes", (Py_ssize_t)m.arena_bytes, "workspace_bytes",
                         (Py_ssize_t)m.workspace_bytes, "state_bytes",
                         (Py_ssize_t)m.state_bytes, "param_bytes", (Py_ssize_t)m.param_bytes,
                         "grad_bytes", (Py_ssize_t)m.grad_bytes, "planned_nodes",
                         m.planned_nodes, "packed_weights_bytes", (Py_ssize_t)packed);
}

/* The recipes of recipes.c, by name. */
static const struct {
    const char *name;
    ai_status (*fn)(ai_graph *, ai_recipe_report *);
} recipes[] = {
    {"fuse_batchnorm", ai_recipe_fuse_batchnorm},
    {"batchnorm_epilogue", ai_recipe_batchnorm_epilogue},
    {"remove_flatten", ai_recipe_remove_flatten},
    {"fuse_activation", ai_recipe_fuse_activation},
    {"expand_metaops", ai_recipe_expand_metaops},
    {"restore_flatten", ai_recipe_restore_flatten},
    {"constant_fold", ai_recipe_constant_fold},
    {"block_channels", ai_recipe_block_channels},
    {"fuse_pad", ai_recipe_fuse_pad},
    {"fuse_linear", ai_recipe_fuse_linear},
    {"fuse_gelu", ai_recipe_fuse_gelu},
};

static PyObject *entry_list(const ai_recipe_entry *e, int n)
{
    PyObject *list = PyList_New(n);
    for (int i = 0; list && i < n; i++) {
        PyObject *item = Py_BuildValue("(ss)", e[i].node, e[i].text);
        if (!item) {
            Py_CLEAR(list);
            break;
        }
        PyList_SET_ITEM(list, i, item);
    }
    return list;
}

/* apply_recipe(name) -> (done, skipped): lists of (node name, text). */
static PyObject *Graph_apply_recipe(GraphObject *self, PyObject *args)
{
    const char *name;
    if (!PyArg_ParseTuple(args, "s:apply_recipe", &name))
        return NULL;
    size_t k = 0;
    while (k < sizeof recipes / sizeof recipes[0] && strcmp(recipes[k].name, name))
        k++;
    if (k == sizeof recipes / sizeof recipes[0])
        return PyErr_Format(PyExc_ValueError, "unknown recipe '%s'", name);
    if (graph_enter(self) < 0)
        return NULL;
    ai_recipe_report r = {0};
    ai_status st = recipes[k].fn(self->g, &r);
    graph_leave(self);
    PyObject *result = NULL;
    if (st)
        raise_status(st);
    else
        result = Py_BuildValue("(NN)", entry_list(r.done, r.n_done),
                               entry_list(r.skipped, r.n_skipped));
    ai_recipe_report_free(&r);
    return result;
}

#define GRAPH_FLAG(NAME)                                                               \
    static PyObject *Graph_get_##NAME(GraphObject *self, void *c)                      \
    {                                                                                  \
        (void)c;                                                                       \
        return PyBool_FromLong(self->g->NAME);                                         \
    }                                                                                  \
    static int Graph_set_##NAME(GraphObject *self, PyObject *v, void *c)               \
    {                                                                                  \
        (void)c;                                                                       \
        int b = v ? PyObject_IsTrue(v) : 0;                                            \
        if (b < 0 || graph_enter(self) < 0) /* not while another thread runs it */     \
            return -1;                                                                 \
        self->g->NAME = b;                                                             \
        graph_leave(self);                                                             \
        return 0;                                                                      \
    }

GRAPH_FLAG(training)
GRAPH_FLAG(need_backward)
GRAPH_FLAG(input_grads)
GRAPH_FLAG(keep_intermediates)
GRAPH_FLAG(profile)

/* packed.c's weights_version (an int, -1: none) and weights_packable */
static PyObject *Graph_get_weights_version(GraphObject *self, void *c)
{
    (void)c;
    return PyLong_FromLongLong(self->g->weights_version);
}

static int Graph_set_weights_version(GraphObject *self, PyObject *v, void *c)
{
    (void)c;
    long long version = v ? PyLong_AsLongLong(v) : -1;
    if (version == -1 && PyErr_Occurred())
        return -1;
    if (version < -1) {
        PyErr_Format(PyExc_ValueError, "Graph.weights_version must be >= 0, or -1 for none; "
                     "got %lld", version);
        return -1;
    }
    if (graph_enter(self) < 0) /* not while another thread runs it */
        return -1;
    self->g->weights_version = version;
    graph_leave(self);
    return 0;
}

static PyObject *Graph_get_weights_packable(GraphObject *self, void *c)
{
    (void)c;
    return PyBool_FromLong(self->g->weights_packable);
}

static PyObject *Graph_profile_counts(GraphObject *self, PyObject *args)
{
    int reset = 0;
    if (!PyArg_ParseTuple(args, "|p", &reset) || graph_enter(self) < 0)
        return NULL;
    ai_graph *g = self->g;
    PyObject *list = PyList_New(g->n_nodes);
    for (int i = 0; list && i < g->n_nodes; i++) {
        ai_node *n = &g->nodes[g->finalized && g->order ? g->order[i] : i];
        PyObject *row = Py_BuildValue("(ssdLdL)", n->name, n->op_type, n->prof_fwd_s,
                                      (long long)n->prof_fwd_n, n->prof_bwd_s,
                                      (long long)n->prof_bwd_n);
        if (!row) {
            Py_CLEAR(list);
            break;
        }
        PyList_SET_ITEM(list, i, row);
    }
    for (int i = 0; list && reset && i < g->n_nodes; i++) {
        g->nodes[i].prof_fwd_s = g->nodes[i].prof_bwd_s = 0;
        g->nodes[i].prof_fwd_n = g->nodes[i].prof_bwd_n = 0;
    }
    graph_leave(self);
    return list;
}

static PyObject *Graph_get_backward_reads_outputs(GraphObject *self, void *c)
{
    (void)c;
    return PyBool_FromLong(ai_graph_backward_reads_outputs(self->g));
}

static PyObject *Graph_get_backward_reads_inputs(GraphObject *self, void *c)
{
    (void)c;
    return PyBool_FromLong(ai_graph_backward_reads_inputs(self->g));
}

static PyObject *Graph_get_input_names(GraphObject *self, void *c)
{
    (void)c;
    PyObject *l = PyList_New(self->g->n_inputs);
    for (int i = 0; l && i < self->g->n_inputs; i++)
        PyList_SET_ITEM(l, i, PyUnicode_FromString(self->g->values[self->g->inputs[i]].name));
    return l;
}

static PyObject *Graph_get_output_names(GraphObject *self, void *c)
{
    (void)c;
    PyObject *l = PyList_New(self->g->n_outputs);
    for (int i = 0; l && i < self->g->n_outputs; i++)
        PyList_SET_ITEM(l, i, PyUnicode_FromString(self->g->values[self->g->outputs[i]].name));
    return l;
}

static PyMethodDef Graph_methods[] = {
    {"add_input", (PyCFunction)Graph_add_input, METH_VARARGS,
     "add_input(name, dtype, dims=None): a graph input (shape given at forward);\n"
     "dims, the model's declared dims (None for a free one), are checked when\n"
     "planning."},
    {"share_grad", (PyCFunction)Graph_share_grad, METH_VARARGS,
     "share_grad(name, tensor): parameter name's gradient is tensor's memory."},
    {"add_initializer", (PyCFunction)Graph_add_initializer, METH_VARARGS,
     "add_initializer(name, tensor, kind, share=False): kind is 'param', 'buffer' or\n"
     "'const'; copied, or with share the graph reads and writes the tensor's memory."},
    {"add_node", (PyCFunction)(void (*)(void))Graph_add_node, METH_VARARGS | METH_KEYWORDS,
     "add_node(name, op_type, inputs, outputs, attrs=None, domain='', opset=17)."},
    {"set_outputs", (PyCFunction)Graph_set_outputs, METH_O, "set_outputs(names)."},
    {"finalize", (PyCFunction)Graph_finalize, METH_NOARGS,
     "Checks the graph and orders its nodes."},
    {"forward", (PyCFunction)(void (*)(void))Graph_forward, METH_FASTCALL,
     "forward(inputs, bridge=None) -> outputs (one C call, GIL released).\n\n"
     "bridge: (to_capsule, from_capsule); inputs that are not Tensors go through\n"
     "to_capsule (a DLPack capsule, viewed without a copy), the outputs come back\n"
     "through from_capsule; None (nothing run) when an input does not go that way."},
    {"backward", (PyCFunction)(void (*)(void))Graph_backward, METH_FASTCALL,
     "backward(grad_outputs, bridge=None) -> input gradients (parameter gradients\n"
     "accumulate); bridge as in forward. An input whose gradient is an output's\n"
     "unchanged (x + y into an output) gets that grad_outputs object itself, as\n"
     "torch's autograd hands it on."},
    {"zero_grad", (PyCFunction)Graph_zero_grad, METH_NOARGS, "Zeroes parameter gradients."},
    {"value", (PyCFunction)Graph_value, METH_VARARGS,
     "value(name): zero-copy view of an initializer's data."},
    {"grad", (PyCFunction)Graph_grad, METH_VARARGS,
     "grad(name): zero-copy view of a parameter's gradient."},
    {"intermediate", (PyCFunction)Graph_intermediate, METH_VARARGS,
     "intermediate(name): a copy of any value after the last forward."},
    {"values", (PyCFunction)Graph_values, METH_NOARGS, "Every value, with its planned meta."},
    {"nodes", (PyCFunction)Graph_nodes, METH_NOARGS, "Every node."},
    {"memory_stats", (PyCFunction)Graph_memory_stats, METH_NOARGS,
     "Bytes of the current memory plan."},
    {"profile_counts", (PyCFunction)Graph_profile_counts, METH_VARARGS,
     "profile_counts(reset=False) -> [(name, op_type, fwd_s, fwd_calls, bwd_s, bwd_calls)] "
     "in execution order; reset zeroes the counters after reading."},
    {"apply_recipe", (PyCFunction)Graph_apply_recipe, METH_VARARGS,
     "apply_recipe(name) -> (done, skipped): rewrites the graph (recipes.c)."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Graph_getset[] = {
    {"backward_reads_outputs", (getter)Graph_get_backward_reads_outputs, NULL,
     "whether the backward of the current plan (need_backward) reads the memory of\n"
     "an output the forward returned: an in-place change to it would then change\n"
     "the gradients", NULL},
    {"backward_reads_inputs", (getter)Graph_get_backward_reads_inputs, NULL,
     "whether the backward of the current plan (need_backward) reads the memory of\n"
     "an input the forward was given (the caller's tensor, which the engine views):\n"
     "an in-place change to it would then change the gradients", NULL},
    {"training", (getter)Graph_get_training, (setter)Graph_set_training,
     "BatchNorm batch statistics and Dropout when True", NULL},
    {"need_backward", (getter)Graph_get_need_backward, (setter)Graph_set_need_backward,
     "forward keeps what backward needs", NULL},
    {"input_grads", (getter)Graph_get_input_grads, (setter)Graph_set_input_grads,
     "backward computes gradients of the graph inputs", NULL},
    {"keep_intermediates", (getter)Graph_get_keep_intermediates,
     (setter)Graph_set_keep_intermediates, "plan without buffer reuse", NULL},
    {"profile", (getter)Graph_get_profile, (setter)Graph_set_profile,
     "time every node's forward and backward (profile_counts)", NULL},
    {"weights_version", (getter)Graph_get_weights_version,
     (setter)Graph_set_weights_version,
     "the version of the initializers' values, changed by the caller after every write to "
     "them; -1 (the default): none, no packed copy of a weight is read (packed.c)", NULL},
    {"weights_packable", (getter)Graph_get_weights_packable, NULL,
     "whether a forward had a product that would read a packed weight given a "
     "weights_version", NULL},
    {"input_names", (getter)Graph_get_input_names, NULL, "graph inputs", NULL},
    {"output_names", (getter)Graph_get_output_names, NULL, "graph outputs", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot Graph_slots[] = {
    {Py_tp_doc, (void *)"Graph() — the engine's computation graph (built by load_onnx)."},
    {Py_tp_new, Graph_new},
    {Py_tp_dealloc, Graph_dealloc},
    {Py_tp_traverse, Graph_traverse},
    {Py_tp_methods, Graph_methods},
    {Py_tp_getset, Graph_getset},
    {0, NULL},
};

PyType_Spec Graph_spec = {
    .name = "aidge_interop._C.Graph",
    .basicsize = sizeof(GraphObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_IMMUTABLETYPE,
    .slots = Graph_slots,
};
