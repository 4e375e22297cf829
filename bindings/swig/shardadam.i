/*
 * shardadam.i — SWIG interface of the low-level Python module `shardadam._shardadam`.
 *
 * It mirrors include/shardadam/shardadam.h one to one: every sa_* function keeps its name
 * and returns its sa_status as an int (the hand-written package `shardadam` turns statuses
 * into exceptions and reads the handle's message). What the typemaps below change:
 *
 *   - out-parameters become extra return values: `status, index = sa_optimizer_add_group(...)`;
 *   - DLPack tensors travel as PyCapsules, as the DLPack Python protocol defines them:
 *       local_shard  an unconsumed "dltensor_versioned" capsule (sa_optimizer_add_param) or
 *                    "dltensor" capsule (sa_optimizer_add_param_legacy). On SA_OK it is
 *                    renamed "used_dltensor_versioned" / "used_dltensor": the optimizer now
 *                    owns the tensor and calls its deleter when it is destroyed. On failure
 *                    the capsule is left as it was (the caller still owns the tensor).
 *       grad         either kind of capsule; borrowed for the call, never consumed.
 *       grads        (sa_optimizer_set_grads) a sequence of such capsules or None (no
 *                    grad), one per param. The raw-pointer sa_optimizer_set_grad_ptrs is
 *                    not wrapped: it trusts its caller to have checked what Python cannot.
 *       state view   returned as a new "dltensor_versioned" capsule whose destructor calls
 *                    the deleter unless a consumer renamed (consumed) it.
 *   - structs holding pointers are passed as plain Python values:
 *       sa_layout         None, or (global_shape, mesh_shape, mesh_coord, placements,
 *                         global_offset) with placements a sequence of (type, dim) and
 *                         global_offset None for the mesh form;
 *       sa_param_options  None, or a dict by field name (sa_struct_field lists them), each
 *                         dtype None or (code, bits, lanes), enums and margin ints, and scale
 *                         and amax None or unconsumed "dltensor_versioned" capsules, renamed
 *                         "used_dltensor_versioned" on SA_OK (then the optimizer owns them);
 *                         fields not named keep the library's defaults (sa_struct_default);
 *       sa_step_args      None, or a dict by field name (sa_struct_field lists them): the
 *                         pointers as addresses (int) or None, doubles as floats, int32s as
 *                         ints; fields not named keep SA_STEP_ARGS_INIT's values;
 *       sa_import_options None, or a dict by field name, as sa_step_args;
 *       sa_nccl_unique_id its 128 bytes (bytes in, bytes out);
 *   - a host communicator is made from a Python callable (host_comm_create below), not from
 *     a table of C function pointers;
 *       sa_param_info     returned as a dict;
 *       sa_field_info     returned as a dict (name, type, offset, default, min, max,
 *                         max_inclusive, fixed_with_params, rule, doc, dtype_role,
 *                         rules);
 *       sa_dtype_info     returned as a dict (name, dtype, roles, safetensors_name, doc);
 *       sa_param_scaling_info  returned as a dict (value, name, block, scale_dtype,
 *                         step_writes_scale, doc);
 *       void* stream      an address (int) or None;
 *   - structs of plain fields (sa_optimizer_config, sa_group_config) and
 *     the writer/reader handles are classes whose constructors apply the SA_*_INIT macros.
 */
%module(package="shardadam", threads="1") _shardadam

%{
#include <stdlib.h>
#include <shardadam/shardadam.h>
%}

%include <stdint.i>
%include <typemaps.i>

/* SWIG learns DLPack's types and macros from the real header without wrapping them. */
%import <dlpack/dlpack.h>

/* The GIL is released only around calls that may run long: a step (CPU backend: the whole
 * update), the blob I/O and the collective NCCL setup. Of these only a step calls back into
 * Python (a host communicator's all_reduce), and its trampoline takes the GIL itself. */
%nothread;
%thread sa_optimizer_step;
%thread sa_optimizer_export;
%thread sa_optimizer_export_async;  /* the snapshot copy */
%thread sa_export_job_wait;
%thread sa_export_job_release;       /* waits for the job */
%thread sa_optimizer_import;
%thread sa_inspect;
/* Collective: it waits for every rank, which may need this process's other threads. */
%thread sa_comm_create_nccl;

/* ---- helpers ------------------------------------------------------------------------ */
%{
static const char SA_PY_VERSIONED[] = "dltensor_versioned";
static const char SA_PY_LEGACY[] = "dltensor";

/* Destructor of the capsules this module creates: a capsule still carrying its original
 * name was never consumed, so its tensor is still the capsule's to delete. */
static void sa_py_versioned_capsule_destructor(PyObject* capsule) {
  if (!PyCapsule_IsValid(capsule, SA_PY_VERSIONED)) return;
  DLManagedTensorVersioned* t = (DLManagedTensorVersioned*)PyCapsule_GetPointer(capsule, SA_PY_VERSIONED);
  if (t->deleter) t->deleter(t);
}

static void sa_py_legacy_capsule_destructor(PyObject* capsule) {
  if (!PyCapsule_IsValid(capsule, SA_PY_LEGACY)) return;
  DLManagedTensor* t = (DLManagedTensor*)PyCapsule_GetPointer(capsule, SA_PY_LEGACY);
  if (t->deleter) t->deleter(t);
}

/* The DLTensor inside an unconsumed capsule of either kind, or NULL (no exception set). */
static DLTensor* sa_py_capsule_dltensor(PyObject* capsule) {
  if (PyCapsule_IsValid(capsule, SA_PY_VERSIONED))
    return &((DLManagedTensorVersioned*)PyCapsule_GetPointer(capsule, SA_PY_VERSIONED))->dl_tensor;
  if (PyCapsule_IsValid(capsule, SA_PY_LEGACY))
    return &((DLManagedTensor*)PyCapsule_GetPointer(capsule, SA_PY_LEGACY))->dl_tensor;
  return NULL;
}

static PyObject* sa_py_int64_tuple(const int64_t* values, int32_t n) {
  PyObject* tuple = PyTuple_New(n);
  for (int32_t i = 0; tuple && i < n; ++i) {
    PyObject* item = PyLong_FromLongLong(values[i]);
    if (!item) { Py_DECREF(tuple); return NULL; }
    PyTuple_SET_ITEM(tuple, i, item);
  }
  return tuple;
}

/* Reads a sequence of at most SA_MAX_NDIM ints; returns its length, or -1 with an exception. */
static int sa_py_read_int64s(PyObject* obj, int64_t* out, const char* what) {
  PyObject* seq = PySequence_Fast(obj, what);
  if (!seq) return -1;
  Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  if (n > SA_MAX_NDIM) {
    PyErr_Format(PyExc_ValueError, "%s has %zd entries; at most %d are allowed", what, n, SA_MAX_NDIM);
    n = -1;
  }
  for (Py_ssize_t i = 0; i < n; ++i) {
    out[i] = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(seq, i));
    if (PyErr_Occurred()) n = -1;
  }
  Py_DECREF(seq);
  return (int)n;
}

