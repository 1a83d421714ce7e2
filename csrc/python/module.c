/*
 * module.c — the CPython binding of the engine core: aidge_interop._C.
 *
 * The binding (csrc/python/) is the only C that knows Python: this file
 * holds the module functions (SGD, zeros, compare, threads, ...), the
 * module state and its multi-phase initialisation, and maps engine
 * statuses to Python exceptions; tensor.c and graph.c hold the two types
 * (bindings.h: what the three share).
 */
#include "bindings.h"

#include <string.h>

#include "graph.h"
#include "kernels/attn_tiles.h"
#include "kernels/gemm.h"
#include "kernels/qkernels.h"
#include "kernels/simd.h"
#include "parallel.h"

/* ------------------------------------------------------------ errors */

PyObject *raise_status(ai_status st)
{
    PyObject *exc;
    switch (st) {
    case AI_ERR_VALUE: exc = PyExc_ValueError; break;
    case AI_ERR_TYPE: exc = PyExc_TypeError; break;
    case AI_ERR_NOMEM: exc = PyExc_MemoryError; break;
    case AI_ERR_NOT_IMPLEMENTED: exc = PyExc_NotImplementedError; break;
    case AI_ERR_INDEX: exc = PyExc_IndexError; break;
    default: exc = PyExc_RuntimeError; break;
    }
    PyErr_SetString(exc, ai_last_error());
    return NULL;
}

/* ------------------------------------------------------------ SGD */

static PyObject *py_sgd_step(PyObject *module, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"params", "grads", "buffers", "lr", "momentum", "dampening",
                             "weight_decay", "nesterov", "maximize", "started", NULL};
    PyObject *ps, *gs, *bs;
    ai_sgd_config cfg = {0};
    int nesterov = 0, maximize = 0, started = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOOd|dddppp:sgd_step", kwlist, &ps, &gs, &bs,
                                     &cfg.lr, &cfg.momentum, &cfg.dampening, &cfg.weight_decay,
                                     &nesterov, &maximize, &started))
        return NULL;
    cfg.nesterov = nesterov;
    cfg.maximize = maximize;
    PyTypeObject *tt = ((module_state *)PyModule_GetState(module))->tensor_type;
    PyObject *seqs[3] = {PySequence_Fast(ps, "params"), PySequence_Fast(gs, "grads"),
                         bs == Py_None ? NULL : PySequence_Fast(bs, "buffers")};
    PyObject *res = NULL;
    ai_tensor **arr = NULL;
    if (!seqs[0] || !seqs[1] || (bs != Py_None && !seqs[2]))
        goto done;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seqs[0]);
    for (int k = 1; k < 3; k++)
        if (seqs[k] && PySequence_Fast_GET_SIZE(seqs[k]) != n) {
            PyErr_SetString(PyExc_ValueError, "params, grads and buffers differ in length");
            goto done;
        }
    if (!(arr = PyMem_Calloc(3 * (size_t)n + 1, sizeof *arr))) {
        PyErr_NoMemory();
        goto done;
    }
    for (int k = 0; k < 3; k++)
        for (Py_ssize_t i = 0; seqs[k] && i < n; i++) {
            PyObject *o = PySequence_Fast_GET_ITEM(seqs[k], i);
            if (!PyObject_TypeCheck(o, tt)) {
                PyErr_Format(PyExc_TypeError, "sgd_step: every item must be a Tensor");
                goto done;
            }
            arr[k * n + i] = ((TensorObject *)o)->t;
        }
    bool st_flag = started;
    ai_status st;
    Py_BEGIN_ALLOW_THREADS
    st = ai_sgd_step(&cfg, (int)n, arr, (const ai_tensor *const *)arr + n,
                     seqs[2] ? arr + 2 * n : NULL, &st_flag);
    Py_END_ALLOW_THREADS
    if (st)
        raise_status(st);
    else
        res = Py_NewRef(Py_None);
done:
    PyMem_Free(arr);
    for (int k = 0; k < 3; k++)
        Py_XDECREF(seqs[k]);
    return res;
}

