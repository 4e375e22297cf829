/*
 * grad_intake.c — the extension module shardadam._grad_intake: binds the grads of every
 * param of an optimizer in one checked C call (sa_optimizer_set_grads), reading them from
 * torch params through the CPython API only (no torch headers, no build-time torch); and
 * registers runs of plain params the same way (add_params).
 *
 * Why native: FusedAdam.step() hands over fresh grad tensors every step, and the Python
 * loop doing it (p.grad, the DTensor's local tensor, a DLPack export per grad) cost about
 * 0.9 us per param on an H200 host, more than the step itself at a few thousand params.
 * From C, each grad costs the `grad` attribute, `_local_tensor` for a DTensor grad, and a
 * description of the local tensor (data, device, dtype, shape, strides). The description
 * comes from the tensor type's DLPack C exchange API where it has one (torch >= 2.10:
 * `__dlpack_c_exchange_api__`, dltensor_from_py_object_no_sync fills a DLTensor in place:
 * no allocation, no capsule), else from torch.utils.dlpack.to_dlpack (one C call, ~280 ns,
 * and a capsule whose deleter runs after the bind). Measured on a 2-core VM at 100k params
 * of 16 elements: the intake went from ~490 to ~270 ns per param with the exchange API
 * (the `grad` attribute alone is ~100 ns of that). The checks of those descriptions are the
 * library's (sa_optimizer_set_grads), not this file's: every grad is described afresh
 * and checked at every call.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdlib.h>
#include <string.h>

#include <shardadam/shardadam.h>

static PyObject* s_to_local;   /* "to_local" */
static PyObject* s_placements; /* "placements" */
static PyObject* s_dim;        /* "dim" */

/* The per-grad tables of a bind_param_grads call, all NULL between calls. One set is
 * kept by the module and grown as needed: allocating them afresh at every step cost page
 * faults (about 5 MB at 100k params, above malloc's mmap threshold). A call made while
 * they are in use (to_dlpack may run Python code, which may bind another optimizer's
 * grads) gets tables of its own. */
typedef struct {
  Py_ssize_t capacity;
  PyObject** locals;
  PyObject** capsules;
  const DLTensor** grads;
  DLTensor* described;
} Scratch;

static Scratch s_scratch;
static int s_scratch_busy;

static void scratch_free(Scratch* s) {
  free(s->locals);
  free(s->capsules);
  free((void*)s->grads);
  free(s->described);
  memset(s, 0, sizeof *s);
}

/* Tables for n grads, all entries NULL: the module's, else `own` filled. NULL when memory
 * runs out. */
static Scratch* scratch_take(Py_ssize_t n, Scratch* own) {
  Scratch* s = s_scratch_busy ? own : &s_scratch;
  if (s->capacity < n || s->capacity == 0) {
    scratch_free(s);
    const size_t slots = (size_t)(n > 0 ? n : 1);
    s->locals = (PyObject**)calloc(slots, sizeof(PyObject*));
    s->capsules = (PyObject**)calloc(slots, sizeof(PyObject*));
    s->grads = (const DLTensor**)calloc(slots, sizeof(DLTensor*));
    s->described = (DLTensor*)malloc(slots * sizeof(DLTensor));
    if (!s->locals || !s->capsules || !s->grads || !s->described) {
      scratch_free(s);
      return NULL;
    }
    s->capacity = (Py_ssize_t)slots;
  }
  if (s == &s_scratch) s_scratch_busy = 1;
  return s;
}

/* Ends a call's use of tables from scratch_take (their entries already NULL again). */
static void scratch_give_back(Scratch* s, Scratch* own) {
  if (s == &s_scratch)
    s_scratch_busy = 0;
  else
    scratch_free(own);
}

