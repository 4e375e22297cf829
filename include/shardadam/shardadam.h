/*
 * shardadam.h — the C ABI of shardadam.
 *
 * shardadam runs fused Adam/AdamW steps over the *local shards* of globally shaped
 * parameters (FSDP, ZeRO, tensor or expert parallelism). An engine hands it DLPack
 * tensors plus a layout (mesh + placements, or an explicit box); shardadam owns the
 * optimizer state and runs the update.
 *
 * Conventions that hold for every function below unless its comment says otherwise:
 *
 *  - Every function that can fail returns an sa_status. SA_OK is 0.
 *  - On failure nothing is changed: no param is half-added, no hyperparameter is
 *    half-set, no state is touched. The detail of the failure ("which function, which
 *    param, what was expected, what arrived") is kept on the handle and read with
 *    sa_optimizer_last_error(). Calls without a handle (sa_optimizer_create,
 *    sa_layout_local_box) keep it in a thread-local string read with sa_last_error().
 *  - Pointers passed in are borrowed for the duration of the call only, unless the
 *    function says it takes ownership or keeps the pointer.
 *  - Threads: distinct optimizers may be used concurrently from different threads. One
 *    optimizer must not be used by two threads at once (the caller serializes); the
 *    read-only queries (sa_optimizer_last_error, *_info, *_num_*) are no exception.
 *  - Option structs begin with `struct_size` and are only ever grown at the end. Always
 *    initialize them with their SA_*_INIT macro, then set the fields you need; a library
 *    newer than your header reads only the fields your struct_size covers and gives the
 *    rest their defaults.
 *
 * This header is C99 and C++ clean. It needs <dlpack/dlpack.h> of DLPack >= 1.0.
 */
#ifndef SHARDADAM_H_
#define SHARDADAM_H_

#include <stddef.h>
#include <stdint.h>

#include <dlpack/dlpack.h>

#if !defined(DLPACK_MAJOR_VERSION) || DLPACK_MAJOR_VERSION < 1
#error "shardadam needs <dlpack/dlpack.h> of DLPack >= 1.0 (DLManagedTensorVersioned)"
#endif

#if defined(_WIN32)
#define SA_API
#elif defined(SHARDADAM_BUILDING)
#define SA_API __attribute__((visibility("default")))
#else
#define SA_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------------------ */
/* Version and build                                                                     */
/* ------------------------------------------------------------------------------------ */

#define SA_VERSION_MAJOR 0
#define SA_VERSION_MINOR 2
#define SA_VERSION_PATCH 0
/** MAJOR * 10000 + MINOR * 100 + PATCH of the header you compile against. */
#define SA_VERSION_NUMBER (SA_VERSION_MAJOR * 10000 + SA_VERSION_MINOR * 100 + SA_VERSION_PATCH)

/** Version of the library actually loaded, as SA_VERSION_NUMBER. Compare it with
 *  SA_VERSION_NUMBER at start-up to catch a header/library mismatch. */
SA_API int sa_version(void);

/** A static, human-readable line naming the version and the backends compiled in, e.g.
 *  "shardadam 0.2.0; cpu: highway (AVX2 dispatched); cuda: not built". Never NULL. */
SA_API const char* sa_build_info(void);

/* ------------------------------------------------------------------------------------ */
/* Status and errors                                                                     */
/* ------------------------------------------------------------------------------------ */

typedef enum sa_status {
  SA_OK = 0,
  SA_ERR_INVALID_ARGUMENT = 1, /* a NULL, out-of-range or inconsistent argument        */
  SA_ERR_UNSUPPORTED = 2,      /* valid request this build/backend cannot serve       */
  SA_ERR_OUT_OF_MEMORY = 3,    /* an allocation failed; nothing was changed           */
  SA_ERR_DEVICE = 4,           /* the device backend reported an error                */
  SA_ERR_COMM = 5,             /* a communicator operation failed                     */
  SA_ERR_IO = 6,               /* reading or writing a blob failed                    */
  SA_ERR_FORMAT = 7,           /* a blob is not a valid shard file                    */
  SA_ERR_MISMATCH = 8,         /* data disagrees with what is registered (dtype, shape) */
  SA_ERR_STATE = 9,            /* the call is not allowed in the optimizer's current state */
  SA_ERR_INTERNAL = 10         /* a bug in shardadam; please report the message        */
} sa_status;

/** A static name for a status ("SA_ERR_MISMATCH"); "unknown sa_status" for others. */
SA_API const char* sa_status_string(sa_status status);

/** The message of a handle-less call's last failure on this thread (sa_optimizer_create,
 *  sa_layout_local_box, NULL handles). Valid until the next shardadam call on this thread. */
SA_API const char* sa_last_error(void);

/* ------------------------------------------------------------------------------------ */
/* Layouts                                                                               */
/* ------------------------------------------------------------------------------------ */

/** How one mesh dim places a tensor. */
typedef enum sa_placement_type {
  SA_PLACEMENT_REPLICATE = 0, /* every coordinate along this mesh dim holds the same data */
  SA_PLACEMENT_SHARD = 1,     /* tensor dim `dim` is split along this mesh dim            */
  SA_PLACEMENT_PARTIAL = 2    /* pending reduction: never valid for a parameter           */
} sa_placement_type;

typedef struct sa_placement {
  int32_t type; /* an sa_placement_type */
  int32_t dim;  /* tensor dim for SA_PLACEMENT_SHARD (negative counts from the end) */
} sa_placement;

/** The maximum tensor rank and mesh rank shardadam accepts. */
#define SA_MAX_NDIM 16

/**
 * Where a local shard sits in its global tensor. Two forms:
 *
 *  - Mesh form (global_offset == NULL): a device mesh of `mesh_ndim` dims with sizes
 *    `mesh_shape`, this rank's `mesh_coord`, and one placement per mesh dim. Shard(d)
 *    follows torch.chunk: along a mesh dim of size k, a tensor dim of size n is cut into
 *    chunks of ceil(n/k); trailing coordinates get smaller or empty chunks (an empty
 *    chunk's offset is n). Several mesh dims sharding one tensor dim nest left to right,
 *    as PyTorch DTensor does by default. mesh_ndim == 0 means "not sharded".
 *  - Box form (global_offset != NULL): the shard is the box
 *    [global_offset, global_offset + local_shape) of the global tensor, local_shape
 *    being the shape of the tensor handed over. For engines with their own uneven
 *    sharding. The mesh fields must then be left at 0/NULL.
 *
 * All arrays are borrowed for the call that receives the layout.
 */
typedef struct sa_layout {
  size_t struct_size;
  int32_t ndim;                   /* rank of the global tensor (= rank of the local shard) */
  const int64_t* global_shape;    /* [ndim] */
  int32_t mesh_ndim;              /* mesh form: number of mesh dims */
  const int64_t* mesh_shape;      /* mesh form: [mesh_ndim], each >= 1 */
  const int64_t* mesh_coord;      /* mesh form: [mesh_ndim], 0 <= coord < size */
  const sa_placement* placements; /* mesh form: [mesh_ndim] */
  const int64_t* global_offset;   /* box form: [ndim]; NULL selects the mesh form */
} sa_layout;

#define SA_LAYOUT_INIT \
  { sizeof(sa_layout), 0, NULL, 0, NULL, NULL, NULL, NULL }

/**
 * Resolves a mesh-form layout to this rank's box: writes `ndim` entries each to
 * local_shape and global_offset. Errors (thread-local, sa_last_error): NULL pointers,
 * a box-form layout, a coordinate outside the mesh, a Shard dim outside the tensor,
 * Partial placements, negative sizes.
 */
SA_API sa_status sa_layout_local_box(const sa_layout* layout, int64_t* local_shape,
                                     int64_t* global_offset);

/* ------------------------------------------------------------------------------------ */
/* Optimizer                                                                             */
/* ------------------------------------------------------------------------------------ */

typedef struct sa_optimizer sa_optimizer; /* opaque */

typedef struct sa_optimizer_config {
  size_t struct_size;
  int32_t num_threads; /* worker threads of the CPU backend, of a CPU step of state placed
                          SA_STATE_ON_HOST_CPU_STEP, and of state export (its checksums and
                          writes); 0 = one per hardware thread */
  int32_t cpu_simd;    /* CPU backend and CPU steps: 1 = SIMD when the CPU has FMA (default),
                          0 = scalar only */
} sa_optimizer_config;

#define SA_OPTIMIZER_CONFIG_INIT \
  { sizeof(sa_optimizer_config), 0, 1 }

/**
 * Creates an empty optimizer. `config` may be NULL (defaults). The backend (CPU or a
 * device) is chosen by the device of the first param added; all params of one optimizer
 * live on one device. On failure *out is set to NULL and sa_last_error() says why.
 */
SA_API sa_status sa_optimizer_create(const sa_optimizer_config* config, sa_optimizer** out);

/**
 * Destroys the optimizer: frees its state and calls the DLPack deleter of every param
 * shard it took ownership of. State views handed out (sa_optimizer_state_view) keep
 * their memory alive until their own deleter runs. NULL is a no-op. Must not run
 * concurrently with any other call on the same optimizer.
 */
SA_API void sa_optimizer_destroy(sa_optimizer* opt);

/** The message of the last failed call on `opt` ("" if none yet). The string belongs to
 *  the optimizer and is valid until the next call on it. NULL opt gives sa_last_error(). */
SA_API const char* sa_optimizer_last_error(const sa_optimizer* opt);

/* ---- groups ------------------------------------------------------------------------ */

