/*
 * test_c_abi.c — shardadam.h is a C99 header: this program includes it from C (built
 * with -std=c99 -Wall -Wextra -Wpedantic), hands over DLPack tensors it fills by hand,
 * and checks the first Adam step against a float64 computation of its own, the descent
 * direction of later steps, the DLPack ownership contract and an error path.
 * It prints every failed check and exits nonzero if there was one.
 */
#include <stdio.h>
#include <string.h>

#include "c_check.h"
#include "shardadam/shardadam.h"


/* Stops the test when a call that everything after it depends on fails. */
#define REQUIRE_OK(opt, call)                                                   \
  do {                                                                          \
    sa_status status_ = (call);                                                 \
    if (status_ != SA_OK) {                                                     \
      fprintf(stderr, "%s:%d: %s returned %s: %s\n", __FILE__, __LINE__, #call, \
              sa_status_string(status_), sa_optimizer_last_error(opt));         \
      return 1;                                                                 \
    }                                                                           \
  } while (0)

/* ---- a hand-made DLPack producer: counts how often the optimizer calls the deleter ---- */

static int g_deleter_calls = 0;

static void count_deleter(DLManagedTensorVersioned* self) {
  (void)self;
  ++g_deleter_calls;
}

static DLManagedTensorVersioned make_f32_tensor(float* data, int32_t ndim, int64_t* shape) {
  DLManagedTensorVersioned t;
  memset(&t, 0, sizeof t);
  t.version.major = DLPACK_MAJOR_VERSION;
  t.version.minor = DLPACK_MINOR_VERSION;
  t.manager_ctx = NULL;
  t.deleter = count_deleter;
  t.flags = 0;
  t.dl_tensor.data = data;
  t.dl_tensor.device.device_type = kDLCPU;
  t.dl_tensor.device.device_id = 0;
  t.dl_tensor.ndim = ndim;
  t.dl_tensor.dtype.code = kDLFloat;
  t.dl_tensor.dtype.bits = 32;
  t.dl_tensor.dtype.lanes = 1;
  t.dl_tensor.shape = shape;
  t.dl_tensor.strides = NULL; /* C-contiguous */
  t.dl_tensor.byte_offset = 0;
  return t;
}

static double abs_of(double x) { return x < 0.0 ? -x : x; }

/* First Adam(W) step from zero moments, in float64, from the formula in shardadam.h with
 * t = 1: m = (1 - beta1) g, v = (1 - beta2) g^2, bc1 = 1 - beta1, bc2 = 1 - beta2, so
 * m / bc1 = g and sqrt(v) / sqrt(bc2) = |g|, and the step is
 *   p = p (1 - lr wd) - lr g / (|g| + eps).
 * (Folded by hand, so the test needs no libm and shares no arithmetic with the kernel.) */
static double first_step_reference(double p, double g, const sa_group_config* c) {
  return p * (1.0 - c->lr * c->weight_decay) - c->lr * g / (abs_of(g) + c->eps);
}

static int close_to(double got, double want) {
  return abs_of(got - want) <= 1e-6 * (1.0 + abs_of(want));
}

/* Deterministic values in [-1, 1] away from 0 (so the sign of each grad is clear). */
static float pseudo_random(unsigned* state) {
  float u;
  *state = *state * 1664525u + 1013904223u;
  u = (float)((*state >> 8) & 0xffffu) / 65535.0f; /* [0, 1] */
  return (u < 0.5f ? -1.0f : 1.0f) * (0.25f + 1.5f * (float)abs_of(u - 0.5f));
}

#define W_ROWS 3
#define W_COLS 5
#define W_N (W_ROWS * W_COLS)
#define B_GLOBAL \
  7 /* over a mesh of 4 with Shard(0): chunks 2, 2, 2, 1; coordinate 1 holds [2, 4) */
#define B_LOCAL 2
#define E_GLOBAL 5 /* over a mesh of 4: chunks 2, 2, 1, 0; coordinate 3 is empty */
#define STEPS 5