static PyObject *py_zero_tensors(PyObject *module, PyObject *arg)
{
    PyTypeObject *tt = ((module_state *)PyModule_GetState(module))->tensor_type;
    PyObject *seq = PySequence_Fast(arg, "zero_tensors takes a sequence of Tensors");
    if (!seq)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    ai_tensor **arr = PyMem_Calloc((size_t)n + 1, sizeof *arr);
    PyObject *res = NULL;
    if (!arr) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *o = PySequence_Fast_GET_ITEM(seq, i);
        if (!PyObject_TypeCheck(o, tt)) {
            PyErr_Format(PyExc_TypeError, "zero_tensors: item %zd must be a Tensor, not %.100s",
                         i, Py_TYPE(o)->tp_name);
            goto done;
        }
        arr[i] = ((TensorObject *)o)->t;
    }
    ai_status st;
    Py_BEGIN_ALLOW_THREADS
    st = ai_zero_tensors((int)n, arr);
    Py_END_ALLOW_THREADS
    res = st ? raise_status(st) : Py_NewRef(Py_None);
done:
    PyMem_Free(arr);
    Py_DECREF(seq);
    return res;
}

static PyObject *py_supported_operators(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    PyObject *list = PyList_New(0);
    for (int i = 0; list; i++) {
        const ai_op_def *op = ai_op_at(i);
        if (!op)
            break;
        PyObject *item = Py_BuildValue("(ssO)", op->domain, op->name,
                                       op->backward ? Py_True : Py_False);
        if (!item || PyList_Append(list, item) < 0)
            Py_CLEAR(list);
        Py_XDECREF(item);
    }
    return list;
}

static PyObject *py_gemm_backend(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    return PyUnicode_FromString(ai_gemm_backend());
}

static PyObject *py_set_num_threads(PyObject *module, PyObject *arg)
{
    (void)module;
    long n = PyLong_AsLong(arg);
    if (n == -1 && PyErr_Occurred())
        return NULL;
    if (n < 1)
        return PyErr_Format(PyExc_ValueError, "number of threads must be >= 1, got %ld", n);
    ai_set_num_threads(n > AI_MAX_THREADS ? AI_MAX_THREADS : (int)n);
    return Py_NewRef(Py_None);
}

/* None: no limit; an int in [1, SIZE_MAX] (the checks are in __init__.py). */
static PyObject *py_set_memory_limit(PyObject *module, PyObject *arg)
{
    (void)module;
    size_t n = AI_NO_MEMORY_LIMIT;
    if (arg != Py_None && (n = PyLong_AsSize_t(arg)) == (size_t)-1 && PyErr_Occurred())
        return NULL;
    if (!n)
        return PyErr_Format(PyExc_ValueError, "memory limit must be >= 1 byte");
    ai_set_memory_limit(n);
    return Py_NewRef(Py_None);
}

static PyObject *py_get_memory_limit(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    size_t n = ai_memory_limit();
    if (n == AI_NO_MEMORY_LIMIT)
        return Py_NewRef(Py_None);
    return PyLong_FromSize_t(n);
}

static PyObject *py_get_num_threads(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    return PyLong_FromLong(ai_get_num_threads());
}

/* set_avx512(on) -> whether the AVX-512 kernels now run (False where the
 * CPU or the build has none) */
static PyObject *py_set_avx512(PyObject *module, PyObject *arg)
{
    (void)module;
    const int on = PyObject_IsTrue(arg);
    if (on < 0)
        return NULL;
    ai_set_avx512(on);
    return PyBool_FromLong(ai_cpu_avx512());
}

/* _set_fast_kernels(on) -> on: the fast row kernels, or their reference twins */
static PyObject *py_set_fast_kernels(PyObject *module, PyObject *arg)
{
    (void)module;
    const int on = PyObject_IsTrue(arg);
    if (on < 0)
        return NULL;
    ai_set_fast_kernels(on);
    return PyBool_FromLong(ai_fast_kernels());
}

/* _attn_lanes() -> the lanes of the attention node's float32 tiles that run
 * (0: its reference) */
static PyObject *py_attn_lanes(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    return PyLong_FromLong(ai_attn_lanes());
}

/* _set_quant_path(path) -> the path of the int8 kernels now used (at most
 * `path`: 0 the portable reference, 1 plain, 2 AVX2, 3 AVX-512 VNNI) */