/**
 * Hyperparameters of a param group. All may be changed between steps with
 * sa_optimizer_set_group, except `update_rule` and `amsgrad` once the group holds a param
 * (they chose its state: max_exp_avg_sq, momentum_buffer, allocated when it is added).
 * sa_struct_field says which rules read each field (sa_field_info.rules).
 *
 * SA_RULE_ADAMW, the update (PyTorch semantics; t = the group's step count after this step):
 *   g = grad * inv_grad_scale;  if maximize: g = -g
 *   if weight_decay and not decoupled: g += weight_decay * p                 (Adam, L2)
 *   if weight_decay and decoupled:     p *= 1 - lr * weight_decay            (AdamW)
 *   m = beta1 m + (1 - beta1) g;   v = beta2 v + (1 - beta2) g^2
 *   if amsgrad: vmax = max(vmax, v), and vmax replaces v below
 *   bc1 = 1 - beta1^t, bc2 = 1 - beta2^t   (both 1 when bias_correction == 0)
 *   p -= (lr / bc1) * m / (sqrt(v) / sqrt(bc2) + eps)
 *
 * SA_RULE_MUON, torch.optim.Muon's update of each whole 2-D matrix (rows x cols, its
 * global shape), computed in float32: float32 params, or bfloat16 params with a float32
 * master (SA_MASTER_AUTO or SA_MASTER_FP32: the update goes to the master, the param is its
 * rounding); float32 or bfloat16 grads; a float32 or bfloat16 "momentum_buffer"
 * (moment_dtype; bfloat16 keeps buf rounded, and u is computed from the kept value). Weight
 * decay is always decoupled, and maximize and amsgrad must be 0. A matrix whose layout splits it
 * across ranks needs a communicator (sa_optimizer_set_comm) over every rank that holds a part of
 * it: at every step (a collective, skipped step or not) the ranks send their boxes of u (one
 * replica of each) to the matrix's owner rank, which orthogonalizes the whole u and sends each rank
 * its box of the result, so every rank ends as one rank holding the whole matrix would (bit for
 * bit, with the same BLAS). Owners are balanced by Newton-Schulz's flops over the ranks
 * that hold a part of each matrix. Each rank holds, in floats (backend memory), its boxes
 * and the matrices it owns (with staging for boxes that are not whole rows): about
 * 8 / nranks bytes an element of all split matrices, and sends and receives about as
 * many. A host communicator that does not say its rank (sa_host_comm.nranks 0) makes every
 * rank the owner of every matrix, summed whole through all_reduce: 4 bytes an element of
 * all split matrices on every rank, and 8 more of host memory for the doubles reduced:
 *   g = grad * inv_grad_scale (times the clip factor when clipping)
 *   buf = buf + (1 - momentum) (g - buf)                     (state "momentum_buffer")
 *   u = nesterov ? g + momentum (buf - g) : buf
 *   X = u (or u^T when rows > cols);  X /= max(||X||_F, eps)
 *   ns_steps times: A = X X^T;  X = ns_a X + (ns_b A + ns_c A A) X
 *   p *= 1 - lr * weight_decay;  p -= adjusted_lr * X (transposed back)
 *   adjusted_lr = lr * sqrt(max(1, rows / cols))        (SA_MUON_LR_ORIGINAL)
 *               = lr * 0.2 * sqrt(max(rows, cols))      (SA_MUON_LR_MATCH_RMS_ADAMW)
 */

/** A group's update rule (sa_group_config.update_rule). */
typedef enum sa_update_rule {
  SA_RULE_ADAMW = 0, /* Adam / AdamW (decoupled_weight_decay chooses) */
  SA_RULE_MUON = 1   /* Muon: momentum, then Newton-Schulz orthogonalization of each matrix */
} sa_update_rule;

/** How a Muon group scales lr by a matrix's shape (sa_group_config.adjust_lr). */
typedef enum sa_muon_lr_adjust {
  SA_MUON_LR_ORIGINAL = 0,       /* lr * sqrt(max(1, rows / cols)) */
  SA_MUON_LR_MATCH_RMS_ADAMW = 1 /* lr * 0.2 * sqrt(max(rows, cols)) */
} sa_muon_lr_adjust;

typedef struct sa_group_config {
  size_t struct_size;
  double lr;                      /* >= 0 */
  double beta1;                   /* in [0, 1) */
  double beta2;                   /* in [0, 1) */
  double eps;                     /* >= 0 */
  double weight_decay;            /* >= 0 */
  int32_t decoupled_weight_decay; /* 1: AdamW (decay the param), 0: Adam (L2 on the grad) */
  int32_t bias_correction;        /* 1: divide by 1 - beta^t (default), 0: do not */
  int32_t maximize;               /* 1: ascend instead of descend */
  int32_t amsgrad;                /* 1: keep max_exp_avg_sq and use it in the denominator */
  int32_t update_rule;            /* an sa_update_rule (SA_RULE_ADAMW by default) */
  int32_t nesterov;               /* Muon: 1: Nesterov momentum */
  double momentum;                /* Muon: in [0, 1) */
  double ns_a;                    /* Muon: Newton-Schulz's coefficients (finite) */
  double ns_b;
  double ns_c;
  int32_t ns_steps;  /* Muon: Newton-Schulz iterations, in [0, 100) */
  int32_t adjust_lr; /* Muon: an sa_muon_lr_adjust */
} sa_group_config;

/** torch.optim.AdamW defaults, and torch.optim.Muon's for Muon's own fields
 *  (sa_group_config_default gives the same values). A Muon group built from these keeps
 *  AdamW's eps (1e-8) and weight_decay (1e-2): torch.optim.Muon's are 1e-7 and 0.1. */
#define SA_GROUP_CONFIG_INIT                                                                   \
  {                                                                                            \
    sizeof(sa_group_config), 1e-3, 0.9, 0.999, 1e-8, 1e-2, 1, 1, 0, 0, SA_RULE_ADAMW, 1, 0.95, \
        3.4445, -4.775, 2.0315, 5, SA_MUON_LR_ORIGINAL                                         \
  }

/** Fills *out with the defaults of SA_GROUP_CONFIG_INIT, for bindings that do not compile
 *  C macros (out->struct_size must be set: fields past it are not written). */
SA_API sa_status sa_group_config_default(sa_group_config* out);

/** How a field of an option struct (sa_struct_kind) is stored. */
typedef enum sa_field_type {
  SA_FIELD_DOUBLE = 0,  /* a double */
  SA_FIELD_FLAG = 1,    /* an int32_t, 0 or 1 */
  SA_FIELD_INT32 = 2,   /* an int32_t (an enum: its valid values are [min, max]) */
  SA_FIELD_POINTER = 3, /* a pointer; doc says to what, and in which memory */
  SA_FIELD_UINT64 = 4,  /* a uint64_t */
  /* a DLDataType: all zero (unset) for the default, else a dtype of the library's table
   * (sa_dtype) whose roles include the field's dtype_role */
  SA_FIELD_DTYPE = 5
} sa_field_type;

/**
 * One field of an option struct (sa_struct_kind) as the library defines it: what bindings
 * read to fill the struct by name and to build their own types (names, defaults, valid
 * values, docs) instead of retyping them. Valid values v of a number: min <= v, and
 * v < max, or v <= max when max_inclusive is 1 (a max of INFINITY, exclusive, means
 * "finite"); a pointer has none; a dtype: see SA_FIELD_DTYPE. The library checks every
 * struct a call passes against these (the message says "<name> is <value>; it must be
 * <rule>"). The strings are static.
 */
typedef struct sa_field_info {
  size_t struct_size;
  const char* name;     /* the member's name, also its key in shard files ("lr") */
  int32_t type;         /* an sa_field_type */
  size_t offset;        /* offsetof(<the struct>, <name>) */
  double default_value; /* its value in the struct's SA_*_INIT */
  double min;
  double max;
  int32_t max_inclusive;
  int32_t fixed_with_params; /* 1: cannot change once the group holds a param (SA_ERR_STATE) */
  const char* rule;          /* the valid values in the words of the error messages: "in [0, 1)" */
  const char* doc;           /* what the field does */
  int32_t dtype_role;        /* SA_FIELD_DTYPE: the sa_dtype_role its dtypes have; else 0 */
  /* SA_STRUCT_GROUP_CONFIG: the update rules that read the field, a bit (1 << rule) per
   * sa_update_rule; 0 for the other structs */
  int32_t rules;
} sa_field_info;

#define SA_FIELD_INFO_INIT \
  { sizeof(sa_field_info), NULL, 0, 0, 0.0, 0.0, 0.0, 0, 0, NULL, NULL, 0, 0 }

/** The option structs the C ABI takes, whose fields the library describes
 *  (sa_struct_field). */
typedef enum sa_struct_kind {
  SA_STRUCT_GROUP_CONFIG = 0,     /* sa_group_config */
  SA_STRUCT_STEP_ARGS = 1,        /* sa_step_args */
  SA_STRUCT_OPTIMIZER_CONFIG = 2, /* sa_optimizer_config */
  SA_STRUCT_PARAM_OPTIONS = 3,    /* sa_param_options */
  SA_STRUCT_IMPORT_OPTIONS = 4    /* sa_import_options */
} sa_struct_kind;

/** The number of fields (struct_size aside) this library knows of the struct `kind`
 *  (an sa_struct_kind); 0 for a kind it does not know. */
SA_API int32_t sa_struct_num_fields(int32_t kind);

/** Describes field `index` (0 .. sa_struct_num_fields(kind) - 1, in struct order) of the
 *  struct `kind` into *out (out->struct_size must be set: use SA_FIELD_INFO_INIT). */
SA_API sa_status sa_struct_field(int32_t kind, int32_t index, sa_field_info* out);

/** Fills the struct `kind` at *out with the defaults of its SA_*_INIT macro, for bindings
 *  that do not compile C macros: out's first field is its struct_size, which must be set
 *  (fields past it are not written). */
SA_API sa_status sa_struct_default(int32_t kind, void* out);

/** The number of fields of sa_group_config (struct_size aside) this library knows. */
SA_API int32_t sa_group_config_num_fields(void);

/** Describes field `index` (0 .. sa_group_config_num_fields() - 1, in struct order) into
 *  *out (out->struct_size must be set: use SA_FIELD_INFO_INIT): sa_struct_field of
 *  SA_STRUCT_GROUP_CONFIG. */
SA_API sa_status sa_group_config_field(int32_t index, sa_field_info* out);

/** Appends a group; *group receives its index (0, 1, ...). Groups are positional: create
 *  the same groups in the same order on every rank, even where a group is locally empty. */
SA_API sa_status sa_optimizer_add_group(sa_optimizer* opt, const sa_group_config* config,
                                        int32_t* group);

/** Number of groups. */
SA_API int32_t sa_optimizer_num_groups(const sa_optimizer* opt);

/** Copies a group's hyperparameters into *out (out->struct_size must be set: use
 *  SA_GROUP_CONFIG_INIT). */
