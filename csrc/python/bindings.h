/*
 * bindings.h — what the files of the CPython binding (aidge_interop._C)
 * share: the module state, the Tensor object, the status -> exception
 * mapping and the conversions the Graph type and the module functions use.
 * Private to csrc/python/ (the build hides every symbol but PyInit__C).
 *
 *   module.c  module functions, module state, multi-phase init
 *   tensor.c  the Tensor type: NumPy, DLPack and buffer conversions
 *   graph.c   the Graph type
 */
#ifndef AI_PYTHON_BINDINGS_H
#define AI_PYTHON_BINDINGS_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* One NumPy C API table for the extension: module.c imports it (its exec
 * slot calls PyArray_ImportNumPyAPI); the other files define
 * NO_IMPORT_ARRAY before including this header. */
#define PY_ARRAY_UNIQUE_SYMBOL aidge_interop_ARRAY_API
#define NPY_NO_DEPRECATED_API NPY_2_0_API_VERSION
#include <numpy/arrayobject.h>

#include <stdbool.h>

#include "aidge.h"

/* ------------------------------------------------------------ module (module.c) */

typedef struct {
    PyTypeObject *tensor_type;
    PyTypeObject *graph_type;
} module_state;

extern struct PyModuleDef aidge_module;

/* Sets the Python exception of an engine status (its message:
 * ai_last_error()); returns NULL. */
PyObject *raise_status(ai_status st);

/* PyErr_Format for functions that return -1 on error */
#define fail_format(...) (PyErr_Format(__VA_ARGS__), -1)

/* ------------------------------------------------------------ Tensor (tensor.c) */

typedef struct {
    PyObject_HEAD
    ai_tensor *t;
    PyObject *origin_device; /* where a converted torch tensor came from */
    PyObject *weakreflist;
} TensorObject;

extern PyType_Spec Tensor_spec;

/* A Tensor of type tp owning t (t is freed on failure). */
PyObject *tensor_wrap(PyTypeObject *tp, ai_tensor *t);
/* A Tensor viewing obj (Tensor, NumPy array, DLPack producer, sequence), or
 * an owned contiguous copy when `copy`. */
PyObject *tensor_from_object(PyTypeObject *tp, PyObject *obj, int copy);
/* "O&" converter: a dtype name or anything NumPy reads as a dtype. */
int dtype_converter(PyObject *obj, void *addr);
/* A contiguous copy of src (the GIL released for large copies). */
ai_status clone_maybe_nogil(ai_tensor **out, const ai_tensor *src);
/* An engine view of a DLPack capsule's tensor (consumed), or a contiguous
 * copy when `copy`: 0, or -1 with an exception set. */
int capsule_view(PyObject *cap, int copy, ai_tensor **out);
/* A DLPack capsule of self (zero copy unless copy_obj is true or the
 * strides are negative; copy_obj False forbids the copy). */
PyObject *tensor_capsule(TensorObject *self, int versioned, PyObject *copy_obj);
/* A DLPack capsule that takes over t without a Tensor object (tensor.c). */
PyObject *result_capsule(ai_tensor *t);
/* Whether t has a negative stride on an axis of more than one element. */
bool negative_strides(const ai_tensor *t);
/* (v[0] * scale, ..., v[n-1] * scale) */
PyObject *int64_tuple(int n, const int64_t *v, int64_t scale);

/* ------------------------------------------------------------ Graph (graph.c) */

extern PyType_Spec Graph_spec;
PyObject *py_autograd_backward(PyObject *unused, PyObject *const *args, Py_ssize_t nargs);
PyObject *py_node_apply(PyObject *unused, PyObject *const *args, Py_ssize_t nargs);
PyObject *py_module_call(PyObject *unused, PyObject *const *args, Py_ssize_t nargs);

#endif
