/*
 * module.c — the CPython binding of the engine core: aidge_interop._C.
 *
 * The only file that knows Python. It turns Python objects into ai_tensor
 * views (NumPy arrays through the NumPy C API, anything else through
 * DLPack), exports tensors back (buffer protocol, __array_interface__,
 * DLPack), and maps engine statuses to Python exceptions.
 *
 * Multi-phase initialisation; the Tensor type lives in the module state.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#define PY_ARRAY_UNIQUE_SYMBOL aidge_interop_ARRAY_API
#define NPY_NO_DEPRECATED_API NPY_2_0_API_VERSION
#include <numpy/arrayobject.h>

#include <stdatomic.h>
#include <string.h>

#include "aidge.h"
#include "dlpack.h"
#include "graph.h"
#include "kernels/gemm.h"
#include "kernels/simd.h"
#include "parallel.h"

/* ------------------------------------------------------------ state */

typedef struct {
    PyTypeObject *tensor_type;
    PyTypeObject *graph_type;
} module_state;

static struct PyModuleDef aidge_module;

typedef struct {
    PyObject_HEAD
    ai_tensor *t;
    PyObject *origin_device; /* where a converted torch tensor came from */
    PyObject *weakreflist;
} TensorObject;

/* ------------------------------------------------------------ errors */

static PyObject *raise_status(ai_status st)
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

/* PyErr_Format for functions that return -1 on error */
#define fail_format(...) (PyErr_Format(__VA_ARGS__), -1)

/* ------------------------------------------------------------ dtypes */

static const struct {
    int npy;
    const char *format;  /* buffer protocol (struct module) */
    const char *typestr; /* __array_interface__, without the byte order */
    DLDataType dl;
} dtype_map[] = {
    [AI_F32] = {NPY_FLOAT32, "f", "f4", {kDLFloat, 32, 1}},
    [AI_F64] = {NPY_FLOAT64, "d", "f8", {kDLFloat, 64, 1}},
    [AI_F16] = {NPY_FLOAT16, "e", "f2", {kDLFloat, 16, 1}},
    [AI_I8] = {NPY_INT8, "b", "i1", {kDLInt, 8, 1}},
    [AI_U8] = {NPY_UINT8, "B", "u1", {kDLUInt, 8, 1}},
    [AI_I16] = {NPY_INT16, "h", "i2", {kDLInt, 16, 1}},
    [AI_I32] = {NPY_INT32, "i", "i4", {kDLInt, 32, 1}},
    [AI_I64] = {NPY_INT64, "q", "i8", {kDLInt, 64, 1}},
    [AI_BOOL] = {NPY_BOOL, "?", "b1", {kDLBool, 8, 1}},
};
_Static_assert(sizeof dtype_map / sizeof dtype_map[0] == AI_DTYPE_COUNT,
               "one binding entry per dtype");

#define SUPPORTED_DTYPES \
    "float32, float64, float16, int8, uint8, int16, int32, int64, bool"

static int dtype_from_npy(int npy, ai_dtype *out)
{
    for (int i = 0; i < AI_DTYPE_COUNT; i++) {
        /* NPY_INT64 and NPY_LONGLONG are both 8-byte integers */
        if (dtype_map[i].npy == npy ||
            (PyArray_EquivTypenums(dtype_map[i].npy, npy))) {
            *out = (ai_dtype)i;
            return 0;
        }
    }
    return -1;
}

static int dtype_from_dl(DLDataType dl, ai_dtype *out)
{
    for (int i = 0; i < AI_DTYPE_COUNT; i++) {
        if (dtype_map[i].dl.code == dl.code && dtype_map[i].dl.bits == dl.bits &&
            dl.lanes == 1) {
            *out = (ai_dtype)i;
            return 0;
        }
    }
    return -1;
}

static const char *dl_code_name(uint8_t code)
{
    switch (code) {
    case kDLInt: return "int";
    case kDLUInt: return "uint";
    case kDLFloat: return "float";
    case kDLBfloat: return "bfloat";
    case kDLComplex: return "complex";
    case kDLBool: return "bool";
    default: return "opaque";
    }
}

/* ai_dtype from a Python object: a name ("float32") or anything numpy
 * understands as a dtype (np.float32, "f4", torch dtypes are handled by
 * the Python layer). */
static int dtype_converter(PyObject *obj, void *addr)
{
    ai_dtype *out = addr;
    PyArray_Descr *descr = NULL;
    if (PyUnicode_Check(obj)) {
        const char *name = PyUnicode_AsUTF8(obj);
        if (!name)
            return 0;
        if (ai_dtype_from_name(name, out) == AI_OK)
            return 1;
    }
    if (!PyArray_DescrConverter2(obj, &descr))
        return 0;
    if (!descr || dtype_from_npy(descr->type_num, out) < 0) {
        PyErr_Format(PyExc_TypeError, "unsupported dtype %R (supported: %s)",
                     obj, SUPPORTED_DTYPES);
        Py_XDECREF(descr);
        return 0;
    }
    Py_DECREF(descr);
    return 1;
}

/* ------------------------------------------------------------ tensor object */

static PyObject *tensor_wrap(PyTypeObject *tp, ai_tensor *t)
{
    TensorObject *self = (TensorObject *)tp->tp_alloc(tp, 0);
    if (!self) {
        ai_tensor_free(t);
        return NULL;
    }
    self->t = t;
    self->origin_device = Py_NewRef(Py_None);
    return (PyObject *)self;
}

/* Storage release for memory borrowed from a Python object. Called from
 * whichever thread drops the last reference, GIL held or not. */
