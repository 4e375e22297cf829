/*
 * train_sharded.c — trains a small MLP whose parameters are sharded across 4 simulated
 * ranks, the way FSDP/ZeRO shard them: each rank holds the rows Shard(0) of a mesh of 4
 * gives it, and its own shardadam optimizer updates only those rows.
 *
 * One process plays all 4 ranks. Each step it
 *   1. all-gathers: copies every rank's shard into the full parameters,
 *   2. runs forward and backward on the whole batch (full grads),
 *   3. steps the 4 optimizers; each reads its rows of the full grads in place (the grad
 *      buffers never move, so each rank binds its grad pointers once, before training).
 *
 * The model is y = W2 tanh(W1 x + b1) + b2 with 16 inputs, 250 hidden units and 3
 * outputs (about 5,000 params), fitted to a fixed random "teacher" MLP. Under a mesh of
 * 4, torch.chunk splits W1's 250 rows as 63, 63, 63, 61 and W2's 3 rows as 1, 1, 1, 0:
 * rank 3 holds an empty shard of W2 and of b2, and still takes part in every step.
 *
 * Exits nonzero if a call fails or the final loss is not below 5% of the initial loss.
 * scripts/demo builds and runs it; README.md ("Quick start: C") builds it against an
 * install with pkg-config, adding -lm for the libm this file uses (the docs_readme_c test).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shardadam/shardadam.h"

#define RANKS 4
#define INPUTS 16
#define HIDDEN 250
#define OUTPUTS 3
#define TEACHER_HIDDEN 32
#define SAMPLES 256
#define STEPS 600
#define PRINT_EVERY 50
#define NUM_PARAMS 4

/* ---- the model, unsharded: what the all-gather produces and backward consumes ---- */

typedef struct Param {
  const char* name;
  int32_t ndim;
  int64_t shape[2]; /* global shape */
  int64_t row_size; /* elements per row (dim 0) */
  int32_t group;    /* 0: weights (decayed), 1: biases */
  float* full;      /* [shape] gathered values */
  float* grad;      /* [shape] full grad, a stable buffer */
} Param;

/* One rank's shard of one param: a DLPack tensor the rank's optimizer owns once added. */
typedef struct Shard {
  DLManagedTensorVersioned managed; /* first, so the deleter can free the whole block */
  int64_t shape[2];
  int64_t first_row; /* global offset along dim 0 */
  int64_t rows;
  float data[]; /* rows * row_size floats */
} Shard;

/* The deleter the optimizer calls when it is destroyed: the rank owns nothing after
 * handing the shard over, as DLPack defines it. */
static void free_shard(DLManagedTensorVersioned* self) { free(self->manager_ctx); }

static void die(const char* what, const char* message) {
  fprintf(stderr, "train_sharded: %s: %s\n", what, message);
  exit(1);
}