/* An attribute read through its type's data descriptor, the descriptor kept per attribute
 * for the last type asked (all params, or all grads, of a model are nearly always of one
 * type). Where the type resolves the name to a data descriptor (torch's getset `grad`; the
 * member slots `_local_tensor` and `_spec` of DTensor), that descriptor takes precedence over
 * any instance attribute, so calling its getter directly reads what Python would, skipping
 * the generic lookup (about a fifth of a DTensor grad's reads). Otherwise, as Python would. */
typedef struct {
  PyObject* name;     /* interned */
  PyTypeObject* type; /* strong reference, or NULL */
  PyObject* descr;    /* its data descriptor for `name` (strong), or NULL */
} AttrCache;

static AttrCache s_grad_attr, s_local_tensor_attr, s_spec_attr;

/* obj.<cache->name>: a new reference, or NULL with an exception set. */
static PyObject* cached_attr(AttrCache* cache, PyObject* obj) {
  PyTypeObject* type = Py_TYPE(obj);
  if (type != cache->type) {
    PyObject* descr = _PyType_Lookup(type, cache->name); /* borrowed */
    if (descr && !(Py_TYPE(descr)->tp_descr_get && Py_TYPE(descr)->tp_descr_set)) descr = NULL;
    Py_XINCREF(descr);
    Py_XSETREF(cache->descr, descr);
    Py_INCREF(type);
    Py_XSETREF(cache->type, type);
  }
  if (cache->descr) return Py_TYPE(cache->descr)->tp_descr_get(cache->descr, obj, (PyObject*)type);
  return PyObject_GetAttr(obj, cache->name);
}

/* The sa_optimizer* of a SWIG handle object (its int() is the address). */
static sa_optimizer* optimizer_of(PyObject* handle) {
  PyObject* address = PyNumber_Long(handle);
  if (!address) return NULL;
  void* pointer = PyLong_AsVoidPtr(address);
  Py_DECREF(address);
  if (!pointer && !PyErr_Occurred())
    PyErr_SetString(PyExc_ValueError, "the optimizer handle is NULL");
  return (sa_optimizer*)pointer;
}

/* The DLTensor of a capsule from a DLPack producer (either protocol), or NULL with an
 * exception set. */
static const DLTensor* capsule_dltensor(PyObject* capsule) {
  if (PyCapsule_IsValid(capsule, "dltensor"))
    return &((DLManagedTensor*)PyCapsule_GetPointer(capsule, "dltensor"))->dl_tensor;
  if (PyCapsule_IsValid(capsule, "dltensor_versioned"))
    return &((DLManagedTensorVersioned*)PyCapsule_GetPointer(capsule, "dltensor_versioned"))
                ->dl_tensor;
  PyErr_SetString(PyExc_TypeError, "to_dlpack did not return an unconsumed DLPack capsule");
  return NULL;
}

/* The DLPack C exchange API table of a tensor type, or NULL when the type has none (or one
 * of another major version): `__dlpack_c_exchange_api__`, a capsule on the type. The last
 * type asked is remembered (all grads of a step are nearly always of one type); the table
 * lives as long as the process (the protocol's promise). */
#if DLPACK_MAJOR_VERSION == 1 && DLPACK_MINOR_VERSION >= 2
#define SA_HAVE_EXCHANGE_API 1
static PyTypeObject* s_api_type; /* strong reference, or NULL */
static const DLPackExchangeAPI* s_api;
static PyObject* s_exchange_api; /* "__dlpack_c_exchange_api__" */

static const DLPackExchangeAPI* exchange_api_of(PyTypeObject* type) {
  if (type == s_api_type) return s_api;
  const DLPackExchangeAPI* api = NULL;
  PyObject* capsule = PyObject_GetAttr((PyObject*)type, s_exchange_api);
  if (capsule && PyCapsule_IsValid(capsule, "dlpack_exchange_api")) {
    api = (const DLPackExchangeAPI*)PyCapsule_GetPointer(capsule, "dlpack_exchange_api");
    if (api && (api->header.version.major != DLPACK_MAJOR_VERSION ||
                !api->dltensor_from_py_object_no_sync))
      api = NULL;
  }
  Py_XDECREF(capsule);
  PyErr_Clear(); /* no table: to_dlpack describes the grads of this type */
  Py_INCREF(type);
  Py_XSETREF(s_api_type, type);
  s_api = api;
  return api;
}
#endif