static PyObject *py_set_quant_path(PyObject *module, PyObject *arg)
{
    (void)module;
    const long path = PyLong_AsLong(arg);
    if (path == -1 && PyErr_Occurred())
        return NULL;
    return PyLong_FromLong(ai_q_set_path(path < 0 ? 0 : path > AI_Q_VNNI ? AI_Q_VNNI
                                                                          : (int)path));
}

static PyObject *py_quant_path(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    return PyLong_FromLong(ai_q_path());
}

/* ------------------------------------------------------------ module functions */

static PyObject *py_empty(PyObject *module, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"shape", "dtype", NULL};
    PyObject *shape_obj, *dtype_obj = NULL;
    ai_dtype dt = AI_F32;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O|O:zeros", kwlist, &shape_obj, &dtype_obj))
        return NULL;
    if (dtype_obj && !dtype_converter(dtype_obj, &dt))
        return NULL;
    PyObject *seq = PySequence_Fast(shape_obj, "argument 'shape' must be a sequence of ints");
    if (!seq)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (n > AI_MAX_DIMS) {
        Py_DECREF(seq);
        return PyErr_Format(PyExc_ValueError, "argument 'shape' has rank %zd; at most %d",
                            n, AI_MAX_DIMS);
    }
    int64_t shape[AI_MAX_DIMS];
    for (Py_ssize_t i = 0; i < n; i++) {
        shape[i] = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(seq, i));
        if (shape[i] == -1 && PyErr_Occurred()) {
            Py_DECREF(seq);
            return NULL;
        }
    }
    Py_DECREF(seq);
    ai_tensor *t;
    ai_status st = ai_tensor_new(&t, dt, (int)n, shape);
    if (st)
        return raise_status(st);
    return tensor_wrap(((module_state *)PyModule_GetState(module))->tensor_type, t);
}

static PyObject *py_debug_counters(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    return Py_BuildValue("{s:L,s:L,s:L}", "tensors", (long long)ai_debug_live_tensors(),
                         "storages", (long long)ai_debug_live_storages(), "owned_bytes",
                         (long long)ai_debug_owned_bytes());
}

static PyObject *py_compare(PyObject *module, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"actual", "expected", "rtol", "atol", "equal_nan", NULL};
    PyObject *objs[2];
    double rtol, atol;
    int equal_nan = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOdd|p:compare", kwlist, &objs[0], &objs[1],
                                     &rtol, &atol, &equal_nan))
        return NULL;
    PyTypeObject *tt = ((module_state *)PyModule_GetState(module))->tensor_type;
    PyObject *ops[2] = {NULL, NULL}, *res = NULL;
    for (int k = 0; k < 2; k++) {
        ops[k] = tensor_from_object(tt, objs[k], 0);
        if (!ops[k] && PyErr_ExceptionMatches(PyExc_ValueError)) {
            /* an overlapping view (from expand) is read through a copy */
            PyErr_Clear();
            ops[k] = tensor_from_object(tt, objs[k], 1);
        }
        if (!ops[k])
            goto done;
    }
    const ai_tensor *a = ((TensorObject *)ops[0])->t, *e = ((TensorObject *)ops[1])->t;
    ai_compare_result r;
    ai_status st;
    if (ai_tensor_nbytes(a) >= (1u << 20)) {
        Py_BEGIN_ALLOW_THREADS
        st = ai_compare(a, e, rtol, atol, equal_nan, &r);
        Py_END_ALLOW_THREADS
    } else {
        st = ai_compare(a, e, rtol, atol, equal_nan, &r);
    }
    if (st) {
        raise_status(st);
        goto done;
    }
    res = Py_BuildValue("{s:L,s:L,s:d,s:N,s:d,s:N}", "numel", (long long)r.numel,
                        "mismatches", (long long)r.mismatches, "max_abs_diff", r.max_abs_diff,
                        "max_abs_index",
                        r.max_abs_index < 0 ? Py_NewRef(Py_None)
                                            : PyLong_FromLongLong(r.max_abs_index),
                        "max_rel_diff", r.max_rel_diff, "max_rel_index",
                        r.max_rel_index < 0 ? Py_NewRef(Py_None)
                                            : PyLong_FromLongLong(r.max_rel_index));