static void release_pyobject(void *ctx)
{
    PyGILState_STATE g = PyGILState_Ensure();
    Py_DECREF((PyObject *)ctx);
    PyGILState_Release(g);
}

static void release_dl(void *ctx)
{
    DLManagedTensor *m = ctx;
    if (m->deleter)
        m->deleter(m);
}

static void release_dl_versioned(void *ctx)
{
    DLManagedTensorVersioned *m = ctx;
    if (m->deleter)
        m->deleter(m);
}

/* Large copies release the GIL; the caller holds references to both sides. */
static ai_status copy_maybe_nogil(ai_tensor *dst, const ai_tensor *src)
{
    ai_status st;
    if (ai_tensor_nbytes(src) >= (1u << 20)) {
        Py_BEGIN_ALLOW_THREADS
        st = ai_tensor_copy(dst, src);
        Py_END_ALLOW_THREADS
    } else {
        st = ai_tensor_copy(dst, src);
    }
    return st;
}

static ai_status clone_maybe_nogil(ai_tensor **out, const ai_tensor *src)
{
    ai_status st = ai_tensor_new(out, src->dtype, src->ndim, src->shape);
    if (st == AI_OK && (st = copy_maybe_nogil(*out, src)) != AI_OK) {
        ai_tensor_free(*out);
        *out = NULL;
    }
    return st;
}

/* Wraps `t`, or an owned copy of it when `copy` (then frees `t`). */
static PyObject *finish_tensor(PyTypeObject *tp, ai_tensor *t, int copy)
{
    if (copy) {
        ai_tensor *c;
        ai_status st = clone_maybe_nogil(&c, t);
        ai_tensor_free(t);
        if (st)
            return raise_status(st);
        t = c;
    }
    return tensor_wrap(tp, t);
}

static PyObject *tensor_from_ndarray(PyTypeObject *tp, PyArrayObject *arr,
                                     int copy)
{
    ai_dtype dt;
    PyArray_Descr *descr = PyArray_DESCR(arr);
    if (dtype_from_npy(descr->type_num, &dt) < 0) {
        PyErr_Format(PyExc_TypeError,
                     "unsupported dtype %S for argument 'data' (supported: %s)",
                     (PyObject *)descr, SUPPORTED_DTYPES);
        return NULL;
    }
    Py_INCREF(arr);
    int ndim = PyArray_NDIM(arr);
    if (ndim > AI_MAX_DIMS) {
        Py_DECREF(arr);
        return PyErr_Format(PyExc_ValueError,
                            "argument 'data' has rank %d; at most %d is supported",
                            ndim, AI_MAX_DIMS);
    }
    /* non-native byte order or strides that are not a whole number of
     * elements: make an aligned, native copy (NumPy allows both) */
    int itemsize = (int)PyArray_ITEMSIZE(arr);
    int needs_copy = !PyArray_ISNBO(descr->byteorder);
    for (int i = 0; i < ndim; i++)
        if (PyArray_STRIDE(arr, i) % itemsize != 0)
            needs_copy = 1;
    if (needs_copy) {
        PyArray_Descr *native = PyArray_DescrNewByteorder(descr, NPY_NATIVE);
        if (!native) {
            Py_DECREF(arr);
            return NULL;
        }
        PyObject *c = PyArray_FromArray(arr, native, NPY_ARRAY_C_CONTIGUOUS |
                                                        NPY_ARRAY_ENSURECOPY |
                                                        NPY_ARRAY_ALIGNED);
        Py_DECREF(arr);
        if (!c)
            return NULL;
        arr = (PyArrayObject *)c;
    }
    int64_t shape[AI_MAX_DIMS], strides[AI_MAX_DIMS];
    for (int i = 0; i < ndim; i++) {
        shape[i] = PyArray_DIM(arr, i);
        strides[i] = PyArray_STRIDE(arr, i) / itemsize;
    }
    int flags = PyArray_ISWRITEABLE(arr) ? 0 : AI_TENSOR_READONLY;
    ai_tensor *t;
    /* the storage keeps `arr` alive: the reference taken above moves into it */
    ai_status st = ai_tensor_borrow(&t, PyArray_DATA(arr), dt, ndim, shape,
                                    strides, flags, copy, release_pyobject,
                                    (PyObject *)arr);
    if (st) {
        if (st == AI_ERR_VALUE && strstr(ai_last_error(), "more than once"))
            return PyErr_Format(PyExc_ValueError,
                                "argument 'data': %s; pass copy=True to take a "
                                "contiguous copy", ai_last_error());
        return raise_status(st);
    }
    return finish_tensor(tp, t, copy);
}

/* An engine view of a DLPack capsule's tensor (consumed), or a contiguous
 * copy when `copy`: 0, or -1 with an exception set. */
