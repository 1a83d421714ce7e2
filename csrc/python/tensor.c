/*
 * tensor.c — the Tensor type of aidge_interop._C: an engine tensor as
 * Python sees it.
 *
 * Python objects become ai_tensor views (NumPy arrays through the NumPy C
 * API, anything else through DLPack); tensors go back out without a copy
 * through the buffer protocol, __array_interface__ and DLPack (and as
 * DLPack capsules of a graph's results, for graph.c).
 */
#define NO_IMPORT_ARRAY
#include "bindings.h"

#include <structmember.h>

#include <string.h>

#include "dlpack.h"

/* ------------------------------------------------------------ dtypes */

static const struct {
    int npy;             /* NPY_NOTYPE: an ml_dtypes type (`ml`) */
    const char *format;  /* buffer protocol (struct module); NULL: none */
    const char *typestr; /* __array_interface__, without the byte order */
    DLDataType dl;       /* lanes 0: none (DLPack packs the sub-byte types) */
    const char *ml;      /* the ml_dtypes type NumPy arrays of it have */
} dtype_map[] = {
    [AI_F32] = {NPY_FLOAT32, "f", "f4", {kDLFloat, 32, 1}, NULL},
    [AI_F64] = {NPY_FLOAT64, "d", "f8", {kDLFloat, 64, 1}, NULL},
    [AI_F16] = {NPY_FLOAT16, "e", "f2", {kDLFloat, 16, 1}, NULL},
    [AI_I8] = {NPY_INT8, "b", "i1", {kDLInt, 8, 1}, NULL},
    [AI_U8] = {NPY_UINT8, "B", "u1", {kDLUInt, 8, 1}, NULL},
    [AI_I16] = {NPY_INT16, "h", "i2", {kDLInt, 16, 1}, NULL},
    [AI_I32] = {NPY_INT32, "i", "i4", {kDLInt, 32, 1}, NULL},
    [AI_I64] = {NPY_INT64, "q", "i8", {kDLInt, 64, 1}, NULL},
    [AI_BOOL] = {NPY_BOOL, "?", "b1", {kDLBool, 8, 1}, NULL},
    [AI_U16] = {NPY_UINT16, "H", "u2", {kDLUInt, 16, 1}, NULL},
    [AI_U32] = {NPY_UINT32, "I", "u4", {kDLUInt, 32, 1}, NULL},
    [AI_U64] = {NPY_UINT64, "Q", "u8", {kDLUInt, 64, 1}, NULL},
    [AI_F8E4M3FN] = {NPY_NOTYPE, NULL, NULL, {kDLFloat8_e4m3fn, 8, 1}, "float8_e4m3fn"},
    [AI_F8E4M3FNUZ] = {NPY_NOTYPE, NULL, NULL, {kDLFloat8_e4m3fnuz, 8, 1}, "float8_e4m3fnuz"},
    [AI_F8E5M2] = {NPY_NOTYPE, NULL, NULL, {kDLFloat8_e5m2, 8, 1}, "float8_e5m2"},
    [AI_F8E5M2FNUZ] = {NPY_NOTYPE, NULL, NULL, {kDLFloat8_e5m2fnuz, 8, 1}, "float8_e5m2fnuz"},
    [AI_F8E8M0] = {NPY_NOTYPE, NULL, NULL, {kDLFloat8_e8m0fnu, 8, 1}, "float8_e8m0fnu"},
    [AI_I4] = {NPY_NOTYPE, NULL, NULL, {0, 0, 0}, "int4"},
    [AI_U4] = {NPY_NOTYPE, NULL, NULL, {0, 0, 0}, "uint4"},
    [AI_I2] = {NPY_NOTYPE, NULL, NULL, {0, 0, 0}, "int2"},
    [AI_U2] = {NPY_NOTYPE, NULL, NULL, {0, 0, 0}, "uint2"},
    [AI_F4E2M1] = {NPY_NOTYPE, NULL, NULL, {0, 0, 0}, "float4_e2m1fn"},
    /* NumPy has no bfloat16: ml_dtypes registers one at run time */
    [AI_BF16] = {NPY_NOTYPE, NULL, NULL, {kDLBfloat, 16, 1}, "bfloat16"},
};
_Static_assert(sizeof dtype_map / sizeof dtype_map[0] == AI_DTYPE_COUNT,
               "one binding entry per dtype");

#define SUPPORTED_DTYPES \
    "float32, float64, float16, int8, uint8, int16, int32, int64, bool, uint16, uint32, " \
    "uint64, and with ml_dtypes bfloat16, float8_e4m3fn, float8_e4m3fnuz, float8_e5m2, " \
    "float8_e5m2fnuz, float8_e8m0fnu, int4, uint4, int2, uint2, float4_e2m1fn"

/* The ml_dtypes type of `dt` (new reference), or NULL with an exception. */
static PyObject *ml_type(ai_dtype dt)
{
    PyObject *mod = PyImport_ImportModule("ml_dtypes");
    if (!mod) {
        PyErr_Format(PyExc_ImportError,
                     "NumPy arrays of %s need the ml_dtypes package (pip install ml_dtypes)",
                     ai_dtype_name(dt));
        return NULL;
    }
    PyObject *type = PyObject_GetAttrString(mod, dtype_map[dt].ml);
    Py_DECREF(mod);
    return type;
}

/* The NumPy dtype of `dt` (new reference), or NULL with an exception. */
static PyArray_Descr *npy_descr(ai_dtype dt)
{
    if (!dtype_map[dt].ml)
        return PyArray_DescrFromType(dtype_map[dt].npy);
    PyObject *type = ml_type(dt);
    PyArray_Descr *descr = NULL;
    if (type && !PyArray_DescrConverter(type, &descr))
        descr = NULL;
    Py_XDECREF(type);
    return descr;
}

