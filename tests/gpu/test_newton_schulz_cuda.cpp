// tests/gpu/test_newton_schulz_cuda.cpp — kernels/cuda/newton_schulz.cuh (bfloat16 GEMMs on
// cuBLAS) against the float64 Newton-Schulz of tests/newton_schulz_reference.hpp, at
// bfloat16's tolerance, and run twice to the same bits.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <random>
#include <utility>
#include <vector>

#include "gpu/cuda_test_support.hpp"
#include "kernels/cuda/newton_schulz.cuh"
#include "newton_schulz_reference.hpp"

namespace {

// x orthogonalized on the GPU.
std::vector<float> on_gpu(cublasHandle_t blas, const std::vector<float>& x, int64_t rows,
                          int64_t cols, const sa::kernels::NewtonSchulz& ns) {
  float* dx = nullptr;
  void* work = nullptr;
  CUDA_OK(cudaMalloc(&dx, x.size() * sizeof(float)));
  CUDA_OK(cudaMalloc(&work, sa::kernels::newton_schulz_cuda_work_bytes(rows, cols)));
  CUDA_OK(cudaMemcpy(dx, x.data(), x.size() * sizeof(float), cudaMemcpyHostToDevice));
  const sa::kernels::NsStatus st = sa::kernels::newton_schulz_cuda(blas, dx, rows, cols, ns, work, nullptr);
  INFO("cuda " << cudaGetErrorString(st.cuda) << ", cublas " << static_cast<int>(st.blas));
  REQUIRE(st.ok());
  std::vector<float> out(x.size());
  CUDA_OK(cudaMemcpy(out.data(), dx, out.size() * sizeof(float), cudaMemcpyDeviceToHost));
  CUDA_OK(cudaFree(dx));
  CUDA_OK(cudaFree(work));
  return out;
}

}  // namespace

TEST_CASE("Newton-Schulz on cuBLAS (bfloat16) matches a float64 reference: wide, tall, square",
          "[newton_schulz]") {
  cublasHandle_t blas = nullptr;
  REQUIRE(cublasCreate(&blas) == CUBLAS_STATUS_SUCCESS);
  const auto [rows, cols] =
      GENERATE(std::pair<int64_t, int64_t>{8, 24}, std::pair<int64_t, int64_t>{24, 8},
               std::pair<int64_t, int64_t>{17, 17}, std::pair<int64_t, int64_t>{1, 9},
               std::pair<int64_t, int64_t>{9, 1}, std::pair<int64_t, int64_t>{64, 160});
  const int32_t steps = GENERATE(1, 5, 8);
  CAPTURE(rows, cols, steps);
  std::mt19937 rng(static_cast<unsigned>(rows * 1000 + cols * 10 + steps));
  std::normal_distribution<float> normal(0.0f, 0.02f);
  std::vector<float> g(static_cast<std::size_t>(rows * cols));
  for (float& v : g) v = normal(rng);
  sa::kernels::NewtonSchulz ns;
  ns.steps = steps;
  const std::vector<float> got = on_gpu(blas, g, rows, cols, ns);
  const sa::test::Matrix want = sa::test::ns_reference(sa::test::Matrix(g.begin(), g.end()), rows, cols, ns);
  double worst = 0.0, mean = 0.0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double e = std::abs(got[i] - want[i]);
    worst = std::max(worst, e);
    mean += e / static_cast<double>(got.size());
  }
  CAPTURE(worst, mean);
  // bfloat16 keeps 8 significant bits: values of order 1 are off by up to ~2^-8 per
  // rounding, and the iteration rounds X, A and B at every step.
  CHECK(worst < 0.06);
  CHECK(mean < 0.01);
  CHECK(on_gpu(blas, g, rows, cols, ns) == got);  // deterministic
  cublasDestroy(blas);
}