static int capsule_view(PyObject *cap, int copy, ai_tensor **out)
{
    const int versioned = PyCapsule_IsValid(cap, "dltensor_versioned");
    if (!versioned && !PyCapsule_IsValid(cap, "dltensor")) {
        PyErr_SetString(PyExc_TypeError,
                        "__dlpack__() did not return a DLPack capsule (or the "
                        "capsule was already consumed)");
        return -1;
    }
    DLTensor *dl;
    uint64_t flags = 0;
    void *managed;
    if (versioned) {
        DLManagedTensorVersioned *m =
            PyCapsule_GetPointer(cap, "dltensor_versioned");
        if (m->version.major > DLPACK_MAJOR_VERSION)
            return fail_format(PyExc_BufferError,
                               "DLPack version %u.%u is newer than supported (1.x)",
                               m->version.major, m->version.minor);
        dl = &m->dl_tensor;
        flags = m->flags;
        managed = m;
    } else {
        DLManagedTensor *m = PyCapsule_GetPointer(cap, "dltensor");
        dl = &m->dl_tensor;
        managed = m;
    }
    if (dl->device.device_type != kDLCPU && dl->device.device_type != kDLCUDAHost)
        return fail_format(PyExc_ValueError,
                           "the tensor lives on DLPack device type %d, not the "
                           "CPU; copy it to the host first",
                           (int)dl->device.device_type);
    ai_dtype dt;
    if (dtype_from_dl(dl->dtype, &dt) < 0) {
        if (dl->dtype.code == kDLBfloat)
            return fail_format(PyExc_TypeError,
                               "unsupported dtype bfloat16 (supported: %s)",
                               SUPPORTED_DTYPES);
        if (dl->dtype.lanes != 1)
            return fail_format(PyExc_TypeError,
                               "unsupported dtype %s%u with %u lanes (supported: %s)",
                               dl_code_name(dl->dtype.code), dl->dtype.bits,
                               dl->dtype.lanes, SUPPORTED_DTYPES);
        return fail_format(PyExc_TypeError, "unsupported dtype %s%u (supported: %s)",
                           dl_code_name(dl->dtype.code), dl->dtype.bits,
                           SUPPORTED_DTYPES);
    }
    if (dl->ndim < 0 || dl->ndim > AI_MAX_DIMS)
        return fail_format(PyExc_ValueError,
                           "DLPack tensor has rank %d; at most %d is supported",
                           (int)dl->ndim, AI_MAX_DIMS);
    /* consume the capsule: from here on, we own the managed tensor */
    if (PyCapsule_SetName(cap, versioned ? "used_dltensor_versioned" : "used_dltensor"))
        return -1;
    ai_tensor *t;
    char *data = dl->data ? (char *)dl->data + dl->byte_offset : NULL;
    ai_status st = ai_tensor_borrow(
        &t, data, dt, dl->ndim, dl->shape, dl->strides,
        (flags & DLPACK_FLAG_BITMASK_READ_ONLY) ? AI_TENSOR_READONLY : 0, copy,
        versioned ? release_dl_versioned : release_dl, managed);
    if (st) {
        if (st == AI_ERR_VALUE && strstr(ai_last_error(), "more than once"))
            return fail_format(PyExc_ValueError,
                               "argument 'data': %s; pass copy=True to take a "
                               "contiguous copy", ai_last_error());
        raise_status(st);
        return -1;
    }
    if (copy) {
        ai_tensor *c;
        st = clone_maybe_nogil(&c, t);
        ai_tensor_free(t);
        if (st) {
            raise_status(st);
            return -1;
        }
        t = c;
    }
    *out = t;
    return 0;
}

static PyObject *tensor_from_dlpack_capsule(PyTypeObject *tp, PyObject *cap,
                                            int copy)
{
    ai_tensor *t;
    return capsule_view(cap, copy, &t) < 0 ? NULL : tensor_wrap(tp, t);
}



static PyObject *tensor_from_dlpack_obj(PyTypeObject *tp, PyObject *obj, int copy)
{
    PyObject *meth = PyObject_GetAttrString(obj, "__dlpack__");
    if (!meth)
        return NULL;
    /* ask for a versioned capsule; older producers do not take the keyword */
    PyObject *kw = Py_BuildValue("{s:(ii)}", "max_version", DLPACK_MAJOR_VERSION,
                                 DLPACK_MINOR_VERSION);
    PyObject *args = PyTuple_New(0);
    PyObject *cap = NULL;
    if (kw && args) {
        cap = PyObject_Call(meth, args, kw);
        if (!cap && PyErr_ExceptionMatches(PyExc_TypeError)) {
            PyErr_Clear();
            cap = PyObject_CallNoArgs(meth);
        }
    }
    Py_XDECREF(kw);
    Py_XDECREF(args);
    Py_DECREF(meth);
    if (!cap)
        return NULL;
    PyObject *res = tensor_from_dlpack_capsule(tp, cap, copy);
    Py_DECREF(cap);
    return res;
}

static PyObject *tensor_from_object(PyTypeObject *tp, PyObject *obj, int copy)
{
    if (PyObject_TypeCheck(obj, tp)) {
        ai_tensor *t;
        ai_status st = copy ? clone_maybe_nogil(&t, ((TensorObject *)obj)->t)
                            : ai_tensor_share(&t, ((TensorObject *)obj)->t);
        if (st)
            return raise_status(st);
        PyObject *res = tensor_wrap(tp, t);
        if (res)
            Py_SETREF(((TensorObject *)res)->origin_device,
                      Py_NewRef(((TensorObject *)obj)->origin_device));
        return res;
    }
    if (!PyArray_Check(obj) && PyObject_HasAttrString(obj, "__dlpack__"))
        return tensor_from_dlpack_obj(tp, obj, copy);
    if (!PyArray_Check(obj) && !PyObject_CheckBuffer(obj) &&
        !PyObject_HasAttrString(obj, "__array_interface__") &&
        !PyObject_HasAttrString(obj, "__array__") && !PySequence_Check(obj) &&
        !PyNumber_Check(obj))
        return PyErr_Format(PyExc_TypeError,
                            "argument 'data' must be a tensor, an array or a "
                            "sequence of numbers, not %.100s",
                            Py_TYPE(obj)->tp_name);
    PyObject *arr = PyArray_FromAny(obj, NULL, 0, 0, 0, NULL);
    if (!arr)
        return NULL;
    PyObject *res = tensor_from_ndarray(tp, (PyArrayObject *)arr, copy);
    Py_DECREF(arr);
    return res;
}