#define CALL(opt, call)                                            \
  do {                                                             \
    if ((call) != SA_OK) die(#call, sa_optimizer_last_error(opt)); \
  } while (0)

static unsigned long long g_seed = 0x5eed5eedULL;

static float uniform(float lo, float hi) {
  g_seed = g_seed * 6364136223846793005ULL + 1442695040888963407ULL;
  return lo + (hi - lo) * (float)((g_seed >> 40) & 0xffffffULL) / 16777215.0f;
}

/* y[s][o] = sum_h w2[o][h] tanh(sum_i w1[h][i] x[s][i] + b1[h]) + b2[o]; keeps the
 * activations (for backward) when `act` is not NULL. */
static void mlp_forward(int hidden, const float* w1, const float* b1, const float* w2,
                        const float* b2, const float* x, float* y, float* act) {
  int s, h, i, o;
  for (s = 0; s < SAMPLES; ++s) {
    double out[OUTPUTS];
    for (o = 0; o < OUTPUTS; ++o) out[o] = b2[o];
    for (h = 0; h < hidden; ++h) {
      double pre = b1[h];
      float a;
      for (i = 0; i < INPUTS; ++i) pre += (double)w1[h * INPUTS + i] * x[s * INPUTS + i];
      a = (float)tanh(pre);
      if (act) act[s * hidden + h] = a;
      for (o = 0; o < OUTPUTS; ++o) out[o] += (double)w2[o * hidden + h] * a;
    }
    for (o = 0; o < OUTPUTS; ++o) y[s * OUTPUTS + o] = (float)out[o];
  }
}

/* Mean squared error over the batch; writes the full grads of all four params. */
static double loss_and_grads(Param* p, const float* x, const float* target, float* y, float* act) {
  static double d_act[HIDDEN];
  double loss = 0.0;
  const double scale = 2.0 / (SAMPLES * OUTPUTS);
  int s, h, i, o;
  float *gw1 = p[0].grad, *gb1 = p[1].grad, *gw2 = p[2].grad, *gb2 = p[3].grad;

  mlp_forward(HIDDEN, p[0].full, p[1].full, p[2].full, p[3].full, x, y, act);
  memset(gw1, 0, sizeof(float) * HIDDEN * INPUTS);
  memset(gb1, 0, sizeof(float) * HIDDEN);
  memset(gw2, 0, sizeof(float) * OUTPUTS * HIDDEN);
  memset(gb2, 0, sizeof(float) * OUTPUTS);
  for (s = 0; s < SAMPLES; ++s) {
    for (h = 0; h < HIDDEN; ++h) d_act[h] = 0.0;
    for (o = 0; o < OUTPUTS; ++o) {
      const double diff = (double)y[s * OUTPUTS + o] - target[s * OUTPUTS + o];
      const double dy = scale * diff;
      loss += diff * diff;
      gb2[o] += (float)dy;
      for (h = 0; h < HIDDEN; ++h) {
        gw2[o * HIDDEN + h] += (float)(dy * act[s * HIDDEN + h]);
        d_act[h] += dy * p[2].full[o * HIDDEN + h];
      }
    }
    for (h = 0; h < HIDDEN; ++h) {
      const double a = act[s * HIDDEN + h];
      const double d_pre = d_act[h] * (1.0 - a * a);
      gb1[h] += (float)d_pre;
      for (i = 0; i < INPUTS; ++i) gw1[h * INPUTS + i] += (float)(d_pre * x[s * INPUTS + i]);
    }
  }
  return loss / (SAMPLES * OUTPUTS);
}

int main(void) {
  static float x[SAMPLES * INPUTS], target[SAMPLES * OUTPUTS], y[SAMPLES * OUTPUTS];
  static float act[SAMPLES * HIDDEN];
  static float teacher_w1[TEACHER_HIDDEN * INPUTS], teacher_b1[TEACHER_HIDDEN];
  static float teacher_w2[OUTPUTS * TEACHER_HIDDEN], teacher_b2[OUTPUTS];
  Param params[NUM_PARAMS] = {
      {"mlp.w1", 2, {HIDDEN, INPUTS}, INPUTS, 0, NULL, NULL},
      {"mlp.b1", 1, {HIDDEN, 1}, 1, 1, NULL, NULL},
      {"mlp.w2", 2, {OUTPUTS, HIDDEN}, HIDDEN, 0, NULL, NULL},
      {"mlp.b2", 1, {OUTPUTS, 1}, 1, 1, NULL, NULL},
  };
  sa_optimizer* ranks[RANKS];
  Shard* shards[RANKS][NUM_PARAMS];
  const double base_lr = 0.01;
  double first_loss = 0.0, loss = 0.0;
  int r, k, i, step;

  if (sa_version() != SA_VERSION_NUMBER) die("sa_version", "the library does not match the header");
  printf("%s\n", sa_build_info());

  /* ---- data: a random teacher MLP labels random inputs ---- */
  for (i = 0; i < SAMPLES * INPUTS; ++i) x[i] = uniform(-1.0f, 1.0f);
  for (i = 0; i < TEACHER_HIDDEN * INPUTS; ++i) teacher_w1[i] = uniform(-0.8f, 0.8f);
  for (i = 0; i < TEACHER_HIDDEN; ++i) teacher_b1[i] = uniform(-0.5f, 0.5f);
  for (i = 0; i < OUTPUTS * TEACHER_HIDDEN; ++i) teacher_w2[i] = uniform(-0.5f, 0.5f);
  for (i = 0; i < OUTPUTS; ++i) teacher_b2[i] = uniform(-0.5f, 0.5f);
  mlp_forward(TEACHER_HIDDEN, teacher_w1, teacher_b1, teacher_w2, teacher_b2, x, target, NULL);

  /* ---- full params (initial values) and their stable grad buffers ---- */
  for (k = 0; k < NUM_PARAMS; ++k) {
    Param* p = &params[k];
    const int64_t n = p->shape[0] * p->row_size;
    const float bound = p->group == 0 ? 1.0f / sqrtf((float)p->row_size) : 0.0f;
    p->full = malloc(sizeof(float) * (size_t)n);
    p->grad = malloc(sizeof(float) * (size_t)n);
    if (!p->full || !p->grad) die("malloc", "out of memory");
    for (i = 0; i < n; ++i) p->full[i] = uniform(-bound, bound);
  }

  /* ---- each rank: an optimizer with the same two groups, and its shard of every param ---- */
  for (r = 0; r < RANKS; ++r) {
    sa_group_config weights = SA_GROUP_CONFIG_INIT, biases = SA_GROUP_CONFIG_INIT;
    const void* grad_ptrs[NUM_PARAMS];
    int32_t group;
    CALL(NULL, sa_optimizer_create(NULL, &ranks[r]));
    weights.lr = base_lr;
    weights.weight_decay = 1e-4;
    biases.lr = base_lr;
    biases.weight_decay = 0.0;
    /* Groups are positional: every rank creates both, even where one is locally empty. */
    CALL(ranks[r], sa_optimizer_add_group(ranks[r], &weights, &group));
    CALL(ranks[r], sa_optimizer_add_group(ranks[r], &biases, &group));

    for (k = 0; k < NUM_PARAMS; ++k) {
      Param* p = &params[k];
      const int64_t mesh_shape[1] = {RANKS};
      const int64_t mesh_coord[1] = {r};
      sa_placement shard0;
      sa_layout layout = SA_LAYOUT_INIT;
      int64_t local_shape[2], global_offset[2], index;
      Shard* s;
      shard0.type = SA_PLACEMENT_SHARD;
      shard0.dim = 0;
      layout.ndim = p->ndim;
      layout.global_shape = p->shape;
      layout.mesh_ndim = 1;
      layout.mesh_shape = mesh_shape;
      layout.mesh_coord = mesh_coord;
      layout.placements = &shard0;
      /* The rank's box, as the optimizer will compute it from the same layout. */
      CALL(NULL, sa_layout_local_box(&layout, local_shape, global_offset));

      s = malloc(sizeof(Shard) + sizeof(float) * (size_t)(local_shape[0] * p->row_size));
      if (!s) die("malloc", "out of memory");
      s->first_row = global_offset[0];
      s->rows = local_shape[0];
      s->shape[0] = local_shape[0];
      s->shape[1] = p->ndim == 2 ? local_shape[1] : 0;
      memcpy(s->data, p->full + s->first_row * p->row_size,
             sizeof(float) * (size_t)(s->rows * p->row_size));
      memset(&s->managed, 0, sizeof s->managed);
      s->managed.version.major = DLPACK_MAJOR_VERSION;
      s->managed.version.minor = DLPACK_MINOR_VERSION;
      s->managed.manager_ctx = s;
      s->managed.deleter = free_shard;
      s->managed.dl_tensor.data = s->data;
      s->managed.dl_tensor.device.device_type = kDLCPU;
      s->managed.dl_tensor.ndim = p->ndim;
      s->managed.dl_tensor.dtype.code = kDLFloat;
      s->managed.dl_tensor.dtype.bits = 32;
      s->managed.dl_tensor.dtype.lanes = 1;
      s->managed.dl_tensor.shape = s->shape;
      shards[r][k] = s;
      CALL(ranks[r],
           sa_optimizer_add_param(ranks[r], p->name, p->group, &s->managed, &layout, NULL, &index));
      /* Shard(0) rows are contiguous in the full grad: the rank reads them in place. An
       * empty shard needs no pointer. */
      grad_ptrs[k] = s->rows > 0 ? p->grad + s->first_row * p->row_size : NULL;
    }
    CALL(ranks[r], sa_optimizer_set_grad_ptrs(ranks[r], NUM_PARAMS, grad_ptrs));
  }

  for (k = 0; k < NUM_PARAMS; ++k) {
    printf("%-7s [%3lld x %3lld] rows per rank:", params[k].name, (long long)params[k].shape[0],
           (long long)(params[k].ndim == 2 ? params[k].shape[1] : 1));
    for (r = 0; r < RANKS; ++r)
      printf(" %lld..%lld", (long long)shards[r][k]->first_row,
             (long long)(shards[r][k]->first_row + shards[r][k]->rows));
    printf("\n");
  }

  /* ---- training ---- */
  for (step = 0; step <= STEPS; ++step) {
    /* 1. all-gather: the ranks' shards together are the model. */
    for (k = 0; k < NUM_PARAMS; ++k)
      for (r = 0; r < RANKS; ++r) {
        const Shard* s = shards[r][k];
        memcpy(params[k].full + s->first_row * params[k].row_size, s->data,
               sizeof(float) * (size_t)(s->rows * params[k].row_size));
      }
    /* 2. forward and backward into the stable grad buffers. */
    loss = loss_and_grads(params, x, target, y, act);
    if (step == 0) first_loss = loss;
    if (step % PRINT_EVERY == 0) printf("step %4d  loss %.6f\n", step, loss);
    if (step == STEPS) break;
    /* 3. each rank steps its shard; a cosine schedule sets both groups' lr. */
    for (r = 0; r < RANKS; ++r) {
      const double lr = base_lr * 0.5 * (1.0 + cos(3.14159265358979 * step / STEPS));
      CALL(ranks[r], sa_optimizer_set_lr(ranks[r], 0, lr));
      CALL(ranks[r], sa_optimizer_set_lr(ranks[r], 1, lr));
      CALL(ranks[r], sa_optimizer_step(ranks[r], NULL, NULL));
    }
  }

  /* Destroying an optimizer calls free_shard on each shard it owns. */
  for (r = 0; r < RANKS; ++r) sa_optimizer_destroy(ranks[r]);
  for (k = 0; k < NUM_PARAMS; ++k) {
    free(params[k].full);
    free(params[k].grad);
  }

  printf("loss %.6f -> %.6f (%.3f%% of the initial loss)\n", first_loss, loss,
         100.0 * loss / first_loss);
  if (!(loss < 0.05 * first_loss)) {
    fprintf(stderr, "train_sharded: the loss did not fall below 5%% of its initial value\n");
    return 1;
  }
  return 0;
}