/* Storage for one sa_layout and the arrays it points to. */
typedef struct sa_py_layout {
  sa_layout layout;
  int64_t global_shape[SA_MAX_NDIM], mesh_shape[SA_MAX_NDIM], mesh_coord[SA_MAX_NDIM];
  int64_t global_offset[SA_MAX_NDIM];
  sa_placement placements[SA_MAX_NDIM];
} sa_py_layout;

/* None -> NULL; (global_shape, mesh_shape, mesh_coord, placements, global_offset) -> a
 * layout in *storage. Returns 0 with an exception set on a malformed tuple. */
static int sa_py_read_layout(PyObject* obj, sa_py_layout* storage, const sa_layout** out) {
  const sa_layout init = SA_LAYOUT_INIT;
  PyObject *global_shape, *mesh_shape, *mesh_coord, *placements, *global_offset;
  *out = NULL;
  if (obj == Py_None) return 1;
  if (!PyArg_ParseTuple(obj, "OOOOO;layout must be None or (global_shape, mesh_shape, mesh_coord, placements, global_offset)",
                        &global_shape, &mesh_shape, &mesh_coord, &placements, &global_offset))
    return 0;
  storage->layout = init;
  int ndim = sa_py_read_int64s(global_shape, storage->global_shape, "layout global_shape");
  int mesh_ndim = sa_py_read_int64s(mesh_shape, storage->mesh_shape, "layout mesh_shape");
  int coord_ndim = sa_py_read_int64s(mesh_coord, storage->mesh_coord, "layout mesh_coord");
  if (ndim < 0 || mesh_ndim < 0 || coord_ndim < 0) return 0;
  PyObject* seq = PySequence_Fast(placements, "layout placements must be a sequence of (type, dim)");
  if (!seq) return 0;
  Py_ssize_t num_placements = PySequence_Fast_GET_SIZE(seq);
  int ok = coord_ndim == mesh_ndim && num_placements == mesh_ndim;
  if (!ok)
    PyErr_Format(PyExc_ValueError, "layout: mesh_shape, mesh_coord and placements have %d, %d and %zd entries; they must match",
                 mesh_ndim, coord_ndim, num_placements);
  for (Py_ssize_t i = 0; ok && i < num_placements; ++i)
    ok = PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, i), "ii;a placement must be (type, dim)",
                          &storage->placements[i].type, &storage->placements[i].dim);
  Py_DECREF(seq);
  if (!ok) return 0;
  storage->layout.ndim = ndim;
  storage->layout.global_shape = storage->global_shape;
  if (global_offset == Py_None) {
    storage->layout.mesh_ndim = mesh_ndim;
    storage->layout.mesh_shape = storage->mesh_shape;
    storage->layout.mesh_coord = storage->mesh_coord;
    storage->layout.placements = storage->placements;
  } else {
    if (sa_py_read_int64s(global_offset, storage->global_offset, "layout global_offset") < 0) return 0;
    storage->layout.global_offset = storage->global_offset;
  }
  *out = &storage->layout;
  return 1;
}

/* None -> a zeroed dtype (the default); (code, bits, lanes) -> that dtype. */
static int sa_py_read_dtype(PyObject* obj, DLDataType* out) {
  unsigned char code = 0, bits = 0;
  unsigned short lanes = 0;
  if (obj != Py_None && !PyArg_ParseTuple(obj, "bbH;a dtype must be None or (code, bits, lanes)", &code, &bits, &lanes))
    return 0;
  out->code = code;
  out->bits = bits;
  out->lanes = lanes;
  return 1;
}

static PyObject* sa_py_dtype_tuple(DLDataType dtype) {
  return Py_BuildValue("(iii)", dtype.code, dtype.bits, dtype.lanes);
}

/* A legacy tensor wrapping a versioned one (dlpack_versioned_to_legacy). */
typedef struct sa_py_legacy_view {
  DLManagedTensor legacy;
  DLManagedTensorVersioned* versioned;
} sa_py_legacy_view;

static void sa_py_legacy_view_deleter(DLManagedTensor* self) {
  sa_py_legacy_view* view = (sa_py_legacy_view*)self->manager_ctx;
  if (view->versioned->deleter) view->versioned->deleter(view->versioned);
  free(view);
}

/* After a failed call of the reducer (the ctx): the raised exception is stored as its
 * `exception` attribute, for the package to raise after the step. */
static void sa_py_keep_exception(PyObject* reducer) {
#if PY_VERSION_HEX >= 0x030C0000
  PyObject* exception = PyErr_GetRaisedException();
#else
  PyObject *type, *value, *traceback;
  PyErr_Fetch(&type, &value, &traceback);
  PyErr_NormalizeException(&type, &value, &traceback);
  if (value && traceback) PyException_SetTraceback(value, traceback);
  Py_XDECREF(type);
  Py_XDECREF(traceback);
  PyObject* exception = value;
#endif
  if (exception && PyObject_SetAttrString(reducer, "exception", exception) != 0)
    PyErr_WriteUnraisable(reducer);  /* the reducer cannot hold it: print it at least */
  Py_XDECREF(exception);
}

/* A host communicator's all_reduce: calls the Python reducer (the ctx) with the values in
 * a bytearray and copies them back. The step runs without the GIL (%thread), so the
 * trampoline takes it. No exception may escape into the library: one raised by the reducer
 * is stored as its `exception` attribute and the call fails (nonzero). */
static int sa_py_host_all_reduce(void* ctx, double* values, int32_t count, sa_reduce_op op) {
  PyObject* reducer = (PyObject*)ctx;
  int failed = 1;
  PyGILState_STATE gil = PyGILState_Ensure();
  Py_ssize_t bytes = (Py_ssize_t)count * (Py_ssize_t)sizeof(double);
  PyObject* buffer = count >= 0 ? PyByteArray_FromStringAndSize((const char*)values, bytes) : NULL;
  PyObject* result = buffer ? PyObject_CallFunction(reducer, "Oi", buffer, (int)op) : NULL;
  if (result) {
    if (PyByteArray_GET_SIZE(buffer) == bytes) {
      memcpy(values, PyByteArray_AS_STRING(buffer), (size_t)bytes);
      failed = 0;
    } else {
      PyErr_Format(PyExc_RuntimeError, "all_reduce: the reducer resized the buffer of %d values to %zd bytes",
                   (int)count, PyByteArray_GET_SIZE(buffer));
    }
  } else if (count < 0 && !PyErr_Occurred()) {
    PyErr_Format(PyExc_RuntimeError, "all_reduce: called with count %d", (int)count);
  }
  if (failed) sa_py_keep_exception(reducer);
  Py_XDECREF(result);
  Py_XDECREF(buffer);
  PyGILState_Release(gil);
  return failed;
}