static PyObject *Tensor_new(PyTypeObject *tp, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"data", "copy", NULL};
    PyObject *data;
    int copy = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O|$p:Tensor", kwlist, &data, &copy))
        return NULL;
    return tensor_from_object(tp, data, copy);
}

static int Tensor_traverse(TensorObject *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(self->origin_device);
    return 0;
}

static void Tensor_dealloc(TensorObject *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    if (self->weakreflist)
        PyObject_ClearWeakRefs((PyObject *)self);
    Py_CLEAR(self->origin_device);
    ai_tensor_free(self->t);
    self->t = NULL;
    tp->tp_free((PyObject *)self);
    Py_DECREF(tp);
}

/* ------------------------------------------------------------ properties */

static PyObject *int64_tuple(int n, const int64_t *v, int64_t scale)
{
    PyObject *tup = PyTuple_New(n);
    if (!tup)
        return NULL;
    for (int i = 0; i < n; i++) {
        PyObject *x = PyLong_FromLongLong(v[i] * scale);
        if (!x) {
            Py_DECREF(tup);
            return NULL;
        }
        PyTuple_SET_ITEM(tup, i, x);
    }
    return tup;
}

static PyObject *Tensor_get_shape(TensorObject *self, void *c)
{
    (void)c;
    return int64_tuple(self->t->ndim, self->t->shape, 1);
}

static PyObject *Tensor_get_strides(TensorObject *self, void *c)
{
    (void)c;
    return int64_tuple(self->t->ndim, self->t->strides, 1);
}

static PyObject *Tensor_get_dtype(TensorObject *self, void *c)
{
    (void)c;
    return PyUnicode_FromString(ai_dtype_name(self->t->dtype));
}

static PyObject *Tensor_get_ndim(TensorObject *self, void *c)
{
    (void)c;
    return PyLong_FromLong(self->t->ndim);
}

static PyObject *Tensor_get_numel(TensorObject *self, void *c)
{
    (void)c;
    return PyLong_FromLongLong(ai_tensor_numel(self->t));
}

static PyObject *Tensor_get_nbytes(TensorObject *self, void *c)
{
    (void)c;
    return PyLong_FromSize_t(ai_tensor_nbytes(self->t));
}

static PyObject *Tensor_get_itemsize(TensorObject *self, void *c)
{
    (void)c;
    return PyLong_FromSize_t(ai_dtype_size(self->t->dtype));
}

static PyObject *Tensor_get_readonly(TensorObject *self, void *c)
{
    (void)c;
    return PyBool_FromLong(self->t->flags & AI_TENSOR_READONLY);
}

static PyObject *Tensor_get_data_ptr(TensorObject *self, void *c)
{
    (void)c;
    return PyLong_FromVoidPtr(self->t->data);
}

static PyObject *Tensor_get_origin_device(TensorObject *self, void *c)
{
    (void)c;
    return Py_NewRef(self->origin_device);
}

static int Tensor_set_origin_device(TensorObject *self, PyObject *v, void *c)
{
    (void)c;
    if (!v)
        v = Py_None;
    if (v != Py_None && !PyUnicode_Check(v)) {
        PyErr_SetString(PyExc_TypeError, "origin_device must be a str or None");
        return -1;
    }
    Py_SETREF(self->origin_device, Py_NewRef(v));
    return 0;
}

static char typestr_byteorder(ai_dtype dt)
{
    if (ai_dtype_size(dt) == 1)
        return '|';
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    return '>';
#else
    return '<';
#endif
}

static char empty_data[AI_ALIGN]; /* address handed out for empty tensors */

static void *export_ptr(const ai_tensor *t) { return t->data ? t->data : empty_data; }

static PyObject *Tensor_get_array_interface(TensorObject *self, void *c)
{
    (void)c;
    const ai_tensor *t = self->t;
    char typestr[4] = {typestr_byteorder(t->dtype), dtype_map[t->dtype].typestr[0],
                       dtype_map[t->dtype].typestr[1], 0};
    PyObject *shape = int64_tuple(t->ndim, t->shape, 1), *strides;
    if (ai_tensor_is_contiguous(t))
        strides = Py_NewRef(Py_None);
    else
        strides = int64_tuple(t->ndim, t->strides, (int64_t)ai_dtype_size(t->dtype));
    if (!shape || !strides) {
        Py_XDECREF(shape);
        Py_XDECREF(strides);
        return NULL;
    }
    return Py_BuildValue("{s:N,s:s,s:(NO),s:N,s:i}", "shape", shape, "typestr",
                         typestr, "data", PyLong_FromVoidPtr(export_ptr(t)),
                         (t->flags & AI_TENSOR_READONLY) ? Py_True : Py_False,
                         "strides", strides, "version", 3);
}

/* ------------------------------------------------------------ buffer protocol */