/* The tensor whose memory the step reads: a DTensor's local tensor, else grad itself.
 * Returns a new reference or NULL with an exception set. */
static PyObject* local_of(PyObject* grad, PyObject* dtensor_type) {
  if (dtensor_type == Py_None || !PyObject_TypeCheck(grad, (PyTypeObject*)dtensor_type)) {
    Py_INCREF(grad);
    return grad;
  }
  PyObject* local = cached_attr(&s_local_tensor_attr, grad);
  if (local && local != Py_None) return local;
  Py_XDECREF(local);
  PyErr_Clear(); /* a DTensor without the private attribute: its public accessor */
  return PyObject_CallMethodNoArgs(grad, s_to_local);
}

/* Whether two placements are the same, 1 or 0 (-1 with an exception set). Cheap where
 * it can be: the same object, Replicate against Replicate, Shard against Shard by their
 * dims (exact types: a _StridedShard is not a Shard); anything else compares with ==. */
static int same_placement(PyObject* a, PyObject* b, PyObject* shard_type,
                          PyObject* replicate_type) {
  if (a == b) return 1;
  if (Py_TYPE(a) != Py_TYPE(b)) return PyObject_RichCompareBool(a, b, Py_EQ);
  if ((PyObject*)Py_TYPE(a) == replicate_type) return 1;
  if ((PyObject*)Py_TYPE(a) == shard_type) {
    PyObject* da = PyObject_GetAttr(a, s_dim);
    PyObject* db = da ? PyObject_GetAttr(b, s_dim) : NULL;
    const int same = db ? PyObject_RichCompareBool(da, db, Py_EQ) : -1;
    Py_XDECREF(da);
    Py_XDECREF(db);
    return same;
  }
  return PyObject_RichCompareBool(a, b, Py_EQ);
}

/* Whether a DTensor grad is placed as its param (whose placements tuple is `expected`):
 * 1 or 0, -1 with an exception set. Fast when the grad's placements tuple is the param's
 * (FSDP2's grads share their param's spec) or the one last found equal to it, which
 * `*seen` keeps (a Shard's dim costs ~0.2 us to read). */
static int placed_as(PyObject* grad, PyObject* expected, PyObject** seen, PyObject* shard_type,
                     PyObject* replicate_type) {
  PyObject* spec = cached_attr(&s_spec_attr, grad);
  PyObject* got = spec ? PyObject_GetAttr(spec, s_placements) : NULL;
  Py_XDECREF(spec);
  if (!got) return -1;
  int same = got == expected || got == *seen;
  if (!same && PyTuple_Check(got) && PyTuple_Check(expected) &&
      PyTuple_GET_SIZE(got) == PyTuple_GET_SIZE(expected)) {
    same = 1;
    for (Py_ssize_t d = 0; same == 1 && d < PyTuple_GET_SIZE(got); ++d)
      same = same_placement(PyTuple_GET_ITEM(got, d), PyTuple_GET_ITEM(expected, d), shard_type,
                            replicate_type);
    if (same == 1) {
      Py_INCREF(got);
      Py_SETREF(*seen, got);
    }
  }
  Py_DECREF(got);
  return same;
}

/* The pending exception as an object, its traceback attached, and none pending any more
 * (NULL when there was none). */
static PyObject* take_exception(void) {
  PyObject *type, *value, *traceback;
  PyErr_Fetch(&type, &value, &traceback);
  PyErr_NormalizeException(&type, &value, &traceback);
  if (value && traceback) PyException_SetTraceback(value, traceback);
  Py_XDECREF(type);
  Py_XDECREF(traceback);
  return value;
}