/* A list of the reducer's `nranks` sizes; NULL with an exception set. */
static PyObject* sa_py_counts(const int64_t* counts, Py_ssize_t nranks, Py_ssize_t* total) {
  PyObject* list = PyList_New(nranks);
  *total = 0;
  for (Py_ssize_t r = 0; list && r < nranks; ++r) {
    PyObject* count = PyLong_FromLongLong((long long)counts[r]);
    if (!count) {
      Py_CLEAR(list);
      break;
    }
    PyList_SET_ITEM(list, r, count);
    *total += (Py_ssize_t)counts[r];
  }
  return list;
}

/* A host communicator's all_to_all: calls reducer.exchange(send, send_bytes, recv,
 * recv_bytes) with the blocks in bytearrays and their sizes as lists of reducer.nranks ints,
 * then copies recv back; the GIL and a raised exception as the all_reduce trampoline's. */
static int sa_py_host_all_to_all(void* ctx, const void* send, const int64_t* send_counts,
                                 void* recv, const int64_t* recv_counts) {
  PyObject* reducer = (PyObject*)ctx;
  int failed = 1;
  PyGILState_STATE gil = PyGILState_Ensure();
  PyObject *nranks = PyObject_GetAttrString(reducer, "nranks"), *sends = NULL, *recvs = NULL,
           *out = NULL, *in = NULL, *result = NULL;
  Py_ssize_t ranks = nranks ? PyLong_AsSsize_t(nranks) : -1, sent = 0, received = 0;
  if (ranks >= 0 && !PyErr_Occurred()) {
    sends = sa_py_counts(send_counts, ranks, &sent);
    recvs = sends ? sa_py_counts(recv_counts, ranks, &received) : NULL;
  }
  if (recvs) {
    out = PyByteArray_FromStringAndSize((const char*)send, sent);
    in = out ? PyByteArray_FromStringAndSize(NULL, received) : NULL;
  }
  if (in) result = PyObject_CallMethod(reducer, "exchange", "OOOO", out, sends, in, recvs);
  if (result) {
    if (PyByteArray_GET_SIZE(in) == received) {
      memcpy(recv, PyByteArray_AS_STRING(in), (size_t)PyByteArray_GET_SIZE(in));
      failed = 0;
    } else {
      PyErr_SetString(PyExc_RuntimeError, "all_to_all: the receive buffer was resized");
    }
  }
  if (failed) sa_py_keep_exception(reducer);
  Py_XDECREF(result);
  Py_XDECREF(in);
  Py_XDECREF(out);
  Py_XDECREF(recvs);
  Py_XDECREF(sends);
  Py_XDECREF(nranks);
  PyGILState_Release(gil);
  return failed;
}

/* Drops the communicator's reference to the reducer. After interpreter shutdown the
 * reducer is gone with the interpreter: nothing is left to release. */
static void sa_py_host_release(void* ctx) {
  if (!Py_IsInitialized()) return;
  PyGILState_STATE gil = PyGILState_Ensure();
  Py_DECREF((PyObject*)ctx);
  PyGILState_Release(gil);
}

/* Reads an address (int) or None. Returns 0 with an exception set otherwise. */
static int sa_py_read_address(PyObject* obj, void** out) {
  *out = obj == Py_None ? NULL : PyLong_AsVoidPtr(obj);
  return !PyErr_Occurred();
}

/* The field table of sa_struct_kind `kind`, read from the library once (with the GIL held:
 * no other thread fills it at the same time); its count into *n. */
#define SA_PY_KINDS 8
#define SA_PY_MOST_FIELDS 32
static int sa_py_struct_fields(int32_t kind, const sa_field_info** fields, int32_t* n) {
  static sa_field_info tables[SA_PY_KINDS][SA_PY_MOST_FIELDS];
  static int32_t counts[SA_PY_KINDS];
  static int filled[SA_PY_KINDS];
  if (kind < 0 || kind >= SA_PY_KINDS) {
    PyErr_Format(PyExc_ValueError, "struct kind %d is not one this binding knows", (int)kind);
    return 0;
  }
  if (!filled[kind]) {
    const int32_t count = sa_struct_num_fields(kind);
    if (count > SA_PY_MOST_FIELDS) {
      PyErr_Format(PyExc_RuntimeError, "the library's struct %d has %d fields, more than this binding holds",
                   (int)kind, (int)count);
      return 0;
    }
    for (int32_t i = 0; i < count; ++i) {
      const sa_field_info init = SA_FIELD_INFO_INIT;
      tables[kind][i] = init;
      if (sa_struct_field(kind, i, &tables[kind][i]) != SA_OK) {
        PyErr_Format(PyExc_RuntimeError, "sa_struct_field(%d, %d) failed: %s", (int)kind, (int)i, sa_last_error());
        return 0;
      }
    }
    counts[kind] = count;
    filled[kind] = 1;
  }
  *fields = tables[kind];
  *n = counts[kind];
  return 1;
}

/* Fills the struct of sa_struct_kind `kind` (`what` names it) at `s`, its defaults already
 * in, from a dict of field names to values, as the library's table (sa_struct_field) says
 * each is stored: a double as a float, an int32 or a flag as an int, a uint64 as an int, a
 * dtype as None (unset) or (code, bits, lanes), a pointer as an address (int) or None, or,
 * where `capsules` is a list, an unconsumed "dltensor_versioned" capsule (appended to it:
 * the caller renames them once the library owns their tensors). Fields not named keep their
 * defaults. An unknown name is a KeyError; the values' ranges are the library's to check. */