static int Tensor_getbuffer(TensorObject *self, Py_buffer *view, int flags)
{
    const ai_tensor *t = self->t;
    if ((flags & PyBUF_WRITABLE) == PyBUF_WRITABLE && (t->flags & AI_TENSOR_READONLY)) {
        PyErr_SetString(PyExc_BufferError, "the tensor is read-only");
        return -1;
    }
    const int contiguous = ai_tensor_is_contiguous(t);
    if ((flags & PyBUF_STRIDES) != PyBUF_STRIDES && !contiguous) {
        PyErr_SetString(PyExc_BufferError,
                        "the tensor is not contiguous; ask for a strided buffer");
        return -1;
    }
    if (((flags & PyBUF_C_CONTIGUOUS) == PyBUF_C_CONTIGUOUS ||
         (flags & PyBUF_ANY_CONTIGUOUS) == PyBUF_ANY_CONTIGUOUS) && !contiguous) {
        PyErr_SetString(PyExc_BufferError, "the tensor is not C-contiguous");
        return -1;
    }
    if ((flags & PyBUF_F_CONTIGUOUS) == PyBUF_F_CONTIGUOUS &&
        (flags & PyBUF_ANY_CONTIGUOUS) != PyBUF_ANY_CONTIGUOUS &&
        !(contiguous && t->ndim <= 1)) {
        PyErr_SetString(PyExc_BufferError, "the tensor is not Fortran-contiguous");
        return -1;
    }
    Py_ssize_t *dims = PyMem_Malloc(sizeof(Py_ssize_t) * 2 * (size_t)(t->ndim + 1));
    if (!dims) {
        PyErr_NoMemory();
        return -1;
    }
    const Py_ssize_t itemsize = (Py_ssize_t)ai_dtype_size(t->dtype);
    for (int i = 0; i < t->ndim; i++) {
        dims[i] = (Py_ssize_t)t->shape[i];
        dims[t->ndim + i] = (Py_ssize_t)(t->strides[i] * itemsize);
    }
    view->buf = export_ptr(t);
    view->obj = Py_NewRef(self);
    view->len = (Py_ssize_t)ai_tensor_nbytes(t);
    view->readonly = (t->flags & AI_TENSOR_READONLY) != 0;
    view->itemsize = itemsize;
    view->format = (flags & PyBUF_FORMAT) ? (char *)dtype_map[t->dtype].format : NULL;
    view->ndim = t->ndim;
    view->shape = (flags & PyBUF_ND) == PyBUF_ND ? dims : NULL;
    view->strides = (flags & PyBUF_STRIDES) == PyBUF_STRIDES ? dims + t->ndim : NULL;
    view->suboffsets = NULL;
    view->internal = dims;
    return 0;
}

static void Tensor_releasebuffer(TensorObject *self, Py_buffer *view)
{
    (void)self;
    PyMem_Free(view->internal);
}

/* ------------------------------------------------------------ DLPack export */

typedef struct {
    DLManagedTensorVersioned v; /* used when versioned */
    DLManagedTensor m;          /* used otherwise */
    int64_t shape[AI_MAX_DIMS];
    int64_t strides[AI_MAX_DIMS];
} dl_export;

static void dl_export_free(void *ctx)
{
    dl_export *e = ctx;
    PyGILState_STATE g = PyGILState_Ensure();
    Py_XDECREF((PyObject *)(e->v.manager_ctx ? e->v.manager_ctx : e->m.manager_ctx));
    PyGILState_Release(g);
    PyMem_RawFree(e);
}

static void dl_deleter(DLManagedTensor *m)
{
    dl_export_free((char *)m - offsetof(dl_export, m));
}

static void dl_deleter_versioned(DLManagedTensorVersioned *v)
{
    dl_export_free((char *)v - offsetof(dl_export, v));
}

/* Unconsumed capsules delete their tensor when collected. */
static void dl_capsule_destructor(PyObject *cap)
{
    if (PyCapsule_IsValid(cap, "dltensor")) {
        DLManagedTensor *m = PyCapsule_GetPointer(cap, "dltensor");
        m->deleter(m);
    } else if (PyCapsule_IsValid(cap, "dltensor_versioned")) {
        DLManagedTensorVersioned *v = PyCapsule_GetPointer(cap, "dltensor_versioned");
        v->deleter(v);
    }
    PyErr_Clear();
}

static PyObject *tensor_capsule(TensorObject *self, int versioned, PyObject *copy_obj);

/* Whether t has a negative stride on an axis of more than one element
 * (DLPack consumers take none). */
static bool negative_strides(const ai_tensor *t)
{
    for (int i = 0; i < t->ndim; i++)
        if (t->strides[i] < 0 && t->shape[i] > 1)
            return true;
    return false;
}

/* dl describes t's CPU memory, with these shape and strides arrays (kept
 * alive by the exporter as long as dl). */
static void dl_describe(DLTensor *dl, const ai_tensor *t, int64_t *shape, int64_t *strides)
{
    dl->data = t->data;
    dl->device = (DLDevice){kDLCPU, 0};
    dl->ndim = t->ndim;
    dl->dtype = dtype_map[t->dtype].dl;
    dl->shape = shape;
    dl->strides = strides;
    dl->byte_offset = 0;
}

static PyObject *Tensor_dlpack(TensorObject *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"stream", "max_version", "dl_device", "copy", NULL};
    PyObject *stream = Py_None, *max_version = Py_None, *dl_device = Py_None,
             *copy_obj = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|$OOOO:__dlpack__", kwlist, &stream,
                                     &max_version, &dl_device, &copy_obj))
        return NULL;
    if (stream != Py_None && !(PyLong_Check(stream) && PyLong_AsLong(stream) == -1)) {
        PyErr_SetString(PyExc_ValueError,
                        "stream must be None for a CPU tensor (DLPack)");
        return NULL;
    }
    if (dl_device != Py_None) {
        int type, id;
        if (!PyArg_ParseTuple(dl_device, "ii:dl_device", &type, &id))
            return NULL;
        if (type != kDLCPU) {
            PyErr_Format(PyExc_BufferError,
                         "cannot export a CPU tensor to DLPack device type %d", type);
            return NULL;
        }
    }
    int versioned = 0;
    if (max_version != Py_None) {
        unsigned major, minor;
        if (!PyArg_ParseTuple(max_version, "II:max_version", &major, &minor))
            return NULL;
        versioned = major >= 1;
    }
    return tensor_capsule(self, versioned, copy_obj);
}

/* A DLPack capsule of `self` (zero copy unless copy_obj is true or the
 * strides are negative; copy_obj False forbids the copy). */