/* Replaces the pending exception by a TypeError naming the param, caused by the original. */
static void blame_param(PyObject* names, Py_ssize_t i, const char* what) {
  PyObject* value = take_exception();
  PyObject* name = PySequence_GetItem(names, i);
  PyObject* message =
      name ? PyUnicode_FromFormat("param %R: %s: %S", name, what, value ? value : Py_None) : NULL;
  Py_XDECREF(name);
  PyObject* error = message ? PyObject_CallOneArg(PyExc_TypeError, message) : NULL;
  Py_XDECREF(message);
  if (!error) { /* no better message: keep the original */
    PyErr_Clear();
    if (value) PyErr_SetObject((PyObject*)Py_TYPE(value), value);
    Py_XDECREF(value);
    return;
  }
  if (value) PyException_SetCause(error, value); /* steals value */
  PyErr_SetObject(PyExc_TypeError, error);
  Py_DECREF(error);
}

/* Reads every extent and stride of the n descriptions (NULL entries skipped): what any
 * check of them reads, in memory that describing them did not touch (torch's tensors' size
 * arrays). A sum of them all, so that no read is dropped. */
static int64_t read_extents(const DLTensor* const* grads, Py_ssize_t n) {
  int64_t sum = 0;
  for (Py_ssize_t i = 0; i < n; ++i) {
    const DLTensor* grad = grads[i];
    if (!grad) continue;
    for (int32_t d = 0; d < grad->ndim; ++d)
      sum += grad->shape[d] + (grad->strides ? grad->strides[d] : 0);
  }
  return sum;
}

PyDoc_STRVAR(
    bind_param_grads_doc,
    "bind_param_grads(handle, params, names, dtensor_type, to_dlpack, placements,\n"
    "                 seen_placements, shard_type, replicate_type, bind=True)\n"
    "    -> (status, count, misplaced, held)\n"
    "\n"
    "Binds the grad of every param in one call of sa_optimizer_set_grads (each grad checked by\n"
    "the library: dtype, device, shape, C-contiguous strides, alignment). params[i] is the\n"
    "torch param of native param i; its `.grad` is read (an instance of dtensor_type gives its\n"
    "local tensor) and described afresh: through the DLPack C exchange API of its type where\n"
    "the type has one (`__dlpack_c_exchange_api__`), else by to_dlpack\n"
    "(torch.utils.dlpack.to_dlpack). A None grad is\n"
    "bound as \"no grad\" (the step skips the param). names[i] names param i in errors.\n"
    "\n"
    "placements[i] is the placements tuple of DTensor param i (None for a plain param): a\n"
    "DTensor grad placed otherwise (a Partial grad of tensor parallelism, another Shard dim)\n"
    "is not bound; misplaced lists such params (None when there are none), and when there\n"
    "are any nothing is bound: the caller redistributes their grads and calls again.\n"
    "seen_placements[i] (None at first) is a cache this call keeps: the last grad placements\n"
    "tuple found equal to param i's.\n"
    "shard_type and replicate_type are DTensor's Shard and Replicate (compared cheaply).\n"
    "\n"
    "When no param has a grad, nothing is bound and (0, 0, None, None) is returned. Otherwise\n"
    "the result is (status of sa_optimizer_set_grads, number of params with a grad, None,\n"
    "held); on a failing status nothing was bound (held is None) and\n"
    "sa_optimizer_last_error(handle) says which param failed and why. A grad that to_dlpack\n"
    "cannot describe raises TypeError naming the param; nothing is bound then either.\n"
    "\n"
    "held is a list of the tensors bound (the grads, or their local tensors): the caller\n"
    "keeps it until it has stepped and unbound them (unbind_grads). A param's `grad` may\n"
    "make a new tensor at each read (a property of a Parameter subclass), which nothing else\n"
    "holds; once unbound and dropped, zero_grad() frees the grads' memory as usual.\n"
    "\n"
    "bind=False reads and describes every grad as above, reads every extent and stride of\n"
    "the descriptions (what any check of them must read) and stops before the library:\n"
    "nothing is bound and (0, count, misplaced, None) is returned. It measures the least a\n"
    "checked intake costs (bench/python_host_step.py).");

