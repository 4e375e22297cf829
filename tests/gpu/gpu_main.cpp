// tests/gpu/gpu_main.cpp — the GPU test binary's entry: without a usable CUDA device it
// says so and exits 77, which CTest reports as "Skipped" (SKIP_RETURN_CODE).
#define CATCH_CONFIG_RUNNER
#include <cuda_runtime.h>

#include <catch2/catch.hpp>
#include <cstdio>

int main(int argc, char** argv) {
  int devices = 0;
  const cudaError_t status = cudaGetDeviceCount(&devices);
  if (status != cudaSuccess || devices == 0) {
    std::printf("SKIPPED: no usable CUDA device (%s); GPU tests did not run\n",
                status != cudaSuccess ? cudaGetErrorString(status) : "0 devices");
    return 77;
  }
  return Catch::Session().run(argc, argv);
}