SA_API sa_status sa_optimizer_get_group(const sa_optimizer* opt, int32_t group,
                                        sa_group_config* out);

/** Replaces a group's hyperparameters (all validated first; nothing changes on error). */
SA_API sa_status sa_optimizer_set_group(sa_optimizer* opt, int32_t group,
                                        const sa_group_config* config);

/**
 * Group hyperparameters by name, for bindings, which then need no copy of
 * sa_group_config's layout or defaults: names[i] is a field's name (as
 * sa_group_config_field lists them: "lr", "beta1", ..., "amsgrad"), values[i] its value
 * (a flag as 0 or 1).
 *
 * add: appends a group with the defaults (SA_GROUP_CONFIG_INIT) but for the n named
 *   fields, checked as sa_optimizer_add_group checks a config; *group (if not NULL)
 *   receives its index.
 * set: replaces the n named fields of `group` and keeps the others, as
 *   sa_optimizer_set_group does.
 * get: reads the n named fields of `group` into values[0..n).
 * An unknown name, a name given twice, or a flag other than 0 or 1 is
 * SA_ERR_INVALID_ARGUMENT (the message lists the known names). Nothing changes on error.
 * n may be 0 (names and values may then be NULL).
 */
SA_API sa_status sa_optimizer_add_group_fields(sa_optimizer* opt, int32_t n,
                                               const char* const* names, const double* values,
                                               int32_t* group);
SA_API sa_status sa_optimizer_set_group_fields(sa_optimizer* opt, int32_t group, int32_t n,
                                               const char* const* names, const double* values);
SA_API sa_status sa_optimizer_get_group_fields(const sa_optimizer* opt, int32_t group, int32_t n,
                                               const char* const* names, double* values);

/** Sets only the learning rate of a group (what an LR scheduler needs each step). */
SA_API sa_status sa_optimizer_set_lr(sa_optimizer* opt, int32_t group, double lr);

/** The group's step count: the number of steps the optimizer took and did not skip
 *  (found_inf, a non-finite norm), whether or not the group's params had grads. Bias
 *  correction uses each param's own count (sa_optimizer_get_param_steps). On CUDA the
 *  counts live on the device only (the steps advance them there); reading one
 *  synchronizes the device. */
SA_API sa_status sa_optimizer_get_step(const sa_optimizer* opt, int32_t group, int64_t* step);

/** Sets the group's step count and the step count of every param in it (e.g. when
 *  resuming from another optimizer's state). On CUDA it writes the device's counts at
 *  once, synchronizing the device, so the next step (a graph replay too) counts from
 *  `step` without a flush. */
SA_API sa_status sa_optimizer_set_step(sa_optimizer* opt, int32_t group, int64_t step);

/* ---- params ------------------------------------------------------------------------ */

/** What a dtype may be (bits of sa_dtype_info.roles). */
typedef enum sa_dtype_role {
  SA_DTYPE_PARAM = 1,  /* a param's dtype (sa_optimizer_add_param) */
  SA_DTYPE_GRAD = 2,   /* sa_param_options.grad_dtype */
  SA_DTYPE_MOMENT = 4, /* sa_param_options.moment_dtype */
  SA_DTYPE_STATE = 8,  /* some state is stored in it (state views, sa_optimizer_state_info) */
  SA_DTYPE_FILE = 16,  /* shard files hold tensors of it (safetensors_name is not NULL) */
  /* as a moment, stored in blocks: a code per element and a float32 absmax per block of
   * 256 elements (the states "<moment>_absmax"); shard files and state dicts hold the
   * values as float32 (uint8, float8_e4m3fn) */
  SA_DTYPE_BLOCK_MOMENT = 32,
  /* the dtype of an fp8 param's scale tensor under some sa_param_scaling
   * (sa_param_options.scale): float32, float8_e8m0fnu */
  SA_DTYPE_SCALE = 64,
  /* a param's dtype that is cast from a float32 master under a scaling
   * (sa_param_options.scaling): the fp8 param dtypes float8_e4m3fn, float8_e5m2 */
  SA_DTYPE_SCALED_PARAM = 128
} sa_dtype_role;

/**
 * One dtype the library stores, as it defines it: what bindings read to map their own
 * dtypes (numpy's, torch's, a language's enum) by name instead of retyping DLPack codes.
 * The strings are static.
 */
typedef struct sa_dtype_info {
  size_t struct_size;
  const char* name;             /* as messages spell it, and as bindings name it: "bfloat16" */
  DLDataType dtype;             /* its DLPack dtype */
  int32_t roles;                /* sa_dtype_role bits */
  const char* safetensors_name; /* "BF16"; NULL when shard files never hold it */
  const char* doc;              /* what it is */
} sa_dtype_info;

#define SA_DTYPE_INFO_INIT \
  { sizeof(sa_dtype_info), NULL, {0, 0, 0}, 0, NULL, NULL }

/** The number of dtypes this library stores (params, grads, moments and other state). */
SA_API int32_t sa_num_dtypes(void);

/** Describes dtype `index` (0 .. sa_num_dtypes() - 1) into *out (out->struct_size must be
 *  set: use SA_DTYPE_INFO_INIT). */
SA_API sa_status sa_dtype(int32_t index, sa_dtype_info* out);

/** How a param keeps its full-precision value. */
typedef enum sa_master_kind {
  SA_MASTER_AUTO = 0,     /* NONE for float32 params, FP32 for bfloat16/float16 params */
  SA_MASTER_NONE = 1,     /* update the param in its own dtype (float32 params only)   */
  SA_MASTER_FP32 = 2,     /* keep a float32 master copy; the param is its rounding     */
  SA_MASTER_REMAINDER = 3 /* bfloat16 params only: keep the int16 low half of the fp32
                             value; param bits << 16 + remainder restores it exactly     */
} sa_master_kind;

/**
 * Where a param's optimizer state (master, remainder, moments, block scales) lives
 * (sa_param_options.state_placement). Placement is not saved in shard files: a file written
 * from state in one placement loads into any other.
 */
typedef enum sa_state_placement {
  SA_STATE_ON_DEVICE = 0, /* in the param's device memory (the default) */
  /* In host memory the optimizer owns. A CUDA param's state is pinned; each step streams
   * it through a ring of device buffers (3 x 32 MiB per optimizer, whatever the model): a
   * segment goes up, the same kernels update it, it comes down, while the next goes up and
   * the one before comes down. So it takes no device memory of its own, a step moves each
   * state byte once each way over the host link, and the results are bit for bit those of
   * state on the device. The param and grad stay on the device; an fp8 param's kernels
   * read and write its host state in place (mapped), slower. A CPU param's state is host
   * memory already: the same as SA_STATE_ON_DEVICE. State views of such a state are kDLCPU
   * tensors. */
  SA_STATE_ON_HOST = 1,
  /* In host memory the optimizer owns, stepped by the CPU (ZeRO-Offload's scheme): each
   * step the param and grad of a segment come down into a ring of pinned host buffers
   * (3 x 32 MiB), the host's threads (sa_optimizer_config.num_threads) update master and
   * moments there with the CPU backend's kernels, and the param goes back up, while the next
   * segment comes down and the one before goes up. The step's decision and coefficients
   * (clipping, found_inf, bias correction) are the device's, so the results are bit for bit
   * those of the other placements. No state byte crosses the link: for large params this
   * moves fewer bytes than SA_STATE_ON_HOST, and costs the host's memory bandwidth instead.
   * The step stays ordered on the caller's stream (the host's part runs as a stream
   * callback), so it cannot be captured in a CUDA graph. An fp8 param (scaling != NONE):
   * the host updates its master and moments, only its grad comes down, and the device
   * casts the param from the new master, reading it over the link (mapped), as it writes
   * the scales and amaxes on the device. A CPU param: the same as SA_STATE_ON_DEVICE. */
  SA_STATE_ON_HOST_CPU_STEP = 2
} sa_state_placement;

/**
 * How an fp8 param (float8_e4m3fn, float8_e5m2) is cast from its float32 master after each
 * update (sa_param_options.scaling). Every fp8 param names one; other params take NONE.
 * The casts round to nearest even and saturate (a magnitude beyond the dtype's largest,
 * infinities included, becomes the largest: never an infinity or a NaN from an overflow;
 * a NaN master gives a NaN code). Blocks run along the last dim, so the layout must give
 * every rank whole blocks: the global last dim a multiple of the block, and a Shard of the
 * last dim cutting it only at multiples of the block (Shard(0) of a row-major weight never
 * cuts one); add_param refuses other layouts, naming the dim.
 *
 * sa_num_param_scalings / sa_param_scaling_describe describe these values (the library's table:
 * bindings read names, blocks and scale dtypes from it).
 */