static int sa_py_fill_struct(int32_t kind, const char* what, PyObject* dict, void* s, PyObject* capsules) {
  PyObject *key, *value;
  Py_ssize_t pos = 0;
  if (!PyDict_Check(dict)) {
    PyErr_Format(PyExc_TypeError, "%s must be None or a dict of %s fields", what, what);
    return 0;
  }
  while (PyDict_Next(dict, &pos, &key, &value)) {
    const char* name = PyUnicode_AsUTF8(key);
    const sa_field_info* fields = NULL;
    int32_t i, n = 0, found = 0;
    sa_field_info f = SA_FIELD_INFO_INIT;
    if (name == NULL || !sa_py_struct_fields(kind, &fields, &n)) return 0;
    for (i = 0; i < n && !found; ++i)
      if (strcmp(fields[i].name, name) == 0) {
        f = fields[i];
        found = 1;
      }
    if (!found) {
      PyErr_Format(PyExc_KeyError, "%s has no field '%s'", what, name);
      return 0;
    }
    char* at = (char*)s + f.offset;
    if (f.type == SA_FIELD_POINTER) {
      void* p = NULL;
      if (capsules != NULL && PyCapsule_CheckExact(value)) {
        if (!PyCapsule_IsValid(value, SA_PY_VERSIONED)) {
          PyErr_Format(PyExc_TypeError, "%s.%s must be None or an unconsumed DLPack capsule named 'dltensor_versioned'", what, name);
          return 0;
        }
        p = PyCapsule_GetPointer(value, SA_PY_VERSIONED);
        if (p == NULL || PyList_Append(capsules, value) != 0) return 0;
      } else if (!sa_py_read_address(value, &p)) {
        return 0;
      }
      memcpy(at, &p, sizeof p);
    } else if (f.type == SA_FIELD_DOUBLE) {
      const double d = PyFloat_AsDouble(value);
      if (PyErr_Occurred()) return 0;
      memcpy(at, &d, sizeof d);
    } else if (f.type == SA_FIELD_UINT64) {
      const unsigned long long v = PyLong_AsUnsignedLongLong(value);
      const uint64_t u64 = (uint64_t)v;
      if (PyErr_Occurred()) return 0;
      memcpy(at, &u64, sizeof u64);
    } else if (f.type == SA_FIELD_DTYPE) {
      DLDataType dtype = {0, 0, 0};
      if (!sa_py_read_dtype(value, &dtype)) return 0;
      memcpy(at, &dtype, sizeof dtype);
    } else {
      const long v = PyLong_AsLong(value);
      const int32_t i32 = (int32_t)v;
      if (PyErr_Occurred()) return 0;
      if ((long)i32 != v) {
        PyErr_Format(PyExc_OverflowError, "%s.%s = %ld does not fit an int32", what, name, v);
        return 0;
      }
      memcpy(at, &i32, sizeof i32);
    }
  }
  return 1;
}
%}

/* ---- handles, out-parameters --------------------------------------------------------- */
%apply int32_t* OUTPUT { int32_t* group };
%apply int64_t* OUTPUT { int64_t* param, int64_t* step };

%typemap(in, numinputs=0) sa_optimizer** out (sa_optimizer* created = NULL) { $1 = &created; }
%typemap(argout) sa_optimizer** out {
  %append_output(SWIG_NewPointerObj(created$argnum, $descriptor(sa_optimizer*), 0));
}

%typemap(in) void* stream {
  if (!sa_py_read_address($input, &$1)) SWIG_fail;
}

/* ---- DLPack capsules ----------------------------------------------------------------- */
%typemap(in) DLManagedTensorVersioned* local_shard {
  if (!PyCapsule_IsValid($input, SA_PY_VERSIONED))
    SWIG_exception_fail(SWIG_TypeError, "local_shard must be an unconsumed DLPack capsule named 'dltensor_versioned'");
  $1 = (DLManagedTensorVersioned*)PyCapsule_GetPointer($input, SA_PY_VERSIONED);
}
%typemap(argout) DLManagedTensorVersioned* local_shard {
  /* The optimizer owns the tensor now; renaming keeps the capsule's destructor off it. */
  if (result == SA_OK && PyCapsule_SetName($input, "used_dltensor_versioned") != 0) SWIG_fail;
}

%typemap(in) DLManagedTensor* local_shard {
  if (!PyCapsule_IsValid($input, SA_PY_LEGACY))
    SWIG_exception_fail(SWIG_TypeError, "local_shard must be an unconsumed DLPack capsule named 'dltensor'");
  $1 = (DLManagedTensor*)PyCapsule_GetPointer($input, SA_PY_LEGACY);
}
%typemap(argout) DLManagedTensor* local_shard {
  if (result == SA_OK && PyCapsule_SetName($input, "used_dltensor") != 0) SWIG_fail;
}

%typemap(in) const DLTensor* grad {
  $1 = sa_py_capsule_dltensor($input);
  if (!$1) SWIG_exception_fail(SWIG_TypeError, "grad must be an unconsumed DLPack capsule ('dltensor_versioned' or 'dltensor')");
}
/* sa_optimizer_get_moment_values / set_moment_values: the caller's float32 host tensor. */
%typemap(in) const DLTensor* out, const DLTensor* values {
  $1 = sa_py_capsule_dltensor($input);
  if (!$1) SWIG_exception_fail(SWIG_TypeError, "$1_name must be an unconsumed DLPack capsule ('dltensor_versioned' or 'dltensor')");
}

%typemap(in, numinputs=0) DLManagedTensorVersioned** out (DLManagedTensorVersioned* view = NULL) { $1 = &view; }
%typemap(argout) DLManagedTensorVersioned** out {
  PyObject* capsule = Py_None;
  if (view$argnum) {
    capsule = PyCapsule_New(view$argnum, SA_PY_VERSIONED, sa_py_versioned_capsule_destructor);
    if (!capsule) { view$argnum->deleter(view$argnum); SWIG_fail; }
  } else {
    Py_INCREF(Py_None);
  }
  %append_output(capsule);
}

/* ---- structs passed as Python values ------------------------------------------------- */
%typemap(in) const sa_layout* layout (sa_py_layout storage, const sa_layout* read = NULL) {
  if (!sa_py_read_layout($input, &storage, &read)) SWIG_fail;
  $1 = ($1_ltype)read;
}

%typemap(in, numinputs=0) int64_t* local_shape (int64_t shape[SA_MAX_NDIM]) { $1 = shape; }
%typemap(in, numinputs=0) int64_t* global_offset (int64_t offset[SA_MAX_NDIM]) { $1 = offset; }
%typemap(argout) int64_t* local_shape, int64_t* global_offset {
  /* arg1 is the layout: both arrays have its ndim entries (none were written on failure). */
  %append_output(sa_py_int64_tuple($1, result == SA_OK ? arg1->ndim : 0));
}

%{
%}

/* options: None, or a dict of sa_param_options fields by name (sa_py_fill_struct; the others
 * keep the library's defaults, sa_struct_default). scale and amax are None or unconsumed
 * versioned capsules, renamed "used_dltensor_versioned" on SA_OK (the optimizer owns their
 * tensors then), left as they were on failure. */