done:
    Py_XDECREF(ops[0]);
    Py_XDECREF(ops[1]);
    return res;
}

/* value == expected: 1, 0, or -1 with an exception (value NULL: a failed
 * call, its exception set); the reference to value is consumed. */
static int steal_equals(PyObject *value, PyObject *expected)
{
    if (!value)
        return -1;
    int eq = PyObject_RichCompareBool(value, expected, Py_EQ);
    Py_DECREF(value);
    return eq;
}

/* grads_unchanged(params, grads, ptrs): whether, for every i,
 * params[i].grad is grads[i] (the same object, or None for None) and, where
 * it is a tensor, params[i] still requires grad, the gradient is still
 * contiguous, and params[i] and grads[i] still have the data pointers
 * ptrs[2 i] and ptrs[2 i + 1]; False also where the lists differ in length
 * (params is the optimizer's own list). Torch tensors, read through their
 * Python attributes: the check of SGD's cached engine views (optim.py), in
 * one call instead of five Python operations per parameter. */
static PyObject *py_grads_unchanged(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 3 || !PyList_Check(args[0]) || !PyList_Check(args[1]) ||
        !PyList_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "grads_unchanged(params, grads, ptrs) takes 3 lists");
        return NULL;
    }
    static PyObject *names[4]; /* interned once: grad, requires_grad, is_contiguous, data_ptr */
    static const char *const spelled[4] = {"grad", "requires_grad", "is_contiguous", "data_ptr"};
    for (int k = 0; k < 4; k++)
        if (!names[k] && !(names[k] = PyUnicode_InternFromString(spelled[k])))
            return NULL;
    int same = 1;
    /* (the sizes read at every turn: a tensor subclass's Python could change a list;
     * params is the caller's list: one added or removed since gives False) */
    for (Py_ssize_t i = 0; same > 0; i++) {
        const Py_ssize_t n = PyList_GET_SIZE(args[0]);
        if (PyList_GET_SIZE(args[1]) != n || PyList_GET_SIZE(args[2]) != 2 * n)
            Py_RETURN_FALSE;
        if (i == n)
            break;
        PyObject *p = Py_NewRef(PyList_GET_ITEM(args[0], i));
        PyObject *g = Py_NewRef(PyList_GET_ITEM(args[1], i));
        PyObject *ptrs[2] = {Py_NewRef(PyList_GET_ITEM(args[2], 2 * i)),
                             Py_NewRef(PyList_GET_ITEM(args[2], 2 * i + 1))};
        PyObject *cur = PyObject_GetAttr(p, names[0]);
        same = cur ? cur == g : -1;
        Py_XDECREF(cur);
        if (same > 0 && g != Py_None)
            same = steal_equals(PyObject_GetAttr(p, names[1]), Py_True);
        if (same > 0 && g != Py_None)
            same = steal_equals(PyObject_CallMethodNoArgs(g, names[2]), Py_True);
        if (same > 0 && g != Py_None)
            same = steal_equals(PyObject_CallMethodNoArgs(p, names[3]), ptrs[0]);
        if (same > 0 && g != Py_None)
            same = steal_equals(PyObject_CallMethodNoArgs(g, names[3]), ptrs[1]);
        Py_DECREF(p);
        Py_DECREF(g);
        Py_DECREF(ptrs[0]);
        Py_DECREF(ptrs[1]);
    }
    if (same < 0)
        return NULL;
    return PyBool_FromLong(same);
}

/* data_moved(tensors, ptrs): the index of the first tensor whose data_ptr()
 * is no longer ptrs[i], or -1: an AidgeModule's check, at each forward,
 * that its parameters and buffers still view the engine's memory (torch's
 * `p.data = t` gives a tensor other memory); one call instead of a Python
 * loop. */