typedef enum sa_param_scaling {
  /* not scaled: float32, bfloat16 and float16 params */
  SA_SCALING_NONE = 0,
  /* per-tensor delayed scaling (Transformer Engine's DelayedScaling): the cast uses the
   * engine's scale, param = fp8(master * scale). `scale`: a float32 tensor of one element
   * that every step reads (the engine updates it from its amax history; > 0 and finite
   * when the param is added: the master starts as fp8 value / scale). `amax` (optional):
   * a float32 tensor of one element that every step that updates the param overwrites
   * with max |master| of this rank's shard (NaN if a master value is NaN). Under sharding
   * that is the shard's amax: reduce it over the ranks holding the tensor, as engines
   * reduce their amax histories. */
  SA_SCALING_DELAYED = 1,
  /* OCP MXFP8: a block of 32 elements shares a power-of-two scale X = 2^(floor(log2 amax)
   * - emax) (emax 8 for e4m3, 15 for e5m2; clamped to [2^-127, 2^127]; a block of zeros
   * gets 2^-127), param = fp8(master / X). `scale`: a float8_e8m0fnu tensor of the local
   * shape with the last dim divided by 32, which the step writes (X's code, 127 + log2 X).
   * The master starts as fp8 value * X. `amax` must be NULL. */
  SA_SCALING_MXFP8 = 2,
  /* 1x128 blocks with float32 scales (DeepSeek-V3's weights): scale = fp8_max / amax
   * (448 for e4m3, 57344 for e5m2; 1 for a block of zeros, FLT_MAX where the quotient
   * overflows), param = fp8(master * scale). `scale`: a float32 tensor of the local shape
   * with the last dim divided by 128, which the step writes with scale_inv = 1 / scale
   * (what the forward pass multiplies by). The master starts as fp8 value * scale_inv.
   * `amax` must be NULL. */
  SA_SCALING_BLOCK128 = 3,
  /* per-tensor current scaling (Transformer Engine's Float8CurrentScaling): each step
   * updates the masters, takes amax = max |master| over the whole global tensor, then casts
   * with scale = fp8_max / amax (1 when amax is 0, FLT_MAX where the quotient overflows;
   * NaN if a master value is NaN), param = fp8(master * scale). A sharded param (a
   * layout that splits it across ranks) takes the max over the ranks through the
   * optimizer's communicator, so every rank casts with the same scale: set the
   * communicator (sa_optimizer_set_comm) before adding one, and register the same
   * current-scaled sharded params on every rank in the same order, empty shards included
   * (the first step checks this across the ranks, and fails with SA_ERR_MISMATCH if they
   * differ). Such a step, sa_optimizer_recast_params and sa_optimizer_import of such
   * params are collective. An unsharded param (no layout, or replicated) uses its own
   * amax. `scale`: a float32 tensor of two elements that the step writes: [0] the scale,
   * [1] scale_inv = 1 / scale (what the forward pass multiplies by); when the param is
   * added it holds the scale_inv of the codes given ([1] > 0 and finite: the master
   * starts as fp8 value * scale_inv). `amax` (optional): a float32 tensor of one element
   * that receives the global amax. With an NCCL communicator the step stays on the stream
   * (capturable); a host communicator synchronizes it once per step.
   * sa_param_options.margin (optional) divides the scale by 2^margin, leaving that many
   * binades of headroom above the amax. */
  SA_SCALING_CURRENT = 4,
  /* as SA_SCALING_CURRENT, with the scale rounded down to a power of two: scale_inv is
   * exact and master * scale never exceeds fp8_max (no value saturates). */
  SA_SCALING_CURRENT_POW2 = 5
} sa_param_scaling;

/** One sa_param_scaling as the library defines it. The strings are static. */
typedef struct sa_param_scaling_info {
  size_t struct_size;
  int32_t value;             /* its sa_param_scaling value */
  const char* name;          /* "none", "delayed", "mxfp8", "block128", "current", ... */
  int64_t block;             /* elements per block along the last dim; 0: per tensor */
  DLDataType scale_dtype;    /* the dtype of `scale` (none: float32, unused) */
  int32_t step_writes_scale; /* 1: the step writes `scale`; 0: it reads it (or has none) */
  const char* doc;
} sa_param_scaling_info;

#define SA_PARAM_SCALING_INFO_INIT \
  { sizeof(sa_param_scaling_info), 0, NULL, 0, {0, 0, 0}, 0, NULL }

/** The number of sa_param_scaling values. */
SA_API int32_t sa_num_param_scalings(void);

/** Describes scaling `index` (0 .. sa_num_param_scalings() - 1) into *out (out->struct_size
 *  must be set: use SA_PARAM_SCALING_INFO_INIT). */
SA_API sa_status sa_param_scaling_describe(int32_t index, sa_param_scaling_info* out);

/**
 * Per-param storage choices, fixed when the param is added. A zeroed dtype (bits == 0)
 * means the default. sa_dtype lists the dtypes each field takes (roles SA_DTYPE_GRAD,
 * SA_DTYPE_MOMENT; a param's own dtype: SA_DTYPE_PARAM).
 */
typedef struct sa_param_options {
  size_t struct_size;
  /* float32, bfloat16 or float16; default: the param's dtype (float32 for fp8 params) */
  DLDataType grad_dtype;
  /* float32 (default), bfloat16, uint8 or float8_e4m3fn: exp_avg, exp_avg_sq,
   * max_exp_avg_sq. uint8 and float8_e4m3fn are block storages (SA_DTYPE_BLOCK_MOMENT):
   * each block of 256 elements of the local shard (the last one may be shorter) keeps a
   * float32 absmax in the states "exp_avg_absmax", "exp_avg_sq_absmax" (and
   * "max_exp_avg_sq_absmax"), one per block, and each element a byte:
   * - uint8: 8-bit blockwise dynamic quantization, the scheme and code books of
   *   bitsandbytes' 8-bit optimizers: the nearest entry of a 256-value map (signed for
   *   exp_avg, unsigned for the others) of x / absmax;
   * - float8_e4m3fn: torchao's AdamWFp8 scheme: x / scale as float8 e4m3fn (round to
   *   nearest even), scale = max(absmax, 1e-12) / 448.
   * The update decodes a block, updates it in float32, and encodes it again with its new
   * absmax; the CPU and CUDA backends compute the same bits. Shard files hold block
   * moments as their codes and absmax (docs/shard-files.md); an import takes each
   * block a saved block holds whole (the same elements: the block grids agree) as saved,
   * bit for bit, and quantizes the others by the local shard's blocks from the values the
   * codes stand for, so they reshard to any layout and cross with float32/bfloat16
   * moments. */
  DLDataType moment_dtype;
  int32_t master; /* an sa_master_kind (fp8 params: AUTO or FP32) */
  /* (The fields below begin at the next 8-byte boundary, past the tail padding of the
   * struct before them: a caller of that older header passes a struct_size that covers
   * its padding, whose bytes are undefined.) */
  /* The scale tensor of an fp8 param, as `scaling` describes it: on the param's device,
   * C-contiguous, aligned to its element size, writable where the step writes it. NULL
   * unless scaling is not NONE. On SA_OK the optimizer owns it, as it owns the param (its
   * deleter is called when the optimizer is destroyed); on failure the caller keeps it. */
  DLManagedTensorVersioned* scale;
  /* SA_SCALING_DELAYED and SA_SCALING_CURRENT(_POW2) only, optional: the float32 scalar
   * each step writes the amax into (delayed: the shard's; current: the global tensor's);
   * owned like `scale`. NULL otherwise. */
  DLManagedTensorVersioned* amax;
  /* fp8 params: an sa_param_scaling other than NONE (required); others: NONE */
  int32_t scaling;
  /* SA_SCALING_CURRENT(_POW2) only: the scale is (fp8_max / amax) / 2^margin (Transformer
   * Engine's margin), so values up to 2^margin * amax still fit before they saturate;
   * 0 (the default) to 6, the largest margin that keeps the scale of every finite amax a
   * normal float (exact division, finite scale_inv). Every rank holding a sharded param
   * must give it the same margin (the first step checks). Other scalings: 0 (a delayed
   * scaling casts with the engine's scale, to which the engine applies its margin). */
  int32_t margin;
  /* an sa_state_placement: where the param's state lives (default SA_STATE_ON_DEVICE).
   * SA_STATE_ON_HOST pins host memory for it: when the host cannot, add_param fails with
   * SA_ERR_OUT_OF_MEMORY naming the bytes, and nothing is added. */
  int32_t state_placement;
} sa_param_options;

#define SA_PARAM_OPTIONS_INIT                                                                    \
  {                                                                                              \
    sizeof(sa_param_options), {0, 0, 0}, {0, 0, 0}, SA_MASTER_AUTO, NULL, NULL, SA_SCALING_NONE, \
        0, SA_STATE_ON_DEVICE                                                                    \
  }

/**
 * Registers a local shard as a param of `group` under a unique `name` (the fully
 * qualified name checkpoints match on, e.g. "layers.3.mlp.w1").
 *
 * local_shard: a C-contiguous tensor of float32, bfloat16 or float16 on the CPU (kDLCPU)
 *   or, in builds with CUDA, on a CUDA device (kDLCUDA), or of float8_e4m3fn or
 *   float8_e5m2 with a scaling (options->scaling; the CPU and CUDA backends cast to the
 *   same codes and scales); not read-only, its data aligned
 *   to its element size. All params of one optimizer are on one device. Its shape must equal
 *   the local shape the layout gives (mesh form), or defines it (box form).
 * layout: where the shard sits in the global tensor; NULL means "not sharded" (global
 *   shape = local shape).
 * options: NULL for the defaults.
 * *param receives the param's index (0, 1, ... in order of addition).
 *
 * Ownership: on SA_OK the optimizer owns `local_shard` and calls its deleter when it is
 * destroyed; it updates the shard's data in place at every step. On failure the caller
 * keeps ownership (the deleter is not called). State (moments, master) is allocated
 * here, zeroed; master weights start as the param's value. On CUDA this call
 * synchronizes the device (it is setup, not a per-step call).
 */
SA_API sa_status sa_optimizer_add_param(sa_optimizer* opt, const char* name, int32_t group,
                                        DLManagedTensorVersioned* local_shard,
                                        const sa_layout* layout, const sa_param_options* options,
                                        int64_t* param);

/** As sa_optimizer_add_param, for producers of the pre-1.0 DLManagedTensor. */
SA_API sa_status sa_optimizer_add_param_legacy(sa_optimizer* opt, const char* name, int32_t group,
                                               DLManagedTensor* local_shard,
                                               const sa_layout* layout,
                                               const sa_param_options* options, int64_t* param);

/** Number of params. */
SA_API int64_t sa_optimizer_num_params(const sa_optimizer* opt);

/** Finds a param by name; SA_ERR_INVALID_ARGUMENT if there is none. */
SA_API sa_status sa_optimizer_find_param(const sa_optimizer* opt, const char* name, int64_t* param);

/** What shardadam knows about a param. Pointers belong to the optimizer and stay valid
 *  until it is destroyed. */
typedef struct sa_param_info {
  size_t struct_size;
  const char* name;
  int32_t group;
  int32_t ndim;
  const int64_t* local_shape;   /* [ndim] */
  const int64_t* global_shape;  /* [ndim] */
  const int64_t* global_offset; /* [ndim] */
  int64_t numel;                /* local elements */
  DLDataType param_dtype;
  DLDataType grad_dtype;
  DLDataType moment_dtype;
  int32_t master; /* resolved sa_master_kind (never AUTO) */
  DLDevice device;
  int32_t scaling;         /* its sa_param_scaling */
  int32_t margin;          /* its sa_param_options.margin */
  int32_t state_placement; /* its sa_state_placement (CPU params: SA_STATE_ON_DEVICE) */
} sa_param_info;