%typemap(in) const sa_param_options* options (sa_param_options storage, PyObject* owned = NULL) {
  storage.struct_size = sizeof storage;
  if (sa_struct_default(SA_STRUCT_PARAM_OPTIONS, &storage) != SA_OK)
    SWIG_exception_fail(SWIG_RuntimeError, "sa_struct_default(SA_STRUCT_PARAM_OPTIONS) failed");
  $1 = NULL;
  if ($input != Py_None) {
    owned = PyList_New(0);
    if (owned == NULL || !sa_py_fill_struct(SA_STRUCT_PARAM_OPTIONS, "sa_param_options", $input, &storage, owned))
      SWIG_fail;
    if (storage.scale && storage.scale == storage.amax)
      SWIG_exception_fail(SWIG_ValueError, "options' scale and amax must be two tensors, not one capsule twice");
    $1 = &storage;
  }
}
%typemap(argout) const sa_param_options* options {
  if (result == SA_OK && owned$argnum) {
    for (Py_ssize_t k = 0; k < PyList_GET_SIZE(owned$argnum); ++k)
      if (PyCapsule_SetName(PyList_GET_ITEM(owned$argnum, k), "used_dltensor_versioned") != 0) SWIG_fail;
  }
}
%typemap(freearg) const sa_param_options* options { Py_XDECREF(owned$argnum); }

/* A struct of plain fields passed as None or a dict of its fields by name (sa_py_fill_struct;
 * the fields not named keep the struct's SA_*_INIT values): the step's arguments, the
 * import's options. */