static PyObject *tensor_capsule(TensorObject *self, int versioned, PyObject *copy_obj)
{
    int copy = copy_obj != Py_None && PyObject_IsTrue(copy_obj);
    ai_tensor *t = self->t;
    PyObject *owner = Py_NewRef(self);
    if (copy || negative_strides(t)) {
        if (copy_obj == Py_False) {
            Py_DECREF(owner);
            PyErr_SetString(PyExc_BufferError,
                            "the tensor has negative strides, which DLPack "
                            "consumers do not take, and copy=False was asked");
            return NULL;
        }
        /* DLPack has no negative strides in practice: export a copy */
        ai_tensor *c;
        ai_status st = clone_maybe_nogil(&c, t);
        Py_DECREF(owner);
        if (st)
            return raise_status(st);
        owner = tensor_wrap(Py_TYPE(self), c);
        if (!owner)
            return NULL;
        t = c;
        copy = 1;
    }
    if (!versioned && (t->flags & AI_TENSOR_READONLY)) {
        Py_DECREF(owner);
        PyErr_SetString(PyExc_BufferError,
                        "a read-only tensor can only be exported with DLPack 1.x "
                        "(max_version=(1, 0)), which can flag it read-only");
        return NULL;
    }
    dl_export *e = PyMem_RawCalloc(1, sizeof *e);
    if (!e) {
        Py_DECREF(owner);
        return PyErr_NoMemory();
    }
    memcpy(e->shape, t->shape, sizeof e->shape);
    memcpy(e->strides, t->strides, sizeof e->strides);
    dl_describe(versioned ? &e->v.dl_tensor : &e->m.dl_tensor, t, e->shape, e->strides);
    PyObject *cap;
    if (versioned) {
        e->v.version = (DLPackVersion){DLPACK_MAJOR_VERSION, DLPACK_MINOR_VERSION};
        e->v.manager_ctx = owner;
        e->v.deleter = dl_deleter_versioned;
        e->v.flags = ((t->flags & AI_TENSOR_READONLY) ? DLPACK_FLAG_BITMASK_READ_ONLY : 0) |
                     (copy ? DLPACK_FLAG_BITMASK_IS_COPIED : 0);
        cap = PyCapsule_New(&e->v, "dltensor_versioned", dl_capsule_destructor);
    } else {
        e->m.manager_ctx = owner;
        e->m.deleter = dl_deleter;
        cap = PyCapsule_New(&e->m, "dltensor", dl_capsule_destructor);
    }
    if (!cap)
        dl_export_free(e);
    return cap;
}

/* A DLPack capsule that takes over `t` (a graph's result) without a Tensor
 * object: its deleter frees t in C, without the GIL, which the thread that
 * drops the consumer's tensor may not hold (torch's autograd engine frees a
 * backward's results with the GIL released). Same process, a wrapped Relu's
 * and Linear's backward and forward: 0.1-0.3 us of 4-24 us less per call.
 * Takes `t` in all cases. */
typedef struct {
    DLManagedTensor m;
    ai_tensor *t;
} dl_result;

static void dl_result_deleter(DLManagedTensor *m)
{
    dl_result *e = (dl_result *)((char *)m - offsetof(dl_result, m));
    ai_tensor_free(e->t);
    PyMem_RawFree(e);
}

static PyObject *result_capsule(ai_tensor *t)
{
    dl_result *e = PyMem_RawCalloc(1, sizeof *e);
    if (!e) {
        ai_tensor_free(t);
        return PyErr_NoMemory();
    }
    e->t = t; /* t outlives the DLTensor: the deleter frees both */
    dl_describe(&e->m.dl_tensor, t, t->shape, t->strides);
    e->m.manager_ctx = NULL;
    e->m.deleter = dl_result_deleter;
    PyObject *cap = PyCapsule_New(&e->m, "dltensor", dl_capsule_destructor);
    if (!cap)
        dl_result_deleter(&e->m);
    return cap;
}

static PyObject *Tensor_dlpack_device(TensorObject *self, PyObject *unused)
{
    (void)self;
    (void)unused;
    return Py_BuildValue("(ii)", kDLCPU, 0);
}

/* ------------------------------------------------------------ methods */

static PyObject *Tensor_numpy(TensorObject *self, PyObject *unused)
{
    (void)unused;
    const ai_tensor *t = self->t;
    npy_intp dims[AI_MAX_DIMS], strides[AI_MAX_DIMS];
    const npy_intp itemsize = (npy_intp)ai_dtype_size(t->dtype);
    for (int i = 0; i < t->ndim; i++) {
        dims[i] = (npy_intp)t->shape[i];
        strides[i] = (npy_intp)t->strides[i] * itemsize;
    }
    PyArray_Descr *descr = PyArray_DescrFromType(dtype_map[t->dtype].npy);
    if (!descr)
        return NULL;
    if (!t->data) /* empty: NumPy allocates nothing to alias */
        return PyArray_NewFromDescr(&PyArray_Type, descr, t->ndim, dims, NULL,
                                    NULL, 0, NULL);
    int flags = (t->flags & AI_TENSOR_READONLY) ? 0 : NPY_ARRAY_WRITEABLE;
    PyObject *arr = PyArray_NewFromDescr(&PyArray_Type, descr, t->ndim, dims,
                                         strides, t->data, flags, NULL);
    if (!arr)
        return NULL;
    if (PyArray_SetBaseObject((PyArrayObject *)arr, Py_NewRef(self)) < 0) {
        Py_DECREF(arr);
        return NULL;
    }
    return arr;
}