#define SA_PARAM_INFO_INIT                                                                      \
  {                                                                                             \
    sizeof(sa_param_info), NULL, 0, 0, NULL, NULL, NULL, 0, {0, 0, 0}, {0, 0, 0}, {0, 0, 0}, 0, \
        {kDLCPU, 0}, SA_SCALING_NONE, 0, SA_STATE_ON_DEVICE                                     \
  }

/** Fills *out (out->struct_size must be set: use SA_PARAM_INFO_INIT). */
SA_API sa_status sa_optimizer_param_info(const sa_optimizer* opt, int64_t param,
                                         sa_param_info* out);

/**
 * Per-param step counts, as torch keeps them (state[p]["step"]): the number of steps in
 * which the param had a grad and the step was not skipped. Bias correction of a param
 * uses its own count, so params that missed steps (no grad: unused embeddings, experts
 * without tokens, layers frozen for a while) are corrected as torch corrects them.
 *
 * get: copies the counts of params [first, first + n) into steps[0..n). On CUDA this
 *   synchronizes the device, where the counts live.
 * set: replaces them (all checked first: the range, every count >= 0; nothing changes
 *   on error). Group step counts are left as they are. On CUDA it writes the device's
 *   counts at once, synchronizing the device.
 */
SA_API sa_status sa_optimizer_get_param_steps(const sa_optimizer* opt, int64_t first, int64_t n,
                                              int64_t* steps);
SA_API sa_status sa_optimizer_set_param_steps(sa_optimizer* opt, int64_t first, int64_t n,
                                              const int64_t* steps);

/* ---- grads ------------------------------------------------------------------------- */

/*
 * A param either has a grad at the next steps (bound with one of the calls below) or has
 * none: then steps skip it, as torch skips a param whose .grad is None: its values, its
 * state and its step count stay as they are. A param that has never been given a grad
 * or a "no grad" since it was added makes the step fail (SA_ERR_STATE): forgetting to
 * bind is an error, not a skip. Bindings stay until replaced, so an engine whose grads
 * live in stable buffers binds once.
 */

/**
 * Binds the grad of one param, checked: dtype = the registered grad dtype, shape = the
 * local shape, same device, C-contiguous (no expanded, overlapping or permuted strides),
 * aligned. Only the data pointer is kept: the memory must stay valid and hold the new
 * grads at every later step. SA_ERR_MISMATCH (dtype, shape, device) or
 * SA_ERR_INVALID_ARGUMENT (strides, alignment, NULL data), naming the param; on error the
 * previous binding stays.
 */
SA_API sa_status sa_optimizer_set_grad(sa_optimizer* opt, int64_t param, const DLTensor* grad);

/**
 * Binds the grads of all params in one call, each checked as sa_optimizer_set_grad
 * checks it: `grads[i]` for param i, n == sa_optimizer_num_params(); a NULL entry means
 * "param i has no grad" (skipped by steps). All-or-nothing: on error no binding changes
 * and the message names the first param that failed. This is the call for bindings and
 * engines that hand over fresh grad tensors every step; it costs a few compares per param.
 */
SA_API sa_status sa_optimizer_set_grads(sa_optimizer* opt, int64_t n, const DLTensor* const* grads);

/** Marks one param as having no grad: later steps skip it until a grad is bound again. */
SA_API sa_status sa_optimizer_clear_grad(sa_optimizer* opt, int64_t param);

/** The value of a sa_optimizer_set_grad_ptrs entry that means "this param has no grad".
 *  It is never a valid grad address (not aligned to any grad dtype). */
#define SA_NO_GRAD ((const void*)(uintptr_t)1)

/**
 * Fast path for C engines: binds the grads of all params from raw data pointers,
 * `ptrs[i]` for param i, n == sa_optimizer_num_params(). This call trusts its caller:
 * shardadam cannot see the dtype, shape, strides or extent of raw memory, and a pointer
 * to anything other than a C-contiguous tensor of the param's grad dtype and local shape
 * makes the step read outside it or apply wrong updates; bindings never use it for
 * tensors they did not check (use sa_optimizer_set_grads). It checks only that each
 * pointer is non-NULL for a non-empty param (NULL is allowed for an empty one) and
 * aligned to the grad's element size; SA_NO_GRAD marks a param as having no grad.
 * All-or-nothing: on error no binding changes.
 */
SA_API sa_status sa_optimizer_set_grad_ptrs(sa_optimizer* opt, int64_t n, const void* const* ptrs);

/* ---- step -------------------------------------------------------------------------- */

typedef struct sa_step_args {
  size_t struct_size;
  /* Optional: points to one float, in the optimizer's device memory (host memory for the
   * CPU backend), that every grad is multiplied by before use: the inverse loss scale of
   * mixed-precision training. NULL means 1. */
  const float* inv_grad_scale;
  /* Optional: points to one float in the optimizer's device memory; if it is nonzero the
   * whole step is skipped: no param or state changes, no step count advances. */
  const float* found_inf;
  /* Optional, host memory: receives 1 if the step was skipped (found_inf on any rank, or
   * a non-finite gradient norm), else 0. For device backends asking for it synchronizes
   * the stream. */
  int32_t* skipped;
  /* ---- global gradient norm and clipping -------------------------------------------------
   * 0 (the default) computes no norm. A value > 0 makes the step compute the norm of all
   * grads of all ranks (of the unscaled grads: after inv_grad_scale), counting a shard
   * replicated along a mesh dim once, and multiply every grad by
   *     min(1, max_grad_norm / (norm + 1e-6))
   * inside the update, as torch.nn.utils.clip_grad_norm_ does; the grads themselves are not
   * written. INFINITY computes and reports the norm without clipping. A non-finite norm
   * skips the step on every rank (no param, state or step count changes); a NaN grad makes
   * the L2 norm NaN and the inf norm +inf (torch's would be NaN). With a
   * communicator set (sa_optimizer_set_comm) the norm is global; without one it is this
   * rank's. Every rank must pass the same max_grad_norm and norm_type. */
  double max_grad_norm;
  /* SA_NORM_L2 (default) or SA_NORM_INF. */
  int32_t norm_type;
  /* Optional: points to one float in the optimizer's device memory (host memory for the
   * CPU backend) that receives the global norm; enqueued on the stream, no host wait. */
  float* grad_norm;
  /* Optional, host memory: receives the global norm. Asking for it synchronizes the
   * stream on device backends. */
  double* host_grad_norm;
} sa_step_args;

/** The norm of sa_step_args.norm_type. */
typedef enum sa_norm_type {
  SA_NORM_L2 = 0, /* sqrt of the sum of squares of all grad elements */
  SA_NORM_INF = 1 /* the largest absolute grad element */
} sa_norm_type;

#define SA_STEP_ARGS_INIT \
  { sizeof(sa_step_args), NULL, NULL, NULL, 0.0, SA_NORM_L2, NULL, NULL }

/** The number of fields of sa_step_args (struct_size aside) this library knows. */
SA_API int32_t sa_step_args_num_fields(void);

/** Describes field `index` of sa_step_args (0 .. sa_step_args_num_fields() - 1, in struct
 *  order) into *out (sa_struct_field of SA_STRUCT_STEP_ARGS), so that bindings fill the
 *  struct by name: its type (SA_FIELD_POINTER, SA_FIELD_DOUBLE, SA_FIELD_INT32), offset,
 *  default (0 for a pointer: NULL), valid values and doc. fixed_with_params is 0. */
SA_API sa_status sa_step_args_field(int32_t index, sa_field_info* out);

/**
 * Runs one optimizer step over every param that has a grad, advancing its step count and
 * each group's.
 *
 * Communication: with a communicator set (sa_optimizer_set_comm) the step is collective:
 * every rank of the communicator must call it, with the same max_grad_norm and
 * norm_type and with found_inf given on all ranks or on none. A found_inf flag set on
 * any rank then skips the step on every rank, and the gradient norm is global. Steps that
 * need neither (no norm, no found_inf) do not communicate, unless the optimizer has
 * sharded params of SA_SCALING_CURRENT(_POW2), whose amax every step reduces between the
 * update and the cast (the first such step also compares the ranks' current-scaled params:
 * SA_ERR_MISMATCH, nothing changed, if they differ).
 * `args` may be NULL (defaults). `stream` is the device stream to enqueue on, as a
 * cudaStream_t (NULL = the legacy default stream); the CPU backend ignores it.
 *
 * Params without a grad (sa_optimizer_clear_grad, SA_NO_GRAD, a NULL entry of
 * sa_optimizer_set_grads) are skipped; a param never given a grad nor a "no grad" since it
 * was added makes the step fail with SA_ERR_STATE, and nothing is updated. An optimizer
 * whose state an import left half written refuses too
 * (SA_ERR_STATE; see sa_optimizer_import). The first step after params were added builds
 * the launch plan (allocation; on CUDA it also synchronizes); later steps allocate nothing.
 *
 * When it returns: CPU: the step is done. CUDA: the work is enqueued on `stream` and the
 * host does not wait (unless args->skipped is given with a found_inf, which reads the
 * flag back). Grad memory, inv_grad_scale and found_inf must stay valid until the stream
 * reaches the step. On CUDA the step counts live on the device, so a found_inf skip and
 * graph replays need no host; sa_optimizer_get_step reads them back.
 *
 * CUDA graphs: run one step outside capture first (it builds the plan), then capture
 * sa_optimizer_step on a capturing stream. Before each replay, after changing lr or
 * other hyperparameters or grad bindings, call sa_optimizer_flush on the replay stream; a
 * captured step refuses to record uploads (SA_ERR_STATE). A step over a host-callback
 * communicator cannot be captured. Muon groups of whole matrices capture too: Newton-Schulz
 * runs its cuBLAS GEMMs on a workspace in the optimizer's own scratch (32 MiB beside the
 * largest matrix's), not on cuBLAS's pool, so a capture allocates nothing.
 */
SA_API sa_status sa_optimizer_step(sa_optimizer* opt, const sa_step_args* args, void* stream);

