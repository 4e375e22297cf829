/*
 * test_backend_module.c — the library finds its CUDA backend module
 * (libshardadam-cuda.so) at run time, says so in sa_build_info(), and fails clearly when
 * the module is missing or is not one. Run by ctest in four ways (tests/CMakeLists.txt):
 *
 *   test_backend_module found     a build with CUDA, the module beside the library: it
 *                                 loads, and an error raised inside it (an NCCL
 *                                 communicator of 0 ranks, a CUDA shard on a machine
 *                                 without a GPU) reaches the caller as a status and text
 *   test_backend_module missing   $SHARDADAM_CUDA_MODULE names no file: CUDA shards and
 *                                 NCCL are SA_ERR_UNSUPPORTED, and the text says why
 *   test_backend_module foreign   $SHARDADAM_CUDA_MODULE names a library that is no module
 *   test_backend_module stale     $SHARDADAM_CUDA_MODULE names a module of another Backend
 *                                 interface (tests/stale_cuda_module.cpp)
 *   test_backend_module not_built a build without CUDA
 *   test_backend_module no_nccl   a build with NCCL, but $SHARDADAM_NCCL_LIBRARY names no
 *                                 file: the module still loads (NCCL is loaded on first
 *                                 use, not linked), and only a communicator fails, saying why
 *
 * CPU optimizers work in every case. Needs no GPU.
 */
#include <stdio.h>
#include <string.h>

#include "c_check.h"
#include "shardadam/shardadam.h"


static void no_delete(DLManagedTensorVersioned* self) { (void)self; }

/* Adds a 4-element float32 shard on `device_type` to a fresh optimizer; returns the status
 * and copies the optimizer's error text into `text`. */
static sa_status add_shard(DLDeviceType device_type, float* data, char* text, size_t text_size) {
  sa_optimizer* opt = NULL;
  const sa_optimizer_config config = SA_OPTIMIZER_CONFIG_INIT;
  if (sa_optimizer_create(&config, &opt) != SA_OK) {
    snprintf(text, text_size, "sa_optimizer_create: %s", sa_last_error());
    return SA_ERR_INTERNAL;
  }
  const sa_group_config group = SA_GROUP_CONFIG_INIT;
  sa_status status = sa_optimizer_add_group(opt, &group, NULL);
  int64_t shape[1] = {4};
  DLManagedTensorVersioned t;
  memset(&t, 0, sizeof t);
  t.version.major = DLPACK_MAJOR_VERSION;
  t.version.minor = DLPACK_MINOR_VERSION;
  t.deleter = no_delete;
  t.dl_tensor.data = data;
  t.dl_tensor.device.device_type = device_type;
  t.dl_tensor.ndim = 1;
  t.dl_tensor.dtype.code = kDLFloat;
  t.dl_tensor.dtype.bits = 32;
  t.dl_tensor.dtype.lanes = 1;
  t.dl_tensor.shape = shape;
  if (status == SA_OK) status = sa_optimizer_add_param(opt, "w", 0, &t, NULL, NULL, NULL);
  snprintf(text, text_size, "%s", status == SA_OK ? "" : sa_optimizer_last_error(opt));
  sa_optimizer_destroy(opt);
  return status;
}

/* sa_comm_create_nccl with 0 ranks: the module refuses it (SA_ERR_INVALID_ARGUMENT) or,
 * without a module, the library does (SA_ERR_UNSUPPORTED). */
static sa_status nccl_zero_ranks(char* text, size_t text_size) {
  sa_nccl_unique_id id;
  memset(&id, 0, sizeof id);
  sa_comm* comm = NULL;
  const sa_status status = sa_comm_create_nccl(&id, 0, 0, 0, &comm);
  snprintf(text, text_size, "%s", status == SA_OK ? "" : sa_last_error());
  if (comm != NULL) sa_comm_destroy(comm);
  return status;
}

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s found|missing|foreign|stale|not_built|no_nccl\n", argv[0]);
    return 2;
  }
  const char* mode = argv[1];
  const char* info = sa_build_info();
  printf("%s: %s\n", mode, info);
  float data[4] = {1.0f, 2.0f, 3.0f, 4.0f};
  char text[1024];

  /* The CPU backend never needs the module. */
  CHECK(add_shard(kDLCPU, data, text, sizeof text) == SA_OK, "cpu shard: %s", text);

  if (strcmp(mode, "no_nccl") == 0) {
    CHECK(strstr(info, "cuda: module ") != NULL, "build info '%s': the module did not load", info);
    sa_nccl_unique_id id;
    const sa_status status = sa_nccl_unique_id_create(&id);
    snprintf(text, sizeof text, "%s", status == SA_OK ? "" : sa_last_error());
    CHECK(status == SA_ERR_UNSUPPORTED && strstr(text, "SHARDADAM_NCCL_LIBRARY") != NULL &&
              strstr(text, "no-such-nccl.so") != NULL,
          "unique id without NCCL: %s: %s", sa_status_string(status), text);
    printf("  unique id: %s\n", text);
  } else if (strcmp(mode, "found") == 0) {
    CHECK(strstr(info, "cuda: module ") != NULL && strstr(info, "libshardadam-cuda.so") != NULL,
          "build info '%s' does not name the module", info);
    /* Thrown inside the module, caught in the library. */
    const sa_status nccl = nccl_zero_ranks(text, sizeof text);
    if (strstr(info, "nccl: built") != NULL) {
      CHECK(nccl == SA_ERR_INVALID_ARGUMENT && strstr(text, "nranks is 0") != NULL,
            "NCCL with 0 ranks: %s: %s", sa_status_string(nccl), text);
    } else {
      CHECK(nccl == SA_ERR_UNSUPPORTED, "NCCL without NCCL: %s: %s", sa_status_string(nccl), text);
    }
    /* On a machine without a GPU the module's backend cannot start: a device error that
     * names the device. (With a GPU the shard's pointer is never read: no step runs.) */
    const sa_status cuda = add_shard(kDLCUDA, data, text, sizeof text);
    CHECK(cuda == SA_OK || (cuda == SA_ERR_DEVICE && strstr(text, "cuda:0") != NULL),
          "cuda shard: %s: %s", sa_status_string(cuda), text);
    printf("  cuda shard: %s %s\n", sa_status_string(cuda), text);
  } else {
    const char* why = strcmp(mode, "missing") == 0   ? "cannot load"
                      : strcmp(mode, "foreign") == 0 ? "has no sa_cuda_module_v1"
                      : strcmp(mode, "stale") == 0   ? "implements backend interface"
                                                     : "cuda: not built";
    CHECK(strstr(info, why) != NULL, "build info '%s' does not say '%s'", info, why);
    CHECK(strstr(info, "nccl: not available") != NULL, "build info '%s'", info);
    const sa_status cuda = add_shard(kDLCUDA, data, text, sizeof text);
    CHECK(cuda == SA_ERR_UNSUPPORTED && strstr(text, "no CUDA backend") != NULL &&
              strstr(text, strcmp(mode, "not_built") == 0 ? "not built" : why) != NULL,
          "cuda shard: %s: %s", sa_status_string(cuda), text);
    printf("  cuda shard: %s\n", text);
    const sa_status nccl = nccl_zero_ranks(text, sizeof text);
    CHECK(nccl == SA_ERR_UNSUPPORTED && strstr(text, "CUDA backend module") != NULL,
          "NCCL without a module: %s: %s", sa_status_string(nccl), text);
  }
  if (g_failures) fprintf(stderr, "%d check(s) failed\n", g_failures);
  return g_failures ? 1 : 0;
}