static PyObject *Tensor_clone(TensorObject *self, PyObject *unused)
{
    (void)unused;
    ai_tensor *c;
    ai_status st = clone_maybe_nogil(&c, self->t);
    if (st)
        return raise_status(st);
    return tensor_wrap(Py_TYPE(self), c);
}

static PyObject *Tensor_contiguous(TensorObject *self, PyObject *unused)
{
    if (ai_tensor_is_contiguous(self->t))
        return Py_NewRef(self);
    return Tensor_clone(self, unused);
}

static PyObject *Tensor_is_contiguous(TensorObject *self, PyObject *unused)
{
    (void)unused;
    return PyBool_FromLong(ai_tensor_is_contiguous(self->t));
}

static PyObject *Tensor_astype(TensorObject *self, PyObject *args)
{
    ai_dtype dt;
    if (!PyArg_ParseTuple(args, "O&:astype", dtype_converter, &dt))
        return NULL;
    ai_tensor *c;
    ai_status st = ai_tensor_new(&c, dt, self->t->ndim, self->t->shape);
    if (st == AI_OK && (st = copy_maybe_nogil(c, self->t)) != AI_OK)
        ai_tensor_free(c);
    if (st)
        return raise_status(st);
    return tensor_wrap(Py_TYPE(self), c);
}

static PyObject *Tensor_repr(TensorObject *self)
{
    const ai_tensor *t = self->t;
    const int64_t n = ai_tensor_numel(t), shown = n <= 8 ? n : 6;
    PyObject *parts = PyList_New(0), *res = NULL;
    if (!parts)
        return NULL;
    for (int64_t i = 0; i < shown; i++) {
        double v = ai_tensor_get_flat(t, i);
        PyObject *item;
        if (t->dtype == AI_BOOL) {
            item = PyUnicode_FromString(v != 0 ? "True" : "False");
        } else {
            char *s = ai_dtype_is_float(t->dtype)
                          ? PyOS_double_to_string(v, 'g', t->dtype == AI_F64 ? 8 : 6,
                                                  0, NULL)
                          : PyOS_double_to_string(v, 'f', 0, 0, NULL);
            if (!s)
                goto done;
            item = PyUnicode_FromString(s);
            PyMem_Free(s);
        }
        if (!item || PyList_Append(parts, item) < 0) {
            Py_XDECREF(item);
            goto done;
        }
        Py_DECREF(item);
    }
    if (shown < n) {
        PyObject *dots = PyUnicode_FromString("...");
        if (!dots || PyList_Append(parts, dots) < 0) {
            Py_XDECREF(dots);
            goto done;
        }
        Py_DECREF(dots);
    }
    PyObject *sep = PyUnicode_FromString(", ");
    PyObject *values = sep ? PyUnicode_Join(sep, parts) : NULL;
    Py_XDECREF(sep);
    PyObject *shape = values ? int64_tuple(t->ndim, t->shape, 1) : NULL;
    if (shape) {
        res = PyUnicode_FromFormat(
            "Tensor(dtype=%s, shape=%S%s%s, values=[%U])", ai_dtype_name(t->dtype),
            shape, ai_tensor_is_contiguous(t) ? "" : ", strided",
            (t->flags & AI_TENSOR_READONLY) ? ", readonly" : "", values);
    }
    Py_XDECREF(shape);
    Py_XDECREF(values);
done:
    Py_DECREF(parts);
    return res;
}

static Py_ssize_t Tensor_len(TensorObject *self)
{
    if (self->t->ndim == 0) {
        PyErr_SetString(PyExc_TypeError, "len() of a 0-d tensor");
        return -1;
    }
    return (Py_ssize_t)self->t->shape[0];
}

static PyObject *Tensor_from_dlpack(PyTypeObject *tp, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"obj", "copy", NULL};
    PyObject *obj;
    int copy = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O|$p:from_dlpack", kwlist, &obj, &copy))
        return NULL;
    if (PyCapsule_CheckExact(obj))
        return tensor_from_dlpack_capsule(tp, obj, copy);
    if (!PyObject_HasAttrString(obj, "__dlpack__"))
        return PyErr_Format(PyExc_TypeError,
                            "argument 'obj' (%.100s) has no __dlpack__ method",
                            Py_TYPE(obj)->tp_name);
    return tensor_from_dlpack_obj(tp, obj, copy);
}