static PyObject* bind_param_grads(PyObject* self, PyObject* args) {
  (void)self;
  PyObject *handle, *params, *names, *dtensor_type, *to_dlpack, *placements, *seen_placements,
      *shard_type, *replicate_type;
  int bind = 1;
  if (!PyArg_ParseTuple(args, "OO!OOOO!O!OO|p:bind_param_grads", &handle, &PyList_Type, &params,
                        &names, &dtensor_type, &to_dlpack, &PyList_Type, &placements, &PyList_Type,
                        &seen_placements, &shard_type, &replicate_type, &bind))
    return NULL;
  if (PyList_GET_SIZE(placements) != PyList_GET_SIZE(params) ||
      PyList_GET_SIZE(seen_placements) != PyList_GET_SIZE(params)) {
    PyErr_SetString(PyExc_ValueError,
                    "bind_param_grads: one placements and one seen_placements entry per param");
    return NULL;
  }
  if (dtensor_type != Py_None && !PyType_Check(dtensor_type)) {
    PyErr_SetString(PyExc_TypeError, "bind_param_grads: dtensor_type must be a type or None");
    return NULL;
  }
  sa_optimizer* opt = optimizer_of(handle);
  if (!opt) return NULL;
  const Py_ssize_t n = PyList_GET_SIZE(params);
  Scratch own = {0}; /* this call's tables when the module's are in use */
  Scratch* scratch = scratch_take(n, &own);
  if (!scratch) return PyErr_NoMemory();
  PyObject** locals = scratch->locals;     /* the tensors described */
  PyObject** capsules = scratch->capsules; /* to_dlpack's, where used */
  const DLTensor** grads = scratch->grads;
  DLTensor* described = scratch->described; /* the exchange API's */
  PyObject* result = NULL;
  PyObject* misplaced = NULL; /* indices of misplaced DTensor grads, made at the first */
  Py_ssize_t count = 0;
  /* First every Python-level read (the grad attribute, a DTensor's local tensor: either may
   * run Python code), then the descriptions and the checks with no Python code in between:
   * a description points into its tensor's metadata (shape, strides), which nothing can
   * change before sa_optimizer_set_grads has read it. */
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* grad = cached_attr(&s_grad_attr, PyList_GET_ITEM(params, i));
    if (!grad) goto done;
    if (grad == Py_None) {
      Py_DECREF(grad);
      continue;
    }
    PyObject* expected = PyList_GET_ITEM(placements, i);
    if (expected != Py_None && dtensor_type != Py_None &&
        PyObject_TypeCheck(grad, (PyTypeObject*)dtensor_type)) {
      PyObject** seen = &PyList_GET_ITEM(seen_placements, i);
      const int same = placed_as(grad, expected, seen, shard_type, replicate_type);
      if (same != 1) {
        Py_DECREF(grad);
        if (same < 0) {
          blame_param(names, i, "cannot read the placements of its DTensor grad");
          goto done;
        }
        PyObject* index = PyLong_FromSsize_t(i);
        if (!misplaced) misplaced = PyList_New(0);
        if (!index || !misplaced || PyList_Append(misplaced, index) < 0) {
          Py_XDECREF(index);
          goto done;
        }
        Py_DECREF(index);
        continue;
      }
    }
    locals[i] = local_of(grad, dtensor_type);
    Py_DECREF(grad);
    if (!locals[i]) {
      blame_param(names, i, "cannot read the local tensor of its DTensor grad");
      goto done;
    }
    ++count;
  }
  if (misplaced) {
    result = Py_BuildValue("(inOO)", (int)SA_OK, (Py_ssize_t)0, misplaced, Py_None);
    goto done;
  }
  for (Py_ssize_t i = 0; i < n; ++i) {
    if (!locals[i]) continue;
#ifdef SA_HAVE_EXCHANGE_API
    const DLPackExchangeAPI* api = exchange_api_of(Py_TYPE(locals[i]));
    if (api) {
      if (api->dltensor_from_py_object_no_sync(locals[i], &described[i]) != 0) {
        blame_param(names, i, "its grad cannot be handed over through DLPack");
        goto done;
      }
      grads[i] = &described[i];
      continue;
    }
#endif
    capsules[i] = PyObject_CallOneArg(to_dlpack, locals[i]);
    if (!capsules[i]) {
      blame_param(names, i, "its grad cannot be handed over through DLPack");
      goto done;
    }
    grads[i] = capsule_dltensor(capsules[i]);
    if (!grads[i]) {
      blame_param(names, i, "its grad cannot be handed over through DLPack");
      goto done;
    }
  }
  if (count == 0 || !bind) {
    if (!bind) {
      volatile int64_t sink = read_extents(grads, n);
      (void)sink;
    }
    result = Py_BuildValue("(inOO)", (int)SA_OK, count, Py_None, Py_None);
  } else {
    PyObject* held = PyList_New(count);
    if (!held) goto done;
    const sa_status status = sa_optimizer_set_grads(opt, (int64_t)n, grads);
    if (status != SA_OK) {
      Py_DECREF(held);
      result = Py_BuildValue("(inOO)", (int)status, count, Py_None, Py_None);
      goto done;
    }
    Py_ssize_t k = 0;
    for (Py_ssize_t i = 0; i < n; ++i) {
      if (!locals[i]) continue;
      PyList_SET_ITEM(held, k++, locals[i]); /* the reference moves into the list */
      locals[i] = NULL;
    }
    result = Py_BuildValue("(inON)", (int)status, count, Py_None, held);
  }