static PyObject *py_data_moved(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 2 || !PyList_Check(args[0]) || !PyList_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "data_moved(tensors, ptrs) takes 2 lists");
        return NULL;
    }
    static PyObject *name; /* interned once */
    if (!name && !(name = PyUnicode_InternFromString("data_ptr")))
        return NULL;
    for (Py_ssize_t i = 0;; i++) {
        /* (the sizes read at every turn: a tensor subclass's Python could change a list) */
        if (i >= PyList_GET_SIZE(args[0]) || i >= PyList_GET_SIZE(args[1]))
            return PyLong_FromLong(-1);
        PyObject *t = Py_NewRef(PyList_GET_ITEM(args[0], i));
        PyObject *ptr = Py_NewRef(PyList_GET_ITEM(args[1], i));
        int same = steal_equals(PyObject_CallMethodNoArgs(t, name), ptr);
        Py_DECREF(t);
        Py_DECREF(ptr);
        if (same < 0)
            return NULL;
        if (!same)
            return PyLong_FromSsize_t(i);
    }
}

static PyMethodDef module_methods[] = {
    {"zeros", (PyCFunction)(void (*)(void))py_empty, METH_VARARGS | METH_KEYWORDS,
     "zeros(shape, dtype='float32') -> Tensor owning zero-filled memory."},
    {"_debug_counters", py_debug_counters, METH_NOARGS,
     "Live engine tensors, storages and owned bytes (leak checks)."},
    {"compare", (PyCFunction)(void (*)(void))py_compare, METH_VARARGS | METH_KEYWORDS,
     "compare(actual, expected, rtol, atol, equal_nan=False) -> dict: numel, mismatches, "
     "max_abs_diff, max_abs_index, max_rel_diff, max_rel_index (flat indices, None when "
     "empty), by the torch.testing.assert_close rule, in one pass in C."},
    {"zero_tensors", (PyCFunction)py_zero_tensors, METH_O,
     "zero_tensors(tensors): zeroes each Tensor (contiguous, writable) in place."},
    {"sgd_step", (PyCFunction)(void (*)(void))py_sgd_step, METH_VARARGS | METH_KEYWORDS,
     "sgd_step(params, grads, buffers, lr, momentum=0, dampening=0, weight_decay=0, "
     "nesterov=False, maximize=False, started=False): one torch.optim.SGD step in C."},
    {"grads_unchanged", (PyCFunction)(void (*)(void))py_grads_unchanged, METH_FASTCALL,
     "grads_unchanged(params, grads, ptrs) -> bool: params[i].grad is grads[i] and, where "
     "not None, params[i] requires grad, the gradient is contiguous, the data pointers are "
     "ptrs[2i], ptrs[2i+1]."},
    {"data_moved", (PyCFunction)(void (*)(void))py_data_moved, METH_FASTCALL,
     "data_moved(tensors, ptrs) -> int: the first i where tensors[i].data_ptr() != ptrs[i], "
     "or -1."},
    {"autograd_backward", (PyCFunction)(void (*)(void))py_autograd_backward, METH_FASTCALL,
     "autograd_backward(ctx, grad_outputs, bridge) -> (None, None, *input gradients), or "
     "None: the torch bridge's backward checks, and its engine call for a module without "
     "parameters (bridge/wrapping.py)."},
    {"node_apply", (PyCFunction)(void (*)(void))py_node_apply, METH_FASTCALL,
     "node_apply(bridge, rest) -> a method descriptor: apply(ctx, *grad_outputs) is "
     "autograd_backward(ctx, grad_outputs, bridge), or rest(ctx, grad_outputs) where that "
     "is None."},
    {"module_call", (PyCFunction)(void (*)(void))py_module_call, METH_FASTCALL,
     "module_call(cls, bridge, slow, graph_call, tensor_type, nn_module, tracing_state, "
     "grad_enabled, data_reads, no_subclass_tf) -> a method descriptor: AidgeModule's __call__, its "
     "steady-state forward without grad in C, slow(self, *args, **kwargs) otherwise "
     "(bridge/wrapping.py)."},
    {"supported_operators", py_supported_operators, METH_NOARGS,
     "[(domain, op_type, has_backward)] for every operator of the engine."},
    {"gemm_backend", py_gemm_backend, METH_NOARGS, "The GEMM library in use."},
    {"set_num_threads", py_set_num_threads, METH_O, "Threads of the engine (its pool; GEMMs included)."},
    {"_set_avx512", py_set_avx512, METH_O,
     "_set_avx512(on) -> bool: the engine's AVX-512 kernels on (where the CPU has AVX-512) or off "
     "(8-lane kernels); returns whether they now run. For tests and benchmarks."},
    {"_set_fast_kernels", py_set_fast_kernels, METH_O,
     "_set_fast_kernels(on) -> bool: the fast row kernels (float32 LayerNormalization "
     "backward, ...) on, or off (their portable reference twins); returns the setting. "
     "For tests."},
    {"_attn_lanes", py_attn_lanes, METH_NOARGS,
     "_attn_lanes() -> int: the lanes of the attention node's float32 tiles that run (16 "
     "AVX-512, 8 AVX2, 0 none: its reference GEMMs), following _set_avx512 and "
     "_set_fast_kernels. For tests."},
    {"_set_quant_path", py_set_quant_path, METH_O,
     "_set_quant_path(path) -> int: the int8 kernels of the quantized operators, at most "
     "`path` (0 the portable reference kernels, 1 plain C, 2 AVX2, 3 AVX-512 VNNI; capped to "
     "what the CPU has); returns the path now used. For tests and benchmarks."},
    {"_quant_path", py_quant_path, METH_NOARGS,
     "_quant_path() -> int: the path of the int8 kernels in use (see _set_quant_path)."},
    {"get_num_threads", py_get_num_threads, METH_NOARGS, "Threads of the engine."},
    {"set_memory_limit", py_set_memory_limit, METH_O,
     "The plans' memory limit in bytes (None: no limit)."},
    {"get_memory_limit", py_get_memory_limit, METH_NOARGS,
     "The plans' memory limit in bytes (None: no limit)."},
    {NULL, NULL, 0, NULL},
};