static PyMethodDef Tensor_methods[] = {
    {"__dlpack__", (PyCFunction)(void (*)(void))Tensor_dlpack, METH_VARARGS | METH_KEYWORDS,
     "DLPack export (zero copy; negative strides and copy=True give a copy)."},
    {"__dlpack_device__", (PyCFunction)Tensor_dlpack_device, METH_NOARGS,
     "(device_type, device_id) in DLPack terms: always the CPU."},
    {"numpy", (PyCFunction)Tensor_numpy, METH_NOARGS,
     "A NumPy array viewing the same memory (no copy)."},
    {"clone", (PyCFunction)Tensor_clone, METH_NOARGS,
     "A contiguous copy owning its memory."},
    {"contiguous", (PyCFunction)Tensor_contiguous, METH_NOARGS,
     "self if contiguous, else a contiguous copy."},
    {"is_contiguous", (PyCFunction)Tensor_is_contiguous, METH_NOARGS,
     "True for a row-major contiguous layout."},
    {"astype", (PyCFunction)Tensor_astype, METH_VARARGS,
     "A contiguous copy converted to another dtype (float->int truncates "
     "toward zero and saturates, NaN gives 0)."},
    {"from_dlpack", (PyCFunction)(void (*)(void))Tensor_from_dlpack,
     METH_VARARGS | METH_KEYWORDS | METH_CLASS,
     "Tensor.from_dlpack(obj, *, copy=False): view any DLPack producer."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Tensor_getset[] = {
    {"shape", (getter)Tensor_get_shape, NULL, "shape (tuple of ints)", NULL},
    {"strides", (getter)Tensor_get_strides, NULL, "strides in elements", NULL},
    {"dtype", (getter)Tensor_get_dtype, NULL, "dtype name (str)", NULL},
    {"ndim", (getter)Tensor_get_ndim, NULL, "rank", NULL},
    {"numel", (getter)Tensor_get_numel, NULL, "number of elements", NULL},
    {"nbytes", (getter)Tensor_get_nbytes, NULL, "numel * itemsize", NULL},
    {"itemsize", (getter)Tensor_get_itemsize, NULL, "bytes per element", NULL},
    {"readonly", (getter)Tensor_get_readonly, NULL, "True if read-only", NULL},
    {"data_ptr", (getter)Tensor_get_data_ptr, NULL,
     "address of the first element (0 if empty)", NULL},
    {"origin_device", (getter)Tensor_get_origin_device,
     (setter)Tensor_set_origin_device,
     "device a converted torch tensor came from (str or None)", NULL},
    {"__array_interface__", (getter)Tensor_get_array_interface, NULL,
     "NumPy array interface (version 3)", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMemberDef Tensor_members[] = {
    {"__weaklistoffset__", T_PYSSIZET, offsetof(TensorObject, weakreflist), READONLY, NULL},
    {NULL, 0, 0, 0, NULL},
};

PyDoc_STRVAR(Tensor_doc,
"Tensor(data, *, copy=False)\n--\n\n"
"A strided, typed tensor of the engine. Built without a copy from a NumPy\n"
"array (negative strides included), from any DLPack producer (torch), or\n"
"from another Tensor; copy=True takes an owned contiguous copy. Exported\n"
"without a copy through the buffer protocol, __array_interface__ and\n"
"DLPack.");

static PyType_Slot Tensor_slots[] = {
    {Py_tp_doc, (void *)Tensor_doc},
    {Py_tp_new, Tensor_new},
    {Py_tp_dealloc, Tensor_dealloc},
    {Py_tp_traverse, Tensor_traverse},
    {Py_tp_repr, Tensor_repr},
    {Py_tp_methods, Tensor_methods},
    {Py_tp_getset, Tensor_getset},
    {Py_tp_members, Tensor_members},
    {Py_mp_length, Tensor_len},
    {Py_bf_getbuffer, Tensor_getbuffer},
    {Py_bf_releasebuffer, Tensor_releasebuffer},
    {0, NULL},
};

static PyType_Spec Tensor_spec = {
    .name = "aidge_interop._C.Tensor",
    .basicsize = sizeof(TensorObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_IMMUTABLETYPE,
    .slots = Tensor_slots,
};

/* ------------------------------------------------------------ graph object */

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
    if (!PyArg_ParseTuple(args, "sO&:add_input", &name, dtype_converter, &dt))
        return NULL;
    ai_status st = ai_graph_add_input(self->g, name, dt);
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

/* {name: int | float | str | bytes | [int] | [float] | Tensor} -> ai_attr[] */
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
                 "list of int or float, or Tensor)", node, key, val);
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

/* The results as Tensors, or through the bridge's from_capsule. */
static PyObject *tensor_list(GraphObject *self, ai_tensor **ts, int n, const bridge *b)
{
    PyObject *list = PyList_New(n);
    for (int i = 0; list && i < n; i++) {
        PyObject *o;
        if (ts[i] && b->from_capsule && result_exportable(ts[i])) {
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
        res = st ? raise_status(st) : tensor_list(self, results, n_results, b);
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
    graph_leave(self);
    if (st)
        return raise_status(st);
    return Py_BuildValue("{s:n,s:n,s:n,s:n,s:n,s:n,s:i}", "peak_bytes",
                         (Py_ssize_t)(m.arena_bytes + m.workspace_bytes + m.state_bytes),
                         "arena_bytes", (Py_ssize_t)m.arena_bytes, "workspace_bytes",
                         (Py_ssize_t)m.workspace_bytes, "state_bytes",
                         (Py_ssize_t)m.state_bytes, "param_bytes", (Py_ssize_t)m.param_bytes,
                         "grad_bytes", (Py_ssize_t)m.grad_bytes, "planned_nodes",
                         m.planned_nodes);
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
    {"constant_fold", ai_recipe_constant_fold},
    {"block_channels", ai_recipe_block_channels},
    {"fuse_pad", ai_recipe_fuse_pad},
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
     "add_input(name, dtype): a graph input (shape given at forward)."},
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
     "accumulate); bridge as in forward."},
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

static PyType_Spec Graph_spec = {
    .name = "aidge_interop._C.Graph",
    .basicsize = sizeof(GraphObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_IMMUTABLETYPE,
    .slots = Graph_slots,
};

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
    {"supported_operators", py_supported_operators, METH_NOARGS,
     "[(domain, op_type, has_backward)] for every operator of the engine."},
    {"gemm_backend", py_gemm_backend, METH_NOARGS, "The GEMM library in use."},
    {"set_num_threads", py_set_num_threads, METH_O, "Threads of the engine (its pool; GEMMs included)."},
    {"_set_avx512", py_set_avx512, METH_O,
     "_set_avx512(on) -> bool: the engine's AVX-512 kernels on (where the CPU has AVX-512) or off "
     "(8-lane kernels); returns whether they now run. For tests and benchmarks."},
    {"get_num_threads", py_get_num_threads, METH_NOARGS, "Threads of the engine."},
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

static struct PyModuleDef aidge_module = {
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
