// tests/gpu/test_newton_schulz_cuda.cpp — kernels/cuda/newton_schulz.cuh (bfloat16 GEMMs on
// cuBLAS) against the float64 Newton-Schulz of tests/muon_reference.hpp, at
// bfloat16's tolerance, and run twice to the same bits.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <random>
#include <utility>
#include <vector>

#include <thread>

#include "gpu/cuda_test_support.hpp"
#include "kernels/cuda/muon_cuda.cuh"
#include "kernels/cuda/newton_schulz.cuh"
#include "muon_reference.hpp"
#include "test_thread_comm.hpp"

namespace {

// The cuBLAS these tests link, as the kernels take it (the CUDA module loads one).
const sa::kernels::CublasCalls kCublas{&cublasSetStream_v2, &cublasGemmEx};

// x orthogonalized on the GPU.
std::vector<float> on_gpu(cublasHandle_t blas, const std::vector<float>& x, int64_t rows,
                          int64_t cols, const sa::kernels::NewtonSchulz& ns) {
  float* dx = nullptr;
  void* work = nullptr;
  CUDA_OK(cudaMalloc(&dx, x.size() * sizeof(float)));
  CUDA_OK(cudaMalloc(&work, sa::kernels::newton_schulz_cuda_work_bytes(rows, cols)));
  CUDA_OK(cudaMemcpy(dx, x.data(), x.size() * sizeof(float), cudaMemcpyHostToDevice));
  const sa::kernels::NsStatus st = sa::kernels::newton_schulz_cuda(kCublas, blas, dx, rows, cols, ns, work, nullptr);
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
  const std::vector<float> g = sa::test::random_matrix(
      rows, cols, static_cast<unsigned>(rows * 1000 + cols * 10 + steps), 0.02f);
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

TEST_CASE("A Muon matrix step on the GPU matches a float64 Muon over several steps", "[muon]") {
  cublasHandle_t blas = nullptr;
  REQUIRE(cublasCreate(&blas) == CUBLAS_STATUS_SUCCESS);
  const auto [rows, cols] =
      GENERATE(std::pair<int64_t, int64_t>{12, 40}, std::pair<int64_t, int64_t>{40, 12});
  const bool nesterov = GENERATE(true, false);
  CAPTURE(rows, cols, nesterov);
  sa::kernels::MuonHyper h;
  h.lr = 0.02;
  h.momentum = 0.9;
  h.nesterov = nesterov;
  const std::size_t n = static_cast<std::size_t>(rows * cols);
  const unsigned seed = static_cast<unsigned>(rows + 7 * cols + (nesterov ? 1 : 0));
  const std::vector<float> p = sa::test::random_matrix(rows, cols, seed, 1.0f);
  sa::test::Matrix p64(p.begin(), p.end()), buf64(n, 0.0);
  float *dp = nullptr, *dg = nullptr, *dbuf = nullptr;
  void* work = nullptr;
  CUDA_OK(cudaMalloc(&dp, n * sizeof(float)));
  CUDA_OK(cudaMalloc(&dg, n * sizeof(float)));
  CUDA_OK(cudaMalloc(&dbuf, n * sizeof(float)));
  CUDA_OK(cudaMalloc(&work, sa::kernels::muon_cuda_work_bytes(rows, cols)));
  CUDA_OK(cudaMemcpy(dp, p.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemset(dbuf, 0, n * sizeof(float)));
  for (int step = 0; step < 3; ++step) {
    const std::vector<float> g = sa::test::random_matrix(rows, cols, seed + 100 + step, 0.01f);
    CUDA_OK(cudaMemcpy(dg, g.data(), n * sizeof(float), cudaMemcpyHostToDevice));
    const sa::kernels::NsStatus st =
        sa::kernels::muon_matrix_cuda(kCublas, blas, dp, dg, dbuf, rows, cols, h, nullptr, work,
                                      nullptr);
    REQUIRE(st.ok());
    sa::test::muon_reference(p64, sa::test::Matrix(g.begin(), g.end()), buf64, rows, cols, h);
  }
  std::vector<float> got(n), buf(n);
  CUDA_OK(cudaMemcpy(got.data(), dp, n * sizeof(float), cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(buf.data(), dbuf, n * sizeof(float), cudaMemcpyDeviceToHost));
  double worst_p = 0.0, worst_buf = 0.0, moved = 0.0;
  for (std::size_t i = 0; i < n; ++i) {
    worst_p = std::max(worst_p, std::abs(got[i] - p64[i]));
    worst_buf = std::max(worst_buf, std::abs(buf[i] - buf64[i]));
    moved = std::max(moved, std::abs(p64[i] - p[i]));
  }
  CAPTURE(worst_p, worst_buf, moved);
  CHECK(worst_buf < 1e-6);  // float32, as the CPU's
  // The orthogonalized direction is bfloat16's (~1e-2 of values of order 1), times lr
  // 0.02 (and the adjustment, <= 1.9 here) per step.
  CHECK(worst_p < 3 * 0.02 * 1.9 * 0.06);
  CHECK(moved > 0.01);
  for (void* ptr : {static_cast<void*>(dp), static_cast<void*>(dg), static_cast<void*>(dbuf), work})
    CUDA_OK(cudaFree(ptr));
  cublasDestroy(blas);
}

// The Muon rule through the C ABI on CUDA: a Muon group of three matrices beside an AdamW
// group, three steps against the float64 reference at bfloat16's tolerance; a found_inf
// skip leaves every matrix and momentum as it was.
TEST_CASE("a Muon group on CUDA steps its matrices as the float64 reference, and skips on found_inf",
          "[gpu][muon]") {
  using namespace sa_test;
  sa_group_config adamw = SA_GROUP_CONFIG_INIT, muon = SA_GROUP_CONFIG_INIT;
  muon.update_rule = SA_RULE_MUON;
  muon.lr = 0.02;
  muon.momentum = 0.9;
  muon.weight_decay = 0.1;
  muon.eps = 1e-7;
  const std::vector<std::pair<int64_t, int64_t>> shapes{{12, 40}, {40, 12}, {33, 33}};
  std::vector<std::unique_ptr<DeviceTensor>> params, grads;
  std::vector<sa::test::Matrix> p64, buf64;
  OptimizerPtr opt = make_optimizer();
  int32_t g = -1;
  REQUIRE_SA_OK(opt.get(), sa_optimizer_add_group(opt.get(), &adamw, &g));
  REQUIRE_SA_OK(opt.get(), sa_optimizer_add_group(opt.get(), &muon, &g));
  for (std::size_t i = 0; i < shapes.size(); ++i) {
    const auto [rows, cols] = shapes[i];
    params.push_back(std::make_unique<DeviceTensor>(std::vector<int64_t>{rows, cols}, kFloat32));
    grads.push_back(std::make_unique<DeviceTensor>(std::vector<int64_t>{rows, cols}, kFloat32));
    const std::vector<float> p = sa::test::random_matrix(rows, cols, 5 + i, 1.0f);
    CUDA_OK(cudaMemcpy(params[i]->data(), p.data(), p.size() * sizeof(float), cudaMemcpyHostToDevice));
    p64.emplace_back(p.begin(), p.end());
    buf64.emplace_back(p.size(), 0.0);
    int64_t index = -1;
    const std::string name = "w" + std::to_string(i);
    REQUIRE_SA_OK(opt.get(), sa_optimizer_add_param(opt.get(), name.c_str(), 1, params[i]->versioned(),
                                                    nullptr, nullptr, &index));
    const DLTensor dl = grads[i]->dl();
    REQUIRE_SA_OK(opt.get(), sa_optimizer_set_grad(opt.get(), index, &dl));
  }
  DeviceTensor bias({40}, kFloat32), bias_grad({40}, kFloat32);
  int64_t bias_index = -1;
  REQUIRE_SA_OK(opt.get(), sa_optimizer_add_param(opt.get(), "bias", 0, bias.versioned(), nullptr,
                                                  nullptr, &bias_index));
  const DLTensor bias_dl = bias_grad.dl();
  REQUIRE_SA_OK(opt.get(), sa_optimizer_set_grad(opt.get(), bias_index, &bias_dl));

  sa::kernels::MuonHyper h;
  h.lr = muon.lr;
  h.momentum = muon.momentum;
  h.weight_decay = muon.weight_decay;
  h.ns.eps = static_cast<float>(muon.eps);
  const std::vector<sa::test::Matrix> start = p64;
  for (int step = 0; step < 3; ++step) {
    for (std::size_t i = 0; i < shapes.size(); ++i) {
      const auto [rows, cols] = shapes[i];
      const std::vector<float> gv = sa::test::random_matrix(rows, cols, 100 * step + i, 0.01f);
      CUDA_OK(cudaMemcpy(grads[i]->data(), gv.data(), gv.size() * sizeof(float), cudaMemcpyHostToDevice));
      sa::test::muon_reference(p64[i], sa::test::Matrix(gv.begin(), gv.end()), buf64[i], rows, cols, h);
    }
    REQUIRE_SA_OK(opt.get(), sa_optimizer_step(opt.get(), nullptr, nullptr));
  }
  CUDA_OK(cudaDeviceSynchronize());
  std::vector<std::vector<unsigned char>> kept;
  for (std::size_t i = 0; i < shapes.size(); ++i) {
    INFO("matrix " << i);
    const std::vector<unsigned char> raw = params[i]->download();
    std::vector<float> got(raw.size() / sizeof(float));
    std::memcpy(got.data(), raw.data(), raw.size());
    const StateView mb = state_view(opt.get(), static_cast<int64_t>(i), "momentum_buffer");
    const std::vector<unsigned char> mb_raw = download_view(mb);
    std::vector<float> buf(mb_raw.size() / sizeof(float));
    std::memcpy(buf.data(), mb_raw.data(), mb_raw.size());
    double worst_p = 0.0, worst_buf = 0.0, moved = 0.0;
    for (std::size_t e = 0; e < got.size(); ++e) {
      worst_p = std::max(worst_p, std::abs(got[e] - p64[i][e]));
      worst_buf = std::max(worst_buf, std::abs(buf[e] - buf64[i][e]));
      moved = std::max(moved, std::abs(p64[i][e] - start[i][e]));
    }
    CAPTURE(worst_p, worst_buf, moved);
    CHECK(worst_buf < 1e-6);
    CHECK(worst_p < 3 * 0.02 * 1.9 * 0.06);  // bfloat16's direction, as the kernel test bounds it
    CHECK(moved > 0.01);
    kept.push_back(raw);
  }
  // found_inf: a skipped step moves nothing, the momentum included.
  DeviceFloat found_inf;
  found_inf.set(1.0f);
  sa_step_args args = SA_STEP_ARGS_INIT;
  args.found_inf = found_inf.get();
  const std::vector<unsigned char> mb_before = download_view(state_view(opt.get(), 0, "momentum_buffer"));
  REQUIRE_SA_OK(opt.get(), sa_optimizer_step(opt.get(), &args, nullptr));
  CUDA_OK(cudaDeviceSynchronize());
  for (std::size_t i = 0; i < shapes.size(); ++i) CHECK(params[i]->download() == kept[i]);
  CHECK(download_view(state_view(opt.get(), 0, "momentum_buffer")) == mb_before);
}

// A matrix split across 2 ranks (threads on one GPU, a host communicator), by rows and by
// columns: each rank's box after 3 steps is, bit for bit, the box of the whole matrix
// stepped on one rank (the same cuBLAS GEMMs on the same whole direction).
TEST_CASE("a Muon matrix split across 2 ranks on CUDA steps as the whole matrix does on one",
          "[gpu][muon][sharded]") {
  using namespace sa_test;
  sa_group_config muon = SA_GROUP_CONFIG_INIT;
  muon.update_rule = SA_RULE_MUON;
  muon.lr = 0.02;
  const int64_t rows = 21, cols = 34;  // over 2: rows 11 and 10, or columns 17 and 17
  const std::vector<float> start = sa::test::random_matrix(rows, cols, 3, 1.0f);
  auto grad_of = [&](int step) { return sa::test::random_matrix(rows, cols, 40 + step, 0.01f); };
  // The rows x cols box at (r0, c0) of a row-major matrix of `cols` columns.
  auto box_of = [&](const std::vector<float>& m, const int64_t* offset, const int64_t* shape) {
    std::vector<float> out;
    for (int64_t r = 0; r < shape[0]; ++r)
      for (int64_t c = 0; c < shape[1]; ++c) out.push_back(m[(offset[0] + r) * cols + offset[1] + c]);
    return out;
  };
  // Runs one rank of a split along `dim` (or the whole matrix with ranks == 1); returns its
  // box after 3 steps, as floats. Ranks run on threads of their own, and Catch2's assertions
  // are not thread-safe (with -s they abort): a failure is written into *error instead (but
  // DeviceTensor's own checks).
  auto run = [&](int ranks, int rank, int dim, sa_comm* comm, std::string* error) {
    auto cuda = [&](cudaError_t e) {
      if (e != cudaSuccess && error->empty()) *error = cudaGetErrorString(e);
      return e == cudaSuccess;
    };
    MeshLayout mesh{{rows, cols}, {ranks}, {rank}, {shard(dim)}};
    const sa_layout layout = mesh.get();
    int64_t shape[2] = {rows, cols}, offset[2] = {0, 0};
    if (ranks > 1 && sa_layout_local_box(&layout, shape, offset) != SA_OK) {
      *error = sa_last_error();
      return std::vector<float>();
    }
    const std::vector<float> first = box_of(start, offset, shape);
    DeviceTensor w({shape[0], shape[1]}, kFloat32), g({shape[0], shape[1]}, kFloat32);
    cuda(cudaMemcpy(w.data(), first.data(), first.size() * sizeof(float), cudaMemcpyHostToDevice));
    sa_optimizer_config oc = SA_OPTIMIZER_CONFIG_INIT;
    sa_optimizer* raw = nullptr;
    sa_status st = sa_optimizer_create(&oc, &raw);
    OptimizerPtr opt(raw);
    int32_t group = -1;
    int64_t index = -1;
    if (st == SA_OK && comm != nullptr) st = sa_optimizer_set_comm(opt.get(), comm);
    if (st == SA_OK) st = sa_optimizer_add_group(opt.get(), &muon, &group);
    if (st == SA_OK)
      st = sa_optimizer_add_param(opt.get(), "w", 0, w.versioned(), ranks > 1 ? &layout : nullptr,
                                  nullptr, &index);
    const DLTensor gd = g.dl();
    if (st == SA_OK) st = sa_optimizer_set_grad(opt.get(), 0, &gd);
    for (int step = 0; step < 3 && st == SA_OK; ++step) {
      const std::vector<float> grad = box_of(grad_of(step), offset, shape);
      cuda(cudaMemcpy(g.data(), grad.data(), grad.size() * sizeof(float), cudaMemcpyHostToDevice));
      st = sa_optimizer_step(opt.get(), nullptr, nullptr);
      if (st == SA_OK) cuda(cudaDeviceSynchronize());
    }
    if (st != SA_OK) *error = sa_optimizer_last_error(opt.get());
    opt.reset();
    const std::vector<unsigned char> bytes = w.download();
    std::vector<float> out(bytes.size() / sizeof(float));
    std::memcpy(out.data(), bytes.data(), bytes.size());
    return out;
  };
  std::string error;
  const std::vector<float> whole = run(1, 0, 0, nullptr, &error);
  REQUIRE(error.empty());
  CHECK(whole != start);
  // Ranks that say their numbers: rank 0 owns the matrix, and the boxes go there and back
  // through the host communicator's all_to_all (or its all_reduce), through host staging;
  // columns through staging on the owner too. Ranks that do not: both orthogonalize it.
  struct Mode {
    const char* what;
    bool said, all_to_all;
  };
  for (const int dim : {0, 1})
    for (const Mode mode : {Mode{"ranks said, all_to_all", true, true},
                            Mode{"ranks said, through all_reduce", true, false},
                            Mode{"ranks unsaid, summed", false, false}}) {
      INFO("Shard(" << dim << "), " << mode.what);
      ThreadComms comms(2, mode.said, -1, mode.all_to_all);
      std::vector<std::vector<float>> boxes(2);
      std::vector<std::string> errors(2);
      std::vector<std::thread> threads;
      for (int r = 0; r < 2; ++r)
        threads.emplace_back([&, r] {
          std::string& error = errors[static_cast<std::size_t>(r)];
          if (cudaSetDevice(0) != cudaSuccess) error = "cudaSetDevice(0) failed";
          if (error.empty()) boxes[static_cast<std::size_t>(r)] = run(2, r, dim, comms[r], &error);
        });
      for (std::thread& t : threads) t.join();
      INFO(errors[0] << errors[1]);
      REQUIRE((errors[0].empty() && errors[1].empty()));
      for (int r = 0; r < 2; ++r) {
        MeshLayout mesh{{rows, cols}, {2}, {r}, {shard(dim)}};
        const sa_layout layout = mesh.get();
        int64_t shape[2], offset[2];
        REQUIRE(sa_layout_local_box(&layout, shape, offset) == SA_OK);
        CHECK(boxes[static_cast<std::size_t>(r)] == box_of(whole, offset, shape));
      }
    }
}