/* ------------------------------------------------------------ module */

static int module_exec(PyObject *m)
{
    if (PyArray_ImportNumPyAPI() < 0)
        return -1;
    module_state *st = PyModule_GetState(m);
    st->tensor_type = (PyTypeObject *)PyType_FromModuleAndSpec(m, &Tensor_spec, NULL);
    if (!st->tensor_type)
        return -1;
    if (PyModule_AddType(m, st->tensor_type) < 0)
        return -1;
    st->graph_type = (PyTypeObject *)PyType_FromModuleAndSpec(m, &Graph_spec, NULL);
    if (!st->graph_type || PyModule_AddType(m, st->graph_type) < 0)
        return -1;
    PyObject *dtypes = PyTuple_New(AI_DTYPE_COUNT);
    if (!dtypes)
        return -1;
    for (int i = 0; i < AI_DTYPE_COUNT; i++)
        PyTuple_SET_ITEM(dtypes, i, PyUnicode_FromString(ai_dtype_name((ai_dtype)i)));
    if (PyModule_AddObject(m, "DTYPES", dtypes) < 0) {
        Py_DECREF(dtypes);
        return -1;
    }
    if (PyModule_AddIntConstant(m, "MAX_DIMS", AI_MAX_DIMS) < 0)
        return -1;
    return 0;
}

static int module_traverse(PyObject *m, visitproc visit, void *arg)
{
    module_state *st = PyModule_GetState(m);
    Py_VISIT(st->tensor_type);
    Py_VISIT(st->graph_type);
    return 0;
}

static int module_clear(PyObject *m)
{
    module_state *st = PyModule_GetState(m);
    Py_CLEAR(st->tensor_type);
    Py_CLEAR(st->graph_type);
    return 0;
}

static void module_free(void *m) { module_clear((PyObject *)m); }

static PyModuleDef_Slot module_slots[] = {
    {Py_mod_exec, module_exec},
    {0, NULL},
};

struct PyModuleDef aidge_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "aidge_interop._C",
    .m_doc = "C engine of aidge_interop: tensors (and, later, graphs).",
    .m_size = sizeof(module_state),
    .m_methods = module_methods,
    .m_slots = module_slots,
    .m_traverse = module_traverse,
    .m_clear = module_clear,
    .m_free = module_free,
};

PyMODINIT_FUNC PyInit__C(void) { return PyModuleDef_Init(&aidge_module); }