/**
 * A partial step: sa_optimizer_step for the params params[0..n) only (indices, each at most
 * once, in any order), while every other param stays as it is (values, state and step
 * count), as if it had no grad. An engine can so step each layer as soon as its grads are
 * ready (step-in-backward), or offloaded state a part at a time.
 *
 * Per-param step counts advance as in a step, so bias correction is exact however the
 * params are split; group step counts do not advance (they count full steps;
 * sa_optimizer_set_step sets them). A listed param without a grad is skipped, one never
 * given a grad is refused (SA_ERR_STATE), as in a step; the others need no grad.
 * args: as sa_optimizer_step's (NULL: defaults; found_inf and inv_grad_scale apply to the
 * listed params), except clipping: max_grad_norm must be 0 (SA_ERR_INVALID_ARGUMENT), since
 * the norm clipping needs is that of every grad: clip in a full step. With state on the host
 * (SA_STATE_ON_HOST), only the ring segments that hold a listed param move over the link.
 * Everything is checked before anything changes: a bad index, a repeated one, or n < 0 is
 * SA_ERR_INVALID_ARGUMENT with nothing stepped. The stream contract is sa_optimizer_step's.
 */
SA_API sa_status sa_optimizer_step_params(sa_optimizer* opt, int64_t n, const int64_t* params,
                                          const sa_step_args* args, void* stream);

/**
 * Enqueues on `stream` the upload of whatever changed on the host since the last step:
 * grad bindings and hyperparameters (sa_optimizer_step does this first; step counts need
 * none, they live on the device). Needed only before replaying a captured step. It readies a
 * full step: after a partial step (sa_optimizer_step_params), every param with a grad again.
 * The CPU backend has nothing to upload. With sharded SA_SCALING_CURRENT(_POW2) params whose ranks
 * have not been compared yet (params or communicator changed), it compares them first, a
 * collective that synchronizes (as the first step would; so not inside a capture); so it
 * does for Muon matrices split across ranks, whose ranks' boxes it gathers and checks.
 */
SA_API sa_status sa_optimizer_flush(sa_optimizer* opt, void* stream);

/* ------------------------------------------------------------------------------------ */
/* Communicators (global gradient norm, found-inf consensus)                             */
/* ------------------------------------------------------------------------------------ */

/*
 * A communicator reduces a few doubles across the ranks of a training job: the partial
 * gradient norms and found-inf flags of a step. It spans every rank that holds a part of
 * the optimizer's params (the whole mesh); shards replicated along a mesh dim are counted
 * by the replica at coordinate 0 only, so each element counts once.
 *
 * Kinds: NCCL (created from a unique id, or wrapping the caller's ncclComm_t), which
 * reduces in device memory on the step's stream with no host wait; and host callbacks
 * (the caller's own transport, or CPU training), which the step calls on the calling
 * thread with host memory. A CUDA optimizer with a host communicator synchronizes the
 * stream once per communicating step; a CPU optimizer needs a host communicator.
 *
 * Lifetime: sa_comm_destroy releases the caller's reference; an optimizer that was given
 * the communicator keeps it alive until the optimizer is destroyed or given another.
 * Calls without an optimizer report failures through sa_last_error().
 */
typedef struct sa_comm sa_comm; /* opaque */

/** The reduction of sa_host_comm.all_reduce. */
typedef enum sa_reduce_op { SA_REDUCE_SUM = 0, SA_REDUCE_MAX = 1 } sa_reduce_op;

/** A communicator made of the caller's callbacks. */
typedef struct sa_host_comm {
  size_t struct_size;
  /* Passed back to every callback. */
  void* ctx;
  /* Required. Replaces values[0..count) (host memory) with their element-wise `op` over
   * all ranks, in place; every rank calls it with the same count and op. Returns 0 on
   * success, nonzero on failure: the step then fails with SA_ERR_COMM, before anything
   * was updated on this rank when it was the step's first reduction (its norm and
   * found-inf flag); a failure while split Muon matrices are carried (here or in
   * all_to_all), which comes after this rank's update, leaves the step applied to the
   * other params: restore them from a checkpoint. Called on the thread that called
   * sa_optimizer_step. */
  int (*all_reduce)(void* ctx, double* values, int32_t count, sa_reduce_op op);
  /* Optional: called once with ctx when the communicator is freed. */
  void (*release)(void* ctx);
  /* Optional: this rank and the number of ranks of the transport, 0 <= rank < nranks, the
   * ranks numbered 0, 1, ... without gaps; nranks 0 (the default) says nothing. Said, each
   * Muon matrix split across ranks is orthogonalized on one rank (its owner, chosen by the
   * matrix's size among the ranks that hold a part of it) instead of on every rank, its
   * parts sent there and the result's parts sent back (all_to_all); the first step checks
   * that the ranks' numbers make 0..nranks-1 once each and that their parts of each matrix
   * cover it exactly once (SA_ERR_MISMATCH otherwise). Unsaid, every rank orthogonalizes
   * every split matrix, summed whole with all_reduce. */
  int32_t rank;
  int32_t nranks;
  /* Optional, with rank and nranks said: sends send_bytes[r] bytes to each rank r and
   * receives recv_bytes[r] bytes from each rank r, the blocks one after another in rank
   * order in `send` and `recv` (host memory), as MPI_Alltoallv and torch.distributed's
   * all_to_all_single do with bytes; the sizes for this rank are 0. Every rank calls it at
   * the same time, and rank q's send_bytes[r] equals rank r's recv_bytes[q]. Returns 0 on
   * success, nonzero on failure (the step fails with SA_ERR_COMM). It moves the split Muon
   * matrices' boxes to their owners and back; without it, all_reduce carries them, every
   * rank's to every rank: the same results, with memory and traffic that grow with the rank
   * count. */
  int (*all_to_all)(void* ctx, const void* send, const int64_t* send_bytes, void* recv,
                    const int64_t* recv_bytes);
} sa_host_comm;

#define SA_HOST_COMM_INIT \
  { sizeof(sa_host_comm), NULL, NULL, NULL, 0, 0, NULL }

/** Creates a communicator from host callbacks. The table is copied; ctx is kept. */
SA_API sa_status sa_comm_create_host(const sa_host_comm* callbacks, sa_comm** out);

/** The 128 bytes that let ranks join one NCCL communicator: rank 0 makes it, the host
 *  engine broadcasts it (as plain bytes) to the other ranks. */
typedef struct sa_nccl_unique_id {
  char internal[128];
} sa_nccl_unique_id;

/** Makes a new NCCL unique id (ncclGetUniqueId). SA_ERR_UNSUPPORTED when this build has
 *  no NCCL (see sa_build_info()) or NCCL cannot be loaded: the CUDA module loads
 *  libnccl.so.2 (or $SHARDADAM_NCCL_LIBRARY) the first time an NCCL call needs it, so a
 *  machine without NCCL runs everything else. */
SA_API sa_status sa_nccl_unique_id_create(sa_nccl_unique_id* out);

/**
 * Creates an NCCL communicator of `nranks` ranks on CUDA device `device`, as rank `rank`
 * (ncclCommInitRank). Collective: it returns once all nranks ranks have called it with
 * the same id. The communicator owns its ncclComm_t. SA_ERR_UNSUPPORTED without NCCL,
 * SA_ERR_COMM when NCCL fails.
 */
SA_API sa_status sa_comm_create_nccl(const sa_nccl_unique_id* id, int32_t nranks, int32_t rank,
                                     int32_t device, sa_comm** out);

/**
 * Wraps the caller's NCCL communicator (an ncclComm_t, passed as void*), for engines that
 * already have one. Borrowed: the caller keeps it alive (not destroyed, not aborted)
 * until every optimizer it was given to is destroyed or given another communicator, and
 * does not run other work on it concurrently with a step.
 */
SA_API sa_status sa_comm_wrap_nccl(void* nccl_comm, sa_comm** out);

/** This rank and the rank count of a communicator (a host communicator reports -1 for
 *  both unless its sa_host_comm said them). */
SA_API sa_status sa_comm_info(const sa_comm* comm, int32_t* rank, int32_t* nranks);

/** Releases the caller's reference. NULL is ignored. */
SA_API void sa_comm_destroy(sa_comm* comm);

/**
 * Gives the optimizer a communicator for its steps (NULL: none, steps are rank-local).
 * The optimizer keeps a reference. A NCCL communicator must be on the optimizer's CUDA
 * device (checked at the step: SA_ERR_MISMATCH). NULL is refused (SA_ERR_STATE) while the
 * optimizer holds a sharded param of SA_SCALING_CURRENT(_POW2).
 */
SA_API sa_status sa_optimizer_set_comm(sa_optimizer* opt, sa_comm* comm);

/* ---- state ------------------------------------------------------------------------- */

/**
 * A zero-copy view of one state of a param. `key` is one of "exp_avg", "exp_avg_sq",
 * "max_exp_avg_sq" (amsgrad), "master" (SA_MASTER_FP32), "remainder"
 * (SA_MASTER_REMAINDER), or with uint8 moments "exp_avg_absmax", "exp_avg_sq_absmax",
 * "max_exp_avg_sq_absmax" (sa_optimizer_state_keys lists a param's keys). The view has the
 * param's local shape (an absmax state: [number of 256-element blocks]) and the state's
 * storage dtype, and is writable: writes change the optimizer's state. It is on the
 * optimizer's device, or on kDLCPU for a state placed on the host (SA_STATE_ON_HOST).
 *
 * Ownership: the caller owns *out and must call (*out)->deleter(*out). The memory it
 * points to stays valid until then, even if the optimizer is destroyed first.
 */
SA_API sa_status sa_optimizer_state_view(sa_optimizer* opt, int64_t param, const char* key,
                                         DLManagedTensorVersioned** out);

/**
 * Params and their masters made to agree again after an engine wrote one of them outside
 * a step (a state dict loaded through state views, weights loaded into the params), for
 * params [first, first + n). Both synchronize a device backend (setup calls, not per-step
 * ones) and change nothing on error (a bad range).
 *
 * recast_params: each fp8 param is cast again from its master by its scaling, as a step
 *   casts it after its update (block scales written; a delayed scaling reads its scale
 *   now and writes its amax tensor, if any, with the masters' amax; a current scaling
 *   writes its scale from the amax of the whole tensor, reduced across the ranks when
 *   the range holds a sharded one: then the call is collective, every rank calling it with
 *   the same range). Other params are left as they are.
 * reset_masters: each master is set from its param's value, as add_param starts it: an
 *   fp8 param's value times its scale's inverse (the scale tensors as they are now), a
 *   16-bit param's value widened (SA_MASTER_FP32), a zero remainder (SA_MASTER_REMAINDER,
 *   so that the master is the bfloat16 value). Moments and step counts are left as they
 *   are. Params without a master are left as they are.
 */