done:
  Py_XDECREF(misplaced);
  for (Py_ssize_t i = 0; i < n; ++i) { /* unconsumed capsules: their deleters run */
    Py_CLEAR(capsules[i]);
    Py_CLEAR(locals[i]);
    grads[i] = NULL;
  }
  scratch_give_back(scratch, &own);
  return result;
}

PyDoc_STRVAR(
    unbind_grads_doc,
    "unbind_grads(handle) -> status\n"
    "\n"
    "Marks every param of the optimizer as having no grad (sa_optimizer_set_grads with NULL\n"
    "entries), so that no binding outlives the grads it points to: a step before the next\n"
    "bind_param_grads skips every param instead of reading freed memory.");

static PyObject* unbind_grads(PyObject* self, PyObject* handle) {
  (void)self;
  sa_optimizer* opt = optimizer_of(handle);
  if (!opt) return NULL;
  const int64_t n = sa_optimizer_num_params(opt);
  Scratch own = {0};
  Scratch* scratch = scratch_take((Py_ssize_t)n, &own);
  if (!scratch) return PyErr_NoMemory();
  const sa_status status = sa_optimizer_set_grads(opt, n, scratch->grads); /* all NULL */
  scratch_give_back(scratch, &own);
  return PyLong_FromLong((long)status);
}

PyDoc_STRVAR(
    add_params_doc,
    "add_params(handle, group, params, names) -> (status, taken, error) or None\n"
    "\n"
    "Registers plain tensors (not DTensors, not fp8) with the library's default options, one\n"
    "sa_optimizer_add_param each, in order, into group `group`: each param is handed over as a\n"
    "DLManagedTensorVersioned that its type's DLPack C exchange API makes (the library owns it\n"
    "once taken, as it owns a capsule's tensor). names[i] (a str) names params[i].\n"
    "\n"
    "Returns None, registering nothing, where the first param's type has no exchange API (the\n"
    "caller registers them otherwise). Otherwise (status, taken, error): the first `taken`\n"
    "params were taken, as the optimizer's next params (indices num_params() before the call\n"
    "on), which the caller records whatever else happened; the param after them was refused, by "
    "the library (a failing status: sa_optimizer_last_error(handle) says\n"
    "why) or before it (error: the exception to raise, status SA_OK), and nothing after it\n"
    "was tried.\n"
    "\n"
    "Why native: at 100k params the Python loop (detach, to_dlpack, the SWIG call) cost about\n"
    "twice the library's own registration.");