int main(void) {
  sa_optimizer* opt = NULL;
  sa_group_config config = SA_GROUP_CONFIG_INIT;
  sa_group_config read_back = SA_GROUP_CONFIG_INIT;
  sa_layout b_layout = SA_LAYOUT_INIT;
  sa_layout e_layout = SA_LAYOUT_INIT;
  sa_placement shard0;
  sa_param_info info = SA_PARAM_INFO_INIT;
  int64_t w_shape[2] = {W_ROWS, W_COLS};
  int64_t b_shape[1] = {B_LOCAL}, b_global[1] = {B_GLOBAL};
  int64_t e_shape[1] = {0}, e_global[1] = {E_GLOBAL};
  int64_t mesh_shape[1] = {4}, b_coord[1] = {1}, e_coord[1] = {3};
  float w[W_N], w0[W_N], w_grad[W_N];
  float b[B_LOCAL], b0[B_LOCAL], b_grad[B_LOCAL];
  DLManagedTensorVersioned w_tensor, b_tensor, e_tensor, bad_tensor;
  DLTensor w_grad_tensor;
  const void* grad_ptrs[3];
  DLManagedTensorVersioned* view = NULL;
  int32_t group = -1;
  int64_t w_param = -1, b_param = -1, e_param = -1, bad_param = -1, step_count = 0;
  unsigned seed = 12345u;
  sa_status status;
  int i, s;

  /* ---- version ---- */
  CHECK(sa_version() == SA_VERSION_NUMBER, "library %d, header %d", sa_version(),
        SA_VERSION_NUMBER);
  CHECK(sa_build_info() != NULL && strstr(sa_build_info(), "shardadam") != NULL, "build info '%s'",
        sa_build_info());
  CHECK(strcmp(sa_status_string(SA_ERR_MISMATCH), "SA_ERR_MISMATCH") == 0, "'%s'",
        sa_status_string(SA_ERR_MISMATCH));

  for (i = 0; i < W_N; ++i) {
    w[i] = w0[i] = pseudo_random(&seed);
    w_grad[i] = pseudo_random(&seed);
  }
  for (i = 0; i < B_LOCAL; ++i) {
    b[i] = b0[i] = pseudo_random(&seed);
    b_grad[i] = pseudo_random(&seed);
  }

  /* ---- build: one AdamW group; w unsharded, b and e sharded over a mesh of 4 ---- */
  REQUIRE_OK(NULL, sa_optimizer_create(NULL, &opt));
  config.lr = 0.01;
  config.weight_decay = 0.01;
  REQUIRE_OK(opt, sa_optimizer_add_group(opt, &config, &group));
  CHECK(group == 0, "group %d", (int)group);

  w_tensor = make_f32_tensor(w, 2, w_shape);
  REQUIRE_OK(opt,
             sa_optimizer_add_param(opt, "layers.0.w", group, &w_tensor, NULL, NULL, &w_param));

  shard0.type = SA_PLACEMENT_SHARD;
  shard0.dim = 0;
  b_layout.ndim = 1;
  b_layout.global_shape = b_global;
  b_layout.mesh_ndim = 1;
  b_layout.mesh_shape = mesh_shape;
  b_layout.mesh_coord = b_coord;
  b_layout.placements = &shard0;
  b_tensor = make_f32_tensor(b, 1, b_shape);
  REQUIRE_OK(
      opt, sa_optimizer_add_param(opt, "layers.0.b", group, &b_tensor, &b_layout, NULL, &b_param));

  e_layout = b_layout;
  e_layout.global_shape = e_global;
  e_layout.mesh_coord = e_coord;
  e_tensor = make_f32_tensor(NULL, 1, e_shape); /* an empty shard may have no data */
  REQUIRE_OK(
      opt, sa_optimizer_add_param(opt, "layers.0.e", group, &e_tensor, &e_layout, NULL, &e_param));

  CHECK(sa_optimizer_num_params(opt) == 3, "%lld params", (long long)sa_optimizer_num_params(opt));
  REQUIRE_OK(opt, sa_optimizer_param_info(opt, b_param, &info));
  CHECK(info.ndim == 1 && info.global_shape[0] == B_GLOBAL && info.global_offset[0] == 2 &&
            info.local_shape[0] == B_LOCAL && info.master == SA_MASTER_NONE,
        "b: ndim %d, global %lld, offset %lld, local %lld, master %d", (int)info.ndim,
        (long long)info.global_shape[0], (long long)info.global_offset[0],
        (long long)info.local_shape[0], (int)info.master);
  REQUIRE_OK(opt, sa_optimizer_param_info(opt, e_param, &info));
  CHECK(info.numel == 0 && info.global_offset[0] == E_GLOBAL, "e: numel %lld, offset %lld",
        (long long)info.numel, (long long)info.global_offset[0]);
  REQUIRE_OK(opt, sa_optimizer_get_group(opt, group, &read_back));
  CHECK(read_back.lr == 0.01 && read_back.beta2 == 0.999 && read_back.decoupled_weight_decay == 1,
        "lr %g beta2 %g decoupled %d", read_back.lr, read_back.beta2,
        (int)read_back.decoupled_weight_decay);

  /* ---- error paths: specific status, a message, and nothing changed ---- */
  status = sa_optimizer_step(opt, NULL, NULL);
  CHECK(status == SA_ERR_STATE, "step without grads returned %s", sa_status_string(status));
  CHECK(sa_optimizer_last_error(opt)[0] != '\0', "no message for a step without grads");

  bad_tensor = make_f32_tensor(w, 2, w_shape);
  status = sa_optimizer_add_param(opt, NULL, group, &bad_tensor, NULL, NULL, &bad_param);
  CHECK(status == SA_ERR_INVALID_ARGUMENT, "NULL name returned %s", sa_status_string(status));
  CHECK(sa_optimizer_last_error(opt)[0] != '\0', "no message for a NULL name");
  status = sa_optimizer_add_param(opt, "layers.0.w", group, &bad_tensor, NULL, NULL, &bad_param);
  CHECK(status == SA_ERR_INVALID_ARGUMENT, "duplicate name returned %s", sa_status_string(status));
  CHECK(strstr(sa_optimizer_last_error(opt), "layers.0.w") != NULL,
        "the message does not name the param: '%s'", sa_optimizer_last_error(opt));
  CHECK(sa_optimizer_num_params(opt) == 3, "a failed add_param changed the count to %lld",
        (long long)sa_optimizer_num_params(opt));
  CHECK(g_deleter_calls == 0, "a failed add_param called the deleter (%d calls)", g_deleter_calls);

  w_grad_tensor = w_tensor.dl_tensor;
  w_grad_tensor.data = w_grad;
  w_grad_tensor.dtype.bits = 16;
  w_grad_tensor.dtype.code = kDLBfloat;
  status = sa_optimizer_set_grad(opt, w_param, &w_grad_tensor);
  CHECK(status == SA_ERR_MISMATCH, "a bfloat16 grad for a float32 param returned %s",
        sa_status_string(status));

  /* ---- step 1 against the float64 reference ---- */
  w_grad_tensor.dtype.bits = 32;
  w_grad_tensor.dtype.code = kDLFloat;
  REQUIRE_OK(opt, sa_optimizer_set_grad(opt, w_param, &w_grad_tensor));
  grad_ptrs[0] = w_grad; /* the fast path rebinds all three, NULL for the empty one */
  grad_ptrs[1] = b_grad;
  grad_ptrs[2] = NULL;
  REQUIRE_OK(opt, sa_optimizer_set_grad_ptrs(opt, 3, grad_ptrs));
  REQUIRE_OK(opt, sa_optimizer_step(opt, NULL, NULL));

  for (i = 0; i < W_N; ++i) {
    const double want = first_step_reference(w0[i], w_grad[i], &config);
    CHECK(close_to(w[i], want), "w[%d] = %.9g after step 1, reference %.9g", i, w[i], want);
  }
  for (i = 0; i < B_LOCAL; ++i) {
    const double want = first_step_reference(b0[i], b_grad[i], &config);
    CHECK(close_to(b[i], want), "b[%d] = %.9g after step 1, reference %.9g", i, b[i], want);
  }

  REQUIRE_OK(opt, sa_optimizer_state_view(opt, w_param, "exp_avg", &view));
  CHECK(view->dl_tensor.ndim == 2 && view->dl_tensor.shape[0] == W_ROWS &&
            view->dl_tensor.shape[1] == W_COLS && view->dl_tensor.dtype.code == kDLFloat &&
            view->dl_tensor.dtype.bits == 32,
        "exp_avg view has the wrong shape or dtype");
  for (i = 0; i < W_N; ++i) {
    const float m = ((const float*)view->dl_tensor.data)[i];
    const double want = (1.0 - config.beta1) * w_grad[i];
    CHECK(close_to(m, want), "exp_avg[%d] = %.9g, reference %.9g", i, m, want);
  }
  view->deleter(view);
  view = NULL;
  status = sa_optimizer_state_view(opt, w_param, "master", &view);
  CHECK(status == SA_ERR_INVALID_ARGUMENT && view == NULL,
        "a float32 param without master weights gave a 'master' view (%s)",
        sa_status_string(status));

  /* ---- more steps with the same grads: every element keeps moving downhill ---- */
  for (s = 1; s < STEPS; ++s) REQUIRE_OK(opt, sa_optimizer_step(opt, NULL, NULL));
  REQUIRE_OK(opt, sa_optimizer_get_step(opt, group, &step_count));
  CHECK(step_count == STEPS, "step count %lld, expected %d", (long long)step_count, STEPS);
  for (i = 0; i < W_N; ++i)
    CHECK((w[i] - w0[i]) * w_grad[i] < 0.0f, "w[%d] moved from %g to %g with grad %g", i, w0[i],
          w[i], w_grad[i]);
  for (i = 0; i < B_LOCAL; ++i)
    CHECK((b[i] - b0[i]) * b_grad[i] < 0.0f, "b[%d] moved from %g to %g with grad %g", i, b0[i],
          b[i], b_grad[i]);

  /* ---- shard files from C: export to memory, import back, inspect ---- */
  {
    sa_writer writer = SA_WRITER_INIT;
    sa_reader reader = SA_READER_INIT;
    const sa_reader* readers[1];
    sa_import_options options = SA_IMPORT_OPTIONS_INIT;
    const void* blob = NULL;
    size_t blob_size = 0;
    char* report = NULL;
    REQUIRE_OK(NULL, sa_memory_writer(&writer));
    REQUIRE_OK(opt, sa_optimizer_export(opt, &writer));
    REQUIRE_OK(NULL, sa_memory_writer_data(&writer, &blob, &blob_size));
    CHECK(blob_size > 8, "the export wrote %zu bytes", blob_size);
    REQUIRE_OK(NULL, sa_memory_reader(blob, blob_size, &reader));
    readers[0] = &reader;
    options.staging_bytes = 1u << 20;
    /* One rank's file: sound, but it does not cover the sharded bias on its own, so the
     * import refuses it (every file of a checkpoint must be given) and changes nothing. */
    status = sa_optimizer_import(opt, 1, readers, &options);
    CHECK(status == SA_ERR_MISMATCH &&
              strstr(sa_optimizer_last_error(opt), "param 'layers.0.b'") != NULL &&
              strstr(sa_optimizer_last_error(opt), "do not cover its global shape [7]") != NULL,
          "import of one rank's file: %s: %s", sa_status_string(status),
          sa_optimizer_last_error(opt));
    REQUIRE_OK(NULL, sa_inspect(1, readers, 1, &report));
    CHECK(report != NULL && strstr(report, "\"checksums\": \"ok\"") != NULL &&
              strstr(report, "\"coverage\": \"gap\"") != NULL,
          "inspect said: %s", report ? report : "(null)");
    sa_free(report);
    sa_reader_release(&reader);
    sa_writer_release(&writer);
    REQUIRE_OK(opt, sa_optimizer_get_step(opt, group, &step_count));
    CHECK(step_count == STEPS, "after the refused import the step count is %lld",
          (long long)step_count);
  }

  /* ---- destroy: the optimizer calls the deleter of each shard it owns, once ---- */
  sa_optimizer_destroy(opt);
  CHECK(g_deleter_calls == 3, "destroy made %d deleter calls, expected 3", g_deleter_calls);

  status = sa_optimizer_create(NULL, NULL);
  CHECK(status == SA_ERR_INVALID_ARGUMENT && sa_last_error()[0] != '\0',
        "create with a NULL out returned %s, message '%s'", sa_status_string(status),
        sa_last_error());

  if (g_failures > 0) {
    fprintf(stderr, "test_c_abi: %d check(s) failed\n", g_failures);
    return 1;
  }
  printf("test_c_abi: all checks passed (%d steps)\n", STEPS);
  return 0;
}
