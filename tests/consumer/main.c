/* The consumer's C program: the loaded library matches the installed header, and one
 * step moves a param against its grad. Exits nonzero with a message otherwise. */
#include <shardadam/shardadam.h>
#include <stdio.h>
#include <string.h>

static void no_deleter(DLManagedTensorVersioned* self) { (void)self; }

int main(void) {
  float param[4] = {1.0f, -1.0f, 0.5f, -0.5f};
  float before[4];
  float grad[4] = {0.5f, 0.5f, -0.5f, -0.5f};
  int64_t shape[1] = {4};
  DLManagedTensorVersioned shard = {{DLPACK_MAJOR_VERSION, DLPACK_MINOR_VERSION},
                                    NULL,
                                    no_deleter,
                                    0,
                                    {param, {kDLCPU, 0}, 1, {kDLFloat, 32, 1}, shape, NULL, 0}};
  const void* grads[1] = {grad};
  sa_optimizer* opt = NULL;
  sa_group_config config = SA_GROUP_CONFIG_INIT;
  int32_t group = -1;
  int64_t index = -1;
  int i;

  memcpy(before, param, sizeof param);
  if (sa_version() != SA_VERSION_NUMBER) {
    fprintf(stderr, "consumer_c: library version %d != header version %d\n", sa_version(),
            SA_VERSION_NUMBER);
    return 1;
  }
  if (sa_optimizer_create(NULL, &opt) != SA_OK) {
    fprintf(stderr, "consumer_c: create failed: %s\n", sa_last_error());
    return 1;
  }
  config.lr = 0.1;
  if (sa_optimizer_add_group(opt, &config, &group) != SA_OK ||
      sa_optimizer_add_param(opt, "w", group, &shard, NULL, NULL, &index) != SA_OK ||
      sa_optimizer_set_grad_ptrs(opt, 1, grads) != SA_OK ||
      sa_optimizer_step(opt, NULL, NULL) != SA_OK) {
    fprintf(stderr, "consumer_c: %s\n", sa_optimizer_last_error(opt));
    sa_optimizer_destroy(opt);
    return 1;
  }
  sa_optimizer_destroy(opt);
  for (i = 0; i < 4; ++i) {
    if ((param[i] - before[i]) * grad[i] >= 0.0f) {
      fprintf(stderr, "consumer_c: param[%d] went from %g to %g with grad %g\n", i, before[i],
              param[i], grad[i]);
      return 1;
    }
  }
  printf("consumer_c: %s; one step OK\n", sa_build_info());
  return 0;
}