SA_API sa_status sa_optimizer_recast_params(sa_optimizer* opt, int64_t first, int64_t n);
SA_API sa_status sa_optimizer_reset_masters(sa_optimizer* opt, int64_t first, int64_t n);

/**
 * The keys of the states a param has, in the order shard files and views list them
 * (exp_avg, exp_avg_sq, then max_exp_avg_sq in an amsgrad group, then master or remainder
 * by its master kind): *count receives their number, and the first min(capacity, count)
 * go to keys[] as static strings. keys may be NULL when capacity is 0 (asking the count).
 */
/**
 * A moment of a param ("exp_avg", "exp_avg_sq", "max_exp_avg_sq") as float32 values,
 * whatever its storage: float32 as is, bfloat16 widened, 8-bit codes decoded as shard
 * files hold them (docs/precision.md: 8-bit moments). For state dicts that hold float32 moments
 * (the torch face's, which torch's AdamW and DCP resharding read).
 *
 * get: writes the values into `out`. set: stores `values` in the moment's dtype
 *   (bfloat16: rounded to nearest even; 8-bit: quantized by the local shard's blocks, as
 *   a step quantizes, so a get then a set leaves an 8-bit moment bit for bit as it was).
 * The tensor: float32, C-contiguous, in host memory (kDLCPU), of the param's local shape;
 * it is read or written during the call only. Both synchronize a device backend. Nothing
 * changes on error; set refuses an unusable optimizer (see sa_optimizer_import).
 */
SA_API sa_status sa_optimizer_get_moment_values(const sa_optimizer* opt, int64_t param,
                                                const char* key, const DLTensor* out);
SA_API sa_status sa_optimizer_set_moment_values(sa_optimizer* opt, int64_t param, const char* key,
                                                const DLTensor* values);

SA_API sa_status sa_optimizer_state_keys(const sa_optimizer* opt, int64_t param, const char** keys,
                                         int32_t capacity, int32_t* count);

/** The keys of a param's moments, as sa_optimizer_state_keys gives them: the states
 *  that sa_optimizer_get_moment_values and sa_optimizer_set_moment_values take
 *  ("exp_avg", "exp_avg_sq", and "max_exp_avg_sq" in an amsgrad group), whatever their
 *  storage. Bindings ask this instead of listing the moments themselves. */
SA_API sa_status sa_optimizer_moment_keys(const sa_optimizer* opt, int64_t param, const char** keys,
                                          int32_t capacity, int32_t* count);

/** The keys of a param's states that checkpoints hold (shard files; the torch face's state
 *  dicts), as sa_optimizer_state_keys gives them: every state but the per-block data of
 *  8-bit moments (their "*_absmax" states), which a load derives from the moment's
 *  values (sa_optimizer_get_moment_values). */
SA_API sa_status sa_optimizer_checkpoint_keys(const sa_optimizer* opt, int64_t param,
                                              const char** keys, int32_t capacity, int32_t* count);

/* ------------------------------------------------------------------------------------ */
/* State export and import (shard files)                                                 */
/* ------------------------------------------------------------------------------------ */

/*
 * A shard file is one rank's optimizer state as a valid safetensors file: tensors named
 * "<param name>/<state key>" in their storage dtype and local shape, and a __metadata__
 * holding the format ("shardadam", version 3), the optimizer's groups (hyperparameters and
 * step counts), each param's own step count, the writer's mesh coordinate, each tensor's
 * global shape and offset, and CRC-32C checksums over fixed-size blocks of each tensor's
 * data. A block moment (8-bit, float8) is its codes and a float32 absmax per block, which
 * an import refuses unless finite with its sign bit clear (the writer writes no other).
 * Version 1 files (without per-param counts) and version 2 files (block moments as float32
 * values) still load. docs/shard-files.md documents the
 * metadata keys. Any safetensors reader opens it; shardadam reads any set of such files
 * written by N ranks into an optimizer with any layout on M ranks.
 */

/** Where an export's bytes go. Fill it yourself (object store, DCP storage) or use
 *  sa_file_writer / sa_memory_writer. */
typedef struct sa_writer {
  size_t struct_size;
  void* ctx;
  /* Appends `bytes` bytes. Returns 0 on success, nonzero on failure. */
  int (*write)(void* ctx, const void* data, size_t bytes);
  /* Called once after the last write: make the blob durable and visible (the file
   * writer fsyncs and renames its temporary file over the final name). 0 on success.
   * May be NULL. An export that fails never calls it. */
  int (*commit)(void* ctx);
  /* Frees ctx (sa_writer_release calls it). May be NULL. */
  void (*release)(void* ctx);
  /* Optional (may be NULL): writes `bytes` bytes at `offset` of the blob. With it an
   * export reads the state once: it writes the data first, from several threads at once
   * (disjoint ranges: write_at must allow concurrent calls), then the header at offset 0;
   * each byte of the blob is written exactly once and `write` is not called. Without it
   * an export appends through `write` and reads the state twice (the header, which holds
   * the checksums, comes first). 0 on success. */
  int (*write_at)(void* ctx, uint64_t offset, const void* data, size_t bytes);
  /* Optional (may be NULL): called once, before any write, with the blob's exact size in
   * bytes, so the writer can make room (the memory writer allocates it once; the file
   * writer allocates the disk space, so a full disk fails here, before anything is
   * written). Nonzero fails the export with SA_ERR_IO. */
  int (*reserve)(void* ctx, uint64_t bytes);
} sa_writer;

/** Where an import's bytes come from: a size and a read at an offset. */
typedef struct sa_reader {
  size_t struct_size;
  void* ctx;
  uint64_t size; /* total bytes of the blob */
  /* Reads exactly `bytes` bytes at `offset` into dst. Returns 0 on success. Unless
   * `concurrent` is 1, called from one thread at a time (the importing thread, or for
   * device state one the import starts to read ahead), in increasing offset order per
   * blob within a pass; an import that cannot keep everything it reads in its staging
   * buffer reads each range twice (once to verify it, once to apply it; once with
   * read_once) and needs the same bytes both times. */
  int (*read_at)(void* ctx, uint64_t offset, void* dst, size_t bytes);
  /* Frees ctx (sa_reader_release calls it). May be NULL. */
  void (*release)(void* ctx);
  /* Names the blob in error messages (e.g. its path); may be NULL. */
  const char* name;
  /* 1: read_at may be called from several threads at once, for any ranges in any order
   * (pread, memcpy): an import then reads each checksum block on the worker thread that
   * checks it. 0 (SA_READER_INIT): one thread at a time, as described at read_at. The
   * file and memory readers set 1. */
  int32_t concurrent;
} sa_reader;

#define SA_WRITER_INIT \
  { sizeof(sa_writer), NULL, NULL, NULL, NULL, NULL, NULL }
#define SA_READER_INIT \
  { sizeof(sa_reader), NULL, 0, NULL, NULL, NULL, 0 }

/** A writer to `path`: bytes go to a temporary file beside it, "<path>.tmp.<pid>.<n>"
 *  (created now: SA_ERR_IO, naming it, if that fails). Commit fsyncs it, renames it over
 *  `path` and fsyncs the directory, so a crash never leaves a file that looks complete
 *  and an existing file at `path` is replaced only whole. Releasing an uncommitted file
 *  writer removes the temporary file. It has write_at (pwrite) and reserve (the disk
 *  space, with posix_fallocate where the file system supports it: a full disk fails the
 *  export before it writes). Handle-less: errors go to sa_last_error(). */
SA_API sa_status sa_file_writer(const char* path, sa_writer* out);

/** A writer into a memory buffer; read it with sa_memory_writer_data. It has write_at
 *  and reserve: an export allocates the blob's size once and copies each byte once (no
 *  zero fill, no regrowth); appends without a reservation grow it geometrically. */
SA_API sa_status sa_memory_writer(sa_writer* out);

/** The bytes a memory writer holds (valid until it is released or written again).
 *  SA_ERR_INVALID_ARGUMENT for a writer that sa_memory_writer did not make. */
SA_API sa_status sa_memory_writer_data(const sa_writer* writer, const void** data, size_t* size);

/** A reader of the regular file at `path` (opened now; its size is read now; reads use
 *  pread, so a file replaced by rename afterwards is still read whole from the old one).
 *  SA_ERR_IO naming the path if it cannot be opened. */
SA_API sa_status sa_file_reader(const char* path, sa_reader* out);

/** A reader of `size` bytes at `data`, borrowed: they must outlive the reader. */
SA_API sa_status sa_memory_reader(const void* data, size_t size, sa_reader* out);

/** Calls release(ctx) and clears the struct. NULL and released structs are no-ops. */
SA_API void sa_writer_release(sa_writer* writer);
SA_API void sa_reader_release(sa_reader* reader);

/**
 * Writes this rank's state (every param, every state key, the groups and their step
 * counts, the mesh coordinate) as one shard file through `writer`, then commits it. A
 * param replicated along a mesh dim (Replicate placement) is written only by the replica
 * at coordinate 0 of every such dim; every rank writes the groups. Empty shards are
 * written too (a tensor with a zero dim), so a reader sees every rank's box. Params
 * themselves are not written (they belong to the model's checkpoint).
 *
 * The header, which carries the checksums, comes before the data. With a writer that has
 * write_at (the file and memory writers) the state is read once: chunks of it are
 * checksummed and written on the optimizer's worker threads (sa_optimizer_config.num_threads),
 * and the header is written last;
 * otherwise it is read twice (to checksum it, then to append it after the header). The
 * bytes are the same either way: the header is padded with spaces to the length it would
 * have with every checksum at its widest. Device state is copied out through two pinned
 * staging buffers of 32 MiB, the copy of one chunk overlapping the checksums and writes of the
 * previous one; the call synchronizes the device first. The first export (or import through them,
 * see sa_import_options) makes the staging buffers, and the first export its worker threads; the
 * optimizer keeps them for the next exports (pinning costs more than a chunk's copy): 64 MiB of
 * pinned host memory (none for host state) until sa_optimizer_destroy. An export while an async one
 * (sa_optimizer_export_async) still writes first waits for it. Errors: SA_ERR_IO when the writer
 * fails (commit is then never called), SA_ERR_UNSUPPORTED for a param name that is not valid UTF-8
 * (the header is JSON), SA_ERR_STATE when the optimizer is unusable after a failed import. On
 * failure nothing is committed.
 */