static PyObject* add_params(PyObject* self, PyObject* args) {
  (void)self;
  PyObject *handle, *params, *names;
  int group;
  if (!PyArg_ParseTuple(args, "OiO!O!:add_params", &handle, &group, &PyList_Type, &params,
                        &PyList_Type, &names))
    return NULL;
  const Py_ssize_t n = PyList_GET_SIZE(params);
  if (PyList_GET_SIZE(names) != n) {
    PyErr_SetString(PyExc_ValueError, "add_params: one name per param");
    return NULL;
  }
#ifdef SA_HAVE_EXCHANGE_API
  if (n > 0 && !exchange_api_of(Py_TYPE(PyList_GET_ITEM(params, 0)))) Py_RETURN_NONE;
  sa_optimizer* opt = optimizer_of(handle);
  if (!opt) return NULL;
  Py_ssize_t taken = 0;
  sa_status status = SA_OK;
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* param = PyList_GET_ITEM(params, i);
    const DLPackExchangeAPI* api = exchange_api_of(Py_TYPE(param));
    if (!api) {
      PyErr_Format(PyExc_TypeError, "add_params: param %zd is of another type than param 0", i);
      break;
    }
    const char* name = PyUnicode_AsUTF8(PyList_GET_ITEM(names, i));
    if (!name) break;
    DLManagedTensorVersioned* managed = NULL;
    if (api->managed_tensor_from_py_object_no_sync(param, &managed) != 0) {
      blame_param(names, i, "it cannot be handed over through DLPack");
      break;
    }
    int64_t index = -1;
    status = sa_optimizer_add_param(opt, name, (int32_t)group, managed, NULL, NULL, &index);
    if (status != SA_OK) {
      if (managed->deleter) managed->deleter(managed); /* refused: still ours */
      break;
    }
    ++taken; /* index is the one before it plus one: the library appends */
  }
  /* The exception, if any, handed back beside what was taken. */
  PyObject* error = PyErr_Occurred() ? take_exception() : NULL;
  if (!error) {
    error = Py_None;
    Py_INCREF(error);
  }
  return Py_BuildValue("(inN)", (int)status, taken, error);
#else
  (void)handle;
  (void)group;
  Py_RETURN_NONE;
#endif
}

static PyMethodDef methods[] = {
    {"bind_param_grads", bind_param_grads, METH_VARARGS, bind_param_grads_doc},
    {"add_params", add_params, METH_VARARGS, add_params_doc},
    {"unbind_grads", unbind_grads, METH_O, unbind_grads_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    "shardadam._grad_intake",
    "Native helpers of shardadam.torch.FusedAdam: all grads of a step bound in one checked C call, "
    "plain params registered in one.",
    -1,
    methods,
    NULL,
    NULL,
    NULL,
    NULL,
};

PyMODINIT_FUNC PyInit__grad_intake(void) {
  s_grad_attr.name = PyUnicode_InternFromString("grad");
  s_local_tensor_attr.name = PyUnicode_InternFromString("_local_tensor");
  s_to_local = PyUnicode_InternFromString("to_local");
  s_spec_attr.name = PyUnicode_InternFromString("_spec");
  s_placements = PyUnicode_InternFromString("placements");
  s_dim = PyUnicode_InternFromString("dim");
  if (!s_grad_attr.name || !s_local_tensor_attr.name || !s_to_local || !s_spec_attr.name ||
      !s_placements || !s_dim)
    return NULL;
#ifdef SA_HAVE_EXCHANGE_API
  s_exchange_api = PyUnicode_InternFromString("__dlpack_c_exchange_api__");
  if (!s_exchange_api) return NULL;
#endif
  return PyModule_Create(&module);
}