%define SA_DICT_STRUCT(type, name, kind, init)
%typemap(in) const type* name (type storage) {
  const type defaults = init;
  storage = defaults;
  $1 = NULL;
  if ($input != Py_None) {
    if (!sa_py_fill_struct(kind, #type, $input, &storage, NULL)) SWIG_fail;
    $1 = &storage;
  }
}
%enddef
SA_DICT_STRUCT(sa_step_args, args, SA_STRUCT_STEP_ARGS, SA_STEP_ARGS_INIT)
SA_DICT_STRUCT(sa_import_options, options, SA_STRUCT_IMPORT_OPTIONS, SA_IMPORT_OPTIONS_INIT)

%typemap(in, numinputs=0) sa_param_info* out (sa_param_info info) {
  const sa_param_info init = SA_PARAM_INFO_INIT;
  info = init;
  $1 = &info;
}
%typemap(argout) sa_param_info* out {
  PyObject* dict = Py_None;
  if (result == SA_OK) {
    const sa_param_info* i = &info$argnum;
    dict = Py_BuildValue("{s:s,s:i,s:N,s:N,s:N,s:L,s:N,s:N,s:N,s:i,s:(ii),s:i,s:i,s:i}",
                         "name", i->name, "group", i->group,
                         "local_shape", sa_py_int64_tuple(i->local_shape, i->ndim),
                         "global_shape", sa_py_int64_tuple(i->global_shape, i->ndim),
                         "global_offset", sa_py_int64_tuple(i->global_offset, i->ndim),
                         "numel", (long long)i->numel,
                         "param_dtype", sa_py_dtype_tuple(i->param_dtype),
                         "grad_dtype", sa_py_dtype_tuple(i->grad_dtype),
                         "moment_dtype", sa_py_dtype_tuple(i->moment_dtype),
                         "master", i->master,
                         "device", (int)i->device.device_type, (int)i->device.device_id,
                         "scaling", i->scaling, "margin", i->margin,
                         "state_placement", i->state_placement);
    if (!dict) SWIG_fail;
  } else {
    Py_INCREF(Py_None);
  }
  %append_output(dict);
}

%typemap(in, numinputs=0) sa_field_info* out (sa_field_info info) {
  const sa_field_info init = SA_FIELD_INFO_INIT;
  info = init;
  $1 = &info;
}
%typemap(argout) sa_field_info* out {
  PyObject* dict = Py_None;
  if (result == SA_OK) {
    const sa_field_info* f = &info$argnum;
    dict = Py_BuildValue("{s:s,s:i,s:n,s:d,s:d,s:d,s:O,s:O,s:s,s:s,s:i,s:i}",
                         "name", f->name, "type", f->type, "offset", (Py_ssize_t)f->offset,
                         "default", f->default_value, "min", f->min, "max", f->max,
                         "max_inclusive", f->max_inclusive ? Py_True : Py_False,
                         "fixed_with_params", f->fixed_with_params ? Py_True : Py_False,
                         "rule", f->rule, "doc", f->doc, "dtype_role", f->dtype_role,
                         "rules", f->rules);
    if (!dict) SWIG_fail;
  } else {
    Py_INCREF(Py_None);
  }
  %append_output(dict);
}

%typemap(in, numinputs=0) sa_dtype_info* out (sa_dtype_info info) {
  const sa_dtype_info init = SA_DTYPE_INFO_INIT;
  info = init;
  $1 = &info;
}
%typemap(argout) sa_dtype_info* out {
  PyObject* dict = Py_None;
  if (result == SA_OK) {
    const sa_dtype_info* d = &info$argnum;
    PyObject* dtype = sa_py_dtype_tuple(d->dtype);
    if (!dtype) SWIG_fail;
    dict = Py_BuildValue("{s:s,s:N,s:i,s:z,s:s}", "name", d->name, "dtype", dtype, "roles",
                         d->roles, "safetensors_name", d->safetensors_name, "doc", d->doc);
    if (!dict) SWIG_fail;
  } else {
    Py_INCREF(Py_None);
  }
  %append_output(dict);
}

%typemap(in, numinputs=0) sa_param_scaling_info* out (sa_param_scaling_info info) {
  const sa_param_scaling_info init = SA_PARAM_SCALING_INFO_INIT;
  info = init;
  $1 = &info;
}
%typemap(argout) sa_param_scaling_info* out {
  PyObject* dict = Py_None;
  if (result == SA_OK) {
    const sa_param_scaling_info* d = &info$argnum;
    PyObject* dtype = sa_py_dtype_tuple(d->scale_dtype);
    if (!dtype) SWIG_fail;
    dict = Py_BuildValue("{s:i,s:s,s:L,s:N,s:i,s:s}", "value", d->value, "name", d->name, "block",
                         (long long)d->block, "scale_dtype", dtype, "step_writes_scale",
                         d->step_writes_scale, "doc", d->doc);
    if (!dict) SWIG_fail;
  } else {
    Py_INCREF(Py_None);
  }
  %append_output(dict);
}

/* Grads of all params in one checked call: one unconsumed DLPack capsule (either kind) or
 * None ("this param has no grad") per param, borrowed for the call. */
%typemap(in) (int64_t n, const DLTensor* const* grads) (PyObject* seq = NULL, const DLTensor** list = NULL) {
  seq = PySequence_Fast($input, "grads must be a sequence of DLPack capsules or None");
  if (!seq) SWIG_fail;
  $1 = (int64_t)PySequence_Fast_GET_SIZE(seq);
  list = (const DLTensor**)malloc(sizeof(DLTensor*) * (size_t)($1 > 0 ? $1 : 1));
  if (!list) { PyErr_NoMemory(); SWIG_fail; }
  for (int64_t i = 0; i < $1; ++i) {
    PyObject* item = PySequence_Fast_GET_ITEM(seq, i);
    list[i] = item == Py_None ? NULL : sa_py_capsule_dltensor(item);
    if (item != Py_None && !list[i]) {
      PyErr_Format(PyExc_TypeError, "grads[%lld] must be an unconsumed DLPack capsule ('dltensor_versioned' or "
                   "'dltensor') or None (no grad), got %s; raw addresses are not accepted",
                   (long long)i, Py_TYPE(item)->tp_name);
      SWIG_fail;
    }
  }
  $2 = ($2_ltype)list;
}
%typemap(freearg) (int64_t n, const DLTensor* const* grads) {
  Py_XDECREF(seq$argnum);
  free((void*)list$argnum);
}

/* The raw-pointer fast path trusts its caller to have checked dtype, shape and strides;
 * from Python nothing can have, so it is not wrapped (sa_optimizer_set_grads is the bulk
 * path, checked), nor its "no grad" marker. */
%ignore sa_optimizer_set_grad_ptrs;
%ignore SA_NO_GRAD;

/* ---- communicators -------------------------------------------------------------------- */
%typemap(in, numinputs=0) sa_comm** out (sa_comm* created = NULL) { $1 = &created; }
%typemap(argout) sa_comm** out {
  %append_output(SWIG_NewPointerObj(created$argnum, $descriptor(sa_comm*), 0));
}
%apply int32_t* OUTPUT { int32_t* rank, int32_t* nranks };

%typemap(in, numinputs=0) sa_nccl_unique_id* out (sa_nccl_unique_id uid) {
  memset(&uid, 0, sizeof uid);
  $1 = &uid;
}
%typemap(argout) sa_nccl_unique_id* out {
  %append_output(PyBytes_FromStringAndSize(uid$argnum.internal, result == SA_OK ? (Py_ssize_t)sizeof uid$argnum.internal : 0));
}
%typemap(in) const sa_nccl_unique_id* id (sa_nccl_unique_id uid) {
  char* bytes = NULL;
  Py_ssize_t size = 0;
  if (PyBytes_AsStringAndSize($input, &bytes, &size) != 0) SWIG_fail;
  if (size != (Py_ssize_t)sizeof uid.internal) {
    PyErr_Format(PyExc_ValueError, "an NCCL unique id has %zu bytes, got %zd", sizeof uid.internal, size);
    SWIG_fail;
  }
  memcpy(uid.internal, bytes, sizeof uid.internal);
  $1 = &uid;
}

%typemap(in) void* nccl_comm {
  if (!sa_py_read_address($input, &$1)) SWIG_fail;
}

/* ---- state export and import --------------------------------------------------------- */
%typemap(in, numinputs=0) sa_export_job** job (sa_export_job* created = NULL) { $1 = &created; }
%typemap(argout) sa_export_job** job {
  %append_output(SWIG_NewPointerObj(created$argnum, $descriptor(sa_export_job*), 0));
}
%apply int32_t* OUTPUT { int32_t* done };

%typemap(in) (int32_t n, const sa_reader* const* readers) (PyObject* seq = NULL, sa_reader** list = NULL) {
  seq = PySequence_Fast($input, "readers must be a sequence of sa_reader");
  if (!seq) SWIG_fail;
  $1 = (int32_t)PySequence_Fast_GET_SIZE(seq);
  list = (sa_reader**)malloc(sizeof(sa_reader*) * (size_t)($1 > 0 ? $1 : 1));
  if (!list) { PyErr_NoMemory(); SWIG_fail; }
  for (int32_t i = 0; i < $1; ++i) {
    void* reader = NULL;
    if (!SWIG_IsOK(SWIG_ConvertPtr(PySequence_Fast_GET_ITEM(seq, i), &reader, $descriptor(sa_reader*), 0)))
      SWIG_exception_fail(SWIG_TypeError, "readers must be a sequence of sa_reader");
    list[i] = (sa_reader*)reader;
  }
  $2 = ($2_ltype)list;
}
%typemap(freearg) (int32_t n, const sa_reader* const* readers) {
  Py_XDECREF(seq$argnum);
  free(list$argnum);
}

/* A memory reader borrows the bytes: the caller keeps the buffer object alive. */
%typemap(in) (const void* data, size_t size) {
  Py_buffer view;
  if (PyObject_GetBuffer($input, &view, PyBUF_CONTIG_RO) != 0) SWIG_fail;
  $1 = view.buf;
  $2 = (size_t)view.len;
  PyBuffer_Release(&view);
}

%typemap(in, numinputs=0) (const void** data, size_t* size) (const void* bytes = NULL, size_t count = 0) {
  $1 = ($1_ltype)&bytes;
  $2 = &count;
}
%typemap(argout) (const void** data, size_t* size) {
  %append_output(PyBytes_FromStringAndSize((const char*)bytes$argnum, (Py_ssize_t)count$argnum));
}

%typemap(in, numinputs=0) char** report_json (char* report = NULL) { $1 = &report; }
%typemap(argout) char** report_json {
  PyObject* text = Py_None;
  if (report$argnum) {
    text = PyUnicode_FromString(report$argnum);
    sa_free(report$argnum);
    if (!text) SWIG_fail;
  } else {
    Py_INCREF(Py_None);
  }
  %append_output(text);
}

/* ---- structs: which are classes, which are values ------------------------------------ */
/* Passed as Python values through the typemaps above. */
%ignore sa_placement;
%ignore sa_layout;
%ignore sa_param_options;
%ignore sa_param_info;
%ignore sa_field_info;
%ignore sa_dtype_info;
%ignore sa_param_scaling_info;
%ignore sa_step_args;
%ignore sa_struct_default;      /* a void* struct: the option classes below apply the defaults */
%ignore sa_free;               /* only sa_inspect's report needs it, freed by its typemap */
%ignore sa_writer_release;     /* called by the destructors below */
%ignore sa_reader_release;
%ignore sa_nccl_unique_id;     /* travels as its 128 bytes */
%ignore sa_host_comm;          /* C callbacks: host_comm_create below makes one from a callable */
%ignore sa_comm_create_host;
%ignore sa_optimizer_state_keys;       /* arrays of strings: state_keys_get below */
%ignore sa_optimizer_checkpoint_keys;
%ignore sa_optimizer_moment_keys;
%ignore sa_optimizer_get_param_steps;  /* int64_t arrays: param_steps_get/_set below */
%ignore sa_optimizer_set_param_steps;
%ignore sa_optimizer_step_params;      /* an int64_t array: step_params below */

/* Classes whose constructors apply the SA_*_INIT defaults. */
%define SA_OPTION_STRUCT(type, init)
%immutable type::struct_size;
%extend type {
  type() {
    const type defaults = init;
    type* self = (type*)malloc(sizeof(type));
    if (self) *self = defaults;
    return self;
  }
}
%enddef
%feature("docstring") sa_optimizer_config "Options of sa_optimizer_create (SA_OPTIMIZER_CONFIG_INIT defaults)."
SA_OPTION_STRUCT(sa_optimizer_config, SA_OPTIMIZER_CONFIG_INIT)
SA_OPTION_STRUCT(sa_group_config, SA_GROUP_CONFIG_INIT)
%ignore sa_import_options;  /* a dict by field name (the typemap above) */

/* Writer and reader handles: filled by sa_file_writer & co., released by their destructor. */
%ignore sa_writer::ctx;
%ignore sa_writer::write;
%ignore sa_writer::commit;
%ignore sa_writer::release;
%ignore sa_writer::write_at;
%ignore sa_writer::reserve;
%immutable sa_writer::struct_size;
%ignore sa_reader::ctx;
%ignore sa_reader::read_at;
%ignore sa_reader::release;
%immutable sa_reader::struct_size;
%immutable sa_reader::size;
%immutable sa_reader::name;
%immutable sa_reader::concurrent;
SA_OPTION_STRUCT(sa_writer, SA_WRITER_INIT)
SA_OPTION_STRUCT(sa_reader, SA_READER_INIT)
%extend sa_writer {
  ~sa_writer() {
    sa_writer_release($self);
    free($self);
  }
}
%extend sa_reader {
  ~sa_reader() {
    sa_reader_release($self);
    free($self);
  }
}

%include <shardadam/shardadam.h>

/* ---- additions for the Python package ------------------------------------------------ */
%inline %{
/** sa_optimizer_state_keys (which 0), sa_optimizer_checkpoint_keys (1) or
 *  sa_optimizer_moment_keys (2) of a param: (status, tuple of str), the tuple None when the
 *  status is not SA_OK. */
PyObject* state_keys_get(const sa_optimizer* opt, int64_t param, int which) {
  const char* keys[16];
  int32_t count = 0;
  const sa_status status = which == 2   ? sa_optimizer_moment_keys(opt, param, keys, 16, &count)
                           : which == 1 ? sa_optimizer_checkpoint_keys(opt, param, keys, 16, &count)
                                        : sa_optimizer_state_keys(opt, param, keys, 16, &count);
  PyObject* tuple = NULL;
  if (status == SA_OK) {
    if (count > 16) {
      PyErr_Format(PyExc_RuntimeError, "state_keys_get: the param has %d states, more than 16", (int)count);
      return NULL;
    }
    tuple = PyTuple_New(count);
    for (int32_t i = 0; tuple && i < count; ++i) {
      PyObject* key = PyUnicode_InternFromString(keys[i]);
      if (!key) Py_CLEAR(tuple); else PyTuple_SET_ITEM(tuple, i, key);
    }
    if (!tuple) return NULL;
  } else {
    tuple = Py_None;
    Py_INCREF(tuple);
  }
  return Py_BuildValue("(iN)", (int)status, tuple);
}

/** sa_optimizer_get_param_steps of params [first, first + n) (n < 0: to the last param):
 *  (status, list of int), the list None when the status is not SA_OK (the library checks
 *  the range). */
PyObject* param_steps_get(const sa_optimizer* opt, int64_t first, int64_t n) {
  if (n < 0) n = opt ? sa_optimizer_num_params(opt) - first : 0;
  int64_t* steps = (int64_t*)malloc(sizeof(int64_t) * (size_t)(n > 0 ? n : 1));
  if (!steps) return PyErr_NoMemory();
  const sa_status status = sa_optimizer_get_param_steps(opt, first, n, steps);
  PyObject* list = NULL;
  if (status == SA_OK) {
    list = PyList_New((Py_ssize_t)n);
    for (int64_t i = 0; list && i < n; ++i) {
      PyObject* item = PyLong_FromLongLong((long long)steps[i]);
      if (!item) Py_CLEAR(list); else PyList_SET_ITEM(list, (Py_ssize_t)i, item);
    }
    if (!list) {
      free(steps);
      return NULL;
    }
  } else {
    list = Py_None;
    Py_INCREF(list);
  }
  free(steps);
  return Py_BuildValue("(iN)", (int)status, list);
}

/** sa_optimizer_set_param_steps from a sequence of ints, one per param from `first`. */
PyObject* param_steps_set(sa_optimizer* opt, int64_t first, PyObject* values) {
  PyObject* seq = PySequence_Fast(values, "steps must be a sequence of int");
  if (!seq) return NULL;
  const int64_t n = (int64_t)PySequence_Fast_GET_SIZE(seq);
  int64_t* steps = (int64_t*)malloc(sizeof(int64_t) * (size_t)(n > 0 ? n : 1));
  if (!steps) {
    Py_DECREF(seq);
    return PyErr_NoMemory();
  }
  for (int64_t i = 0; i < n; ++i) {
    steps[i] = (int64_t)PyLong_AsLongLong(PySequence_Fast_GET_ITEM(seq, (Py_ssize_t)i));
    if (steps[i] == -1 && PyErr_Occurred()) {
      free(steps);
      Py_DECREF(seq);
      return NULL;
    }
  }
  Py_DECREF(seq);
  const sa_status status = sa_optimizer_set_param_steps(opt, first, n, steps);
  free(steps);
  return PyLong_FromLong((long)status);
}

/** sa_optimizer_step_params with the params as a sequence of ints. Returns the status. */
PyObject* step_params(sa_optimizer* opt, PyObject* params, const sa_step_args* args, void* stream) {
  PyObject* seq = PySequence_Fast(params, "params must be a sequence of int");
  if (!seq) return NULL;
  const int64_t n = (int64_t)PySequence_Fast_GET_SIZE(seq);
  int64_t* indices = (int64_t*)malloc(sizeof(int64_t) * (size_t)(n > 0 ? n : 1));
  if (!indices) {
    Py_DECREF(seq);
    return PyErr_NoMemory();
  }
  for (int64_t i = 0; i < n; ++i) {
    indices[i] = (int64_t)PyLong_AsLongLong(PySequence_Fast_GET_ITEM(seq, (Py_ssize_t)i));
    if (indices[i] == -1 && PyErr_Occurred()) {
      free(indices);
      Py_DECREF(seq);
      return NULL;
    }
  }
  Py_DECREF(seq);
  sa_status status;
  Py_BEGIN_ALLOW_THREADS
  status = sa_optimizer_step_params(opt, n, indices, args, stream);
  Py_END_ALLOW_THREADS
  free(indices);
  return PyLong_FromLong((long)status);
}

/** Creates a host communicator whose all_reduce calls `reducer(buffer, op)`: buffer is a
 * bytearray holding the `count` doubles (native byte order), to be reduced in place; op
 * is SA_REDUCE_SUM or SA_REDUCE_MAX. With `all_to_all` nonzero, its all_to_all calls
 * `reducer.exchange(send, send_bytes, recv, recv_bytes)`: bytearrays and lists of
 * `reducer.nranks` sizes, recv to be filled in place. A reducer that raises makes the
 * step fail with SA_ERR_COMM; its exception is stored as `reducer.exception` (it stays None
 * otherwise) for the package to surface. The communicator holds a reference to `reducer`
 * until it is freed. `rank` and `nranks` are sa_host_comm's (0 and 0: not said). Returns
 * (status, comm). */
PyObject* host_comm_create(PyObject* reducer, int rank, int nranks, int all_to_all) {
  if (!PyCallable_Check(reducer)) {
    PyErr_SetString(PyExc_TypeError, "host_comm_create: the reducer must be callable");
    return NULL;
  }
  sa_host_comm callbacks = SA_HOST_COMM_INIT;
  callbacks.ctx = reducer;
  callbacks.all_reduce = sa_py_host_all_reduce;
  callbacks.release = sa_py_host_release;
  callbacks.rank = rank;
  callbacks.nranks = nranks;
  if (all_to_all) callbacks.all_to_all = sa_py_host_all_to_all;
  sa_comm* comm = NULL;
  Py_INCREF(reducer);  /* the communicator's reference, dropped by sa_py_host_release */
  sa_status status = sa_comm_create_host(&callbacks, &comm);
  if (status != SA_OK) Py_DECREF(reducer);  /* no communicator: release is never called */
  return Py_BuildValue("(iN)", (int)status, SWIG_NewPointerObj(comm, SWIGTYPE_p_sa_comm, 0));
}

/** (data address with byte_offset applied, (device_type, device_id), (code, bits, lanes),
 * shape, strides or None, read_only, versioned) of an unconsumed DLPack capsule of either
 * kind; versioned is True for "dltensor_versioned", False for "dltensor". */
PyObject* dlpack_capsule_info(PyObject* capsule) {
  const DLTensor* t = sa_py_capsule_dltensor(capsule);
  if (!t) {
    PyErr_SetString(PyExc_TypeError, "expected an unconsumed DLPack capsule ('dltensor_versioned' or 'dltensor')");
    return NULL;
  }
  int versioned = PyCapsule_IsValid(capsule, SA_PY_VERSIONED);
  int read_only = versioned && (((DLManagedTensorVersioned*)PyCapsule_GetPointer(capsule, SA_PY_VERSIONED))->flags &
                                DLPACK_FLAG_BITMASK_READ_ONLY) != 0;
  PyObject* strides = Py_None;
  if (t->strides) {
    strides = sa_py_int64_tuple(t->strides, t->ndim);
  } else {
    Py_INCREF(Py_None);
  }
  return Py_BuildValue("(N(ii)NNNOO)", PyLong_FromVoidPtr((void*)((uintptr_t)t->data + t->byte_offset)),
                       (int)t->device.device_type, (int)t->device.device_id, sa_py_dtype_tuple(t->dtype),
                       sa_py_int64_tuple(t->shape, t->ndim), strides, read_only ? Py_True : Py_False,
                       versioned ? Py_True : Py_False);
}

/** Changes the dtype an unconsumed capsule declares, keeping the element size. For producers
 * that cannot export a dtype themselves: numpy exports no ml_dtypes.bfloat16 array, so the
 * package exports its uint16 view and relabels it (and the reverse for numpy consumers). */
PyObject* dlpack_capsule_set_dtype(PyObject* capsule, int code, int bits, int lanes) {
  DLTensor* t = sa_py_capsule_dltensor(capsule);
  if (!t) {
    PyErr_SetString(PyExc_TypeError, "expected an unconsumed DLPack capsule ('dltensor_versioned' or 'dltensor')");
    return NULL;
  }
  if (bits <= 0 || lanes <= 0 || bits * lanes != t->dtype.bits * t->dtype.lanes) {
    PyErr_Format(PyExc_ValueError, "dtype (%d, %d, %d) does not have the %d-bit elements of the tensor",
                 code, bits, lanes, t->dtype.bits * t->dtype.lanes);
    return NULL;
  }
  t->dtype.code = (uint8_t)code;
  t->dtype.bits = (uint8_t)bits;
  t->dtype.lanes = (uint16_t)lanes;
  Py_INCREF(capsule);
  return capsule;
}

/** Wraps an unconsumed "dltensor_versioned" capsule as a legacy "dltensor" capsule, for
 * consumers of the pre-1.0 protocol. The input capsule is consumed. */
PyObject* dlpack_versioned_to_legacy(PyObject* capsule) {
  if (!PyCapsule_IsValid(capsule, SA_PY_VERSIONED)) {
    PyErr_SetString(PyExc_TypeError, "expected an unconsumed DLPack capsule named 'dltensor_versioned'");
    return NULL;
  }
  sa_py_legacy_view* view = (sa_py_legacy_view*)malloc(sizeof(sa_py_legacy_view));
  if (!view) return PyErr_NoMemory();
  view->versioned = (DLManagedTensorVersioned*)PyCapsule_GetPointer(capsule, SA_PY_VERSIONED);
  view->legacy.dl_tensor = view->versioned->dl_tensor;
  view->legacy.manager_ctx = view;
  view->legacy.deleter = sa_py_legacy_view_deleter;
  PyObject* legacy = PyCapsule_New(&view->legacy, SA_PY_LEGACY, sa_py_legacy_capsule_destructor);
  if (!legacy) {
    free(view);
    return NULL;
  }
  PyCapsule_SetName(capsule, "used_dltensor_versioned");
  return legacy;
}
%}