SA_API sa_status sa_optimizer_export(sa_optimizer* opt, const sa_writer* writer);

/** An async export in flight (sa_optimizer_export_async); opaque. */
typedef struct sa_export_job sa_export_job;

/**
 * Starts an export that does not hold up training: copies the state (as
 * sa_optimizer_export would write it: the same params, groups and step counts) into a
 * snapshot the optimizer owns, then returns; a thread of the library's checksums it and
 * writes it through `writer`, then commits. The file is byte-identical to what
 * sa_optimizer_export would have written at the moment of the call. Steps, imports and
 * hyperparameter changes may follow at once: they change the state, not the snapshot.
 *
 * The call synchronizes the device (as sa_optimizer_export does), then copies device state
 * to the snapshot in pinned host memory with one asynchronous copy per tensor, and waits for
 * them; host state is copied on the optimizer's worker threads. The snapshot is allocated
 * by the first async export (pinning costs time of its own: once) and kept for the next
 * ones until sa_optimizer_destroy: as many bytes as the state exported (the largest yet),
 * besides the export's staging (see sa_optimizer_export).
 *
 * `writer` is copied, but what it refers to (its ctx) must stay valid until the job has
 * ended (sa_export_job_wait returned, or sa_export_job_poll said done); then release it
 * as after sa_optimizer_export (a file writer whose export failed removes its temporary
 * file then). Its callbacks run on the library's threads.
 *
 * One export writes at a time per optimizer: an export (either kind) called while an async
 * one is still writing first waits for it to end (its status stays its own job's).
 * sa_optimizer_destroy waits for a job in flight too; the job handle stays valid after it.
 * On success `*job` is a handle to release with sa_export_job_release. Errors found before
 * the call returns (those of sa_optimizer_export: an unusable optimizer, a bad writer, no
 * memory for the snapshot) are returned here with nothing started and *job NULL; the
 * others (the writer fails, a full disk) surface from sa_export_job_wait, with nothing
 * committed.
 */
SA_API sa_status sa_optimizer_export_async(sa_optimizer* opt, const sa_writer* writer,
                                           sa_export_job** job);

/** Waits until the job has ended and returns its status: SA_OK once the blob is
 *  committed, else sa_optimizer_export's error (detail: sa_export_job_last_error). Calling
 *  it again returns the same. SA_ERR_INVALID_ARGUMENT for a NULL job (thread-local error). */
SA_API sa_status sa_export_job_wait(sa_export_job* job);

/** Sets *done to 1 when the job has ended, then returns what sa_export_job_wait returns;
 *  else *done = 0 and SA_OK. Never blocks. */
SA_API sa_status sa_export_job_poll(sa_export_job* job, int32_t* done);

/** The detail of the job's failure ("" while it runs or after success); valid until the
 *  job is released. */
SA_API const char* sa_export_job_last_error(const sa_export_job* job);

/** Waits for the job to end (its writer is still in use until then), then frees the
 *  handle. NULL is a no-op. */
SA_API void sa_export_job_release(sa_export_job* job);

typedef struct sa_import_options {
  size_t struct_size;
  /* Bytes of the staging buffer data goes through. Peak extra memory of an import is
   * about this plus the headers, and with block moments (uint8, float8_e4m3fn) as much
   * again: their float32 values land in host memory in rounds of at most this size (or of
   * one moment of one param, 4 bytes per element of its shard, if that is larger) before
   * they are quantized. 0: 64 MiB. At least one checksum block (1 MiB) is used whatever is
   * asked, and no more than the import reads. When all it reads fits, it reads everything
   * once, into this buffer (pinned for device state), and checks it before anything
   * changes; otherwise twice (once to verify every checksum before anything changes, once
   * to copy, checking the checksums again), unless read_once. Reads and checksums run on
   * the optimizer's worker threads, many blocks at once. Device state that does not fit
   * goes up through two pinned halves of min(staging_bytes / 2, 32 MiB) each, one read
   * while the other is copied: the optimizer's own, which it keeps for its next imports
   * and exports (those of sa_optimizer_export), since pinning costs time of its own
   * (about 0.4 ms per MiB measured on an H100 host). */
  uint64_t staging_bytes;
  /* 1: params of this optimizer absent from the blobs keep their state (else an error). */
  int32_t allow_missing;
  /* 1: params in the blobs that this optimizer lacks are ignored (else an error). */
  int32_t allow_unexpected;
  /* 1 (default): restore the groups' hyperparameters and step counts, and each param's
   * step count, from the blobs (params the blobs do not hold keep theirs). */
  int32_t restore_groups;
  /* 1: read every byte once even when the data exceed the staging buffer: each checksum
   * block is checked as it is read, before it is copied, so a damaged block found after the
   * copying began fails the import with SA_ERR_FORMAT and leaves the optimizer unusable
   * (as a failed copy does: see below) instead of unchanged. For resumes into a fresh
   * optimizer, where the state before the import is worth nothing. 0 (default): nothing
   * changes unless every checksum matched first, at the cost of reading the data twice
   * when they exceed the staging buffer. Headers, and everything else checked before the
   * copy, are checked first either way. */
  int32_t read_once;
} sa_import_options;

#define SA_IMPORT_OPTIONS_INIT \
  { sizeof(sa_import_options), 0, 0, 0, 1, 0 }

/**
 * Loads state from `n` shard files (written by any number of ranks with any layout)
 * into this optimizer's existing state buffers, resharding as needed. Params are matched
 * by name; the files may hold their ranks' shards in any order.
 *
 * Validation comes first and changes nothing: every header is read and checked; the
 * files must agree on the groups and step counts, whatever restore_groups says, and those
 * holding parts of one param on its step count (files of different checkpoints do not;
 * the message names the group or param, the field and both values);
 * every param of this optimizer must be in the files (unless allow_missing) and every
 * param of the files in this optimizer (unless allow_unexpected), with the same state
 * keys (so the same master kind and amsgrad); for every param imported and every state
 * key, the saved boxes over all `n` files must have its global shape and tile the whole
 * global tensor exactly once (not only this rank's box: give every file of the
 * checkpoint, each once, even where only some of them touch this rank's box); float32
 * and bfloat16 moments convert into each other (rounding to nearest even), master and
 * remainder never convert; with restore_groups the groups must match in number and be
 * acceptable to sa_optimizer_set_group; and the checksums of every block that will be
 * read must match. Params that allow_unexpected ignores are never read, so their boxes
 * are not checked for tiling (their headers are, like every header). Only then are the
 * checksum blocks holding the runs that intersect this rank's boxes read (runs along
 * trailing dims that both sides hold whole are merged into one) and copied into place
 * through the staging buffer.
 *
 * Errors, each with a message naming the blob, param and state: SA_ERR_FORMAT for a blob
 * that is not a sound shard file (not safetensors, another format, truncated, bytes after
 * the data section, a checksum that does not match: header or data; a header that is not
 * JSON is placed by its byte offset, its bytes not quoted); SA_ERR_UNSUPPORTED for a
 * newer format version; SA_ERR_MISMATCH when the files do not fit this optimizer or each
 * other (global shapes, gaps or overlaps in the tiling, naming the two overlapping boxes
 * and their files or an element in no box, state keys, groups, params missing or
 * unexpected); SA_ERR_IO when a reader fails. All of these leave the optimizer exactly as
 * it was.
 *
 * A failure during the copy phase (a read fails, or a block no longer matches its
 * checksum: the blob changed under us) returns SA_ERR_IO (with read_once, a damaged block
 * found there returns SA_ERR_FORMAT, and "all of these" above covers only what is checked
 * before the copy) and marks the optimizer unusable: sa_optimizer_step, sa_optimizer_flush and
 * sa_optimizer_export refuse with SA_ERR_STATE, saying why, until an import succeeds that restores
 * every param (one where allow_missing skipped a param leaves the mark). The call synchronizes the
 * device before it copies. `options` may be NULL. Params themselves are not touched: load them from
 * the model's own checkpoint (a remainder state restores the fp32 value only with the same bf16
 * param bits it was saved with). The exception is an fp8 param (sa_param_scaling): it follows from
 * its master, so an import casts it from the loaded master with its scaling, as a step would (block
 * scales rewritten; a delayed scaling casts with the engine's current scale and writes the amax; a
 * current scaling takes the amax of the whole tensor, so an import of sharded ones is
 * collective, as sa_optimizer_recast_params is).
 */
SA_API sa_status sa_optimizer_import(sa_optimizer* opt, int32_t n, const sa_reader* const* readers,
                                     const sa_import_options* options);

/**
 * Describes what a set of shard files holds, as a JSON text (the caller frees it with
 * sa_free): per global tensor (param and state key) its global shape, dtype, the boxes
 * saved and by which file, whether they cover the tensor exactly once (and where not),
 * and for block codes their scales ("block_scales": the key and the block's elements),
 * and per file whether its header parses (the same checks as sa_optimizer_import: bytes
 * after the data section make a header "bad") and its checksums match. `verify_data` 0
 * skips reading the data (headers only). A bad file is described in the report, not an
 * error: the call returns SA_OK whenever it produced a report, and the report's "ok" says
 * whether every file is sound, the files agree on the groups (else "groups" names the
 * group, field and both values) and every tensor is covered exactly once (docs/shard-files.md,
 * "Inspecting files", shows the report). `n` 0 is SA_ERR_INVALID_ARGUMENT, not a report: no
 * file proves nothing whole. Handle-less: errors go to sa_last_error(). The
 * shardadam-inspect tool prints this report for files given on its command line.
 */
SA_API sa_status sa_inspect(int32_t n, const sa_reader* const* readers, int32_t verify_data,
                            char** report_json);

/** Frees memory shardadam allocated for the caller (sa_inspect's report). NULL: no-op. */
SA_API void sa_free(void* p);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* SHARDADAM_H_ */