static int dtype_from_descr(PyArray_Descr *descr, ai_dtype *out)
{
    const int npy = descr->type_num;
    if (npy >= NPY_USERDEF) { /* ml_dtypes registers its types at import */
        for (int i = 0; i < AI_DTYPE_COUNT; i++) {
            if (!dtype_map[i].ml)
                continue;
            PyObject *type = ml_type((ai_dtype)i);
            int same = type == (PyObject *)descr->typeobj;
            Py_XDECREF(type);
            if (!type)
                PyErr_Clear();
            if (same) {
                *out = (ai_dtype)i;
                return 0;
            }
        }
        return -1;
    }
    for (int i = 0; i < AI_DTYPE_COUNT; i++) {
        /* NPY_INT64 and NPY_LONGLONG are both 8-byte integers */
        if (!dtype_map[i].ml && (dtype_map[i].npy == npy ||
                                 PyArray_EquivTypenums(dtype_map[i].npy, npy))) {
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
            dtype_map[i].dl.lanes == 1 && dl.lanes == 1) {
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
int dtype_converter(PyObject *obj, void *addr)
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
    if (!descr || dtype_from_descr(descr, out) < 0) {
        PyErr_Format(PyExc_TypeError, "unsupported dtype %R (supported: %s)",
                     obj, SUPPORTED_DTYPES);
        Py_XDECREF(descr);
        return 0;
    }
    Py_DECREF(descr);
    return 1;
}

/* ------------------------------------------------------------ tensor object */

PyObject *tensor_wrap(PyTypeObject *tp, ai_tensor *t)
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

ai_status clone_maybe_nogil(ai_tensor **out, const ai_tensor *src)
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
    if (dtype_from_descr(descr, &dt) < 0) {
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
int capsule_view(PyObject *cap, int copy, ai_tensor **out)
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

PyObject *tensor_from_object(PyTypeObject *tp, PyObject *obj, int copy)
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

PyObject *int64_tuple(int n, const int64_t *v, int64_t scale)
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
    if (!dtype_map[t->dtype].typestr) /* NumPy then asks __array__ */
        return PyErr_Format(PyExc_AttributeError,
                            "%s has no __array_interface__ type; use numpy()",
                            ai_dtype_name(t->dtype));
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
    if (!dtype_map[t->dtype].format) {
        PyErr_Format(PyExc_BufferError, "%s has no buffer format; use numpy()",
                     ai_dtype_name(t->dtype));
        return -1;
    }
    if ((flags & PyBUF_WRITABLE) == PyBUF_WRITABLE && (t->flags & AI_TENSOR_READONLY)) {
        PyErr_SetString(PyExc_BufferError, "the tensor is read-only");
        return -1;
    }
    if (!dtype_map[t->dtype].format) {
        PyErr_Format(PyExc_BufferError, "a %s tensor has no buffer format; use .numpy()",
                     ai_dtype_name(t->dtype));
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

/* Whether t has a negative stride on an axis of more than one element
 * (DLPack consumers take none). */
bool negative_strides(const ai_tensor *t)
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
PyObject *tensor_capsule(TensorObject *self, int versioned, PyObject *copy_obj)
{
    int copy = copy_obj != Py_None && PyObject_IsTrue(copy_obj);
    ai_tensor *t = self->t;
    if (!dtype_map[t->dtype].dl.lanes)
        return PyErr_Format(PyExc_BufferError,
                            "%s has no DLPack form (DLPack packs it, the engine keeps one "
                            "element a byte); use numpy()", ai_dtype_name(t->dtype));
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

PyObject *result_capsule(ai_tensor *t)
{
    if (!dtype_map[t->dtype].dl.lanes) {
        PyErr_Format(PyExc_TypeError, "a result of dtype %s has no DLPack form",
                     ai_dtype_name(t->dtype));
        ai_tensor_free(t);
        return NULL;
    }
    dl_result *e = PyMem_RawMalloc(sizeof *e); /* (not calloc: see zalloc, tensor.c) */
    if (!e) {
        ai_tensor_free(t);
        return PyErr_NoMemory();
    }
    memset(e, 0, sizeof *e);
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
    PyArray_Descr *descr = npy_descr(t->dtype);
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

/* numpy.asarray's way in for the dtypes without a buffer format (ml_dtypes) */
static PyObject *Tensor_array(TensorObject *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"dtype", "copy", NULL};
    PyObject *dtype = Py_None, *copy = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|OO:__array__", kwlist, &dtype, &copy))
        return NULL;
    PyObject *arr = Tensor_numpy(self, NULL);
    if (arr && (dtype != Py_None || copy == Py_True)) {
        PyObject *res = PyObject_CallMethod(arr, "astype", "O", dtype == Py_None
                                            ? (PyObject *)PyArray_DESCR((PyArrayObject *)arr)
                                            : dtype);
        Py_SETREF(arr, res);
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
     "A NumPy array viewing the same memory (no copy); the float8 and sub-byte\n"
     "dtypes as ml_dtypes arrays."},
    {"__array__", (PyCFunction)(void (*)(void))Tensor_array, METH_VARARGS | METH_KEYWORDS,
     "__array__(dtype=None, copy=None): numpy(), converted or copied if asked."},
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

PyType_Spec Tensor_spec = {
    .name = "aidge_interop._C.Tensor",
    .basicsize = sizeof(TensorObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_IMMUTABLETYPE,
    .slots = Tensor_slots,
};
