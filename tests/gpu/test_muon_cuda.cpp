// tests/gpu/test_muon_cuda.cpp — kernels/cuda/newton_schulz.cuh (bfloat16 GEMMs on
// cuBLAS) against the float64 Newton-Schulz of tests/muon_reference.hpp, at
// bfloat16's tolerance, and run twice to the same bits.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <utility>
#include <vector>

#include <thread>

#include "gpu/cuda_test_support.hpp"
#include "kernels/cuda/muon_cuda.cuh"
#include "kernels/cuda/newton_schulz.cuh"
#include "muon_reference.hpp"
#include "muon_slots.hpp"
#include "test_thread_comm.hpp"

namespace {

// The cuBLAS these tests link, as the kernels take it (the CUDA module loads one).
const sa::kernels::CublasCalls kCublas{&cublasSetStream_v2, &cublasGemmEx, &cublasSetWorkspace_v2};

// A test case's cuBLAS handle, destroyed when the case ends, a failed REQUIRE's too.
class CublasHandle {
 public:
  CublasHandle() { REQUIRE(cublasCreate(&handle_) == CUBLAS_STATUS_SUCCESS); }
  ~CublasHandle() {
    if (handle_ != nullptr) cublasDestroy(handle_);
  }
  CublasHandle(const CublasHandle&) = delete;
  CublasHandle& operator=(const CublasHandle&) = delete;
  cublasHandle_t get() const { return handle_; }

 private:
  cublasHandle_t handle_ = nullptr;
};

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
  const CublasHandle handle;
  cublasHandle_t blas = handle.get();
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
}

TEST_CASE("A Muon matrix step on the GPU matches a float64 Muon over several steps", "[muon]") {
  const CublasHandle handle;
  cublasHandle_t blas = handle.get();
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
        sa::kernels::muon_matrix_cuda(sa::test::muon_variant(), kCublas, blas,
                                      sa::test::muon_slot(dp, dg, dbuf), rows, cols, h, nullptr,
                                      work, nullptr);
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
  DeviceTensor bias({40}, kFloat32), bias_grad({40}, kFloat32);  // all outlive the optimizer
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

namespace {

using sa::kernels::ElemType;

// The bytes of `values` as dtype t (float32, or bfloat16 rounded by test_support.hpp's
// round_to_bf16, from the format).
std::vector<unsigned char> stored_as(ElemType t, const std::vector<float>& values) {
  std::vector<unsigned char> out(values.size() * (t == ElemType::f32 ? 4 : 2));
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (t == ElemType::f32) {
      std::memcpy(out.data() + 4 * i, &values[i], 4);
    } else {
      const float r = static_cast<float>(sa_test::round_to_bf16(values[i]));
      uint32_t bits = 0;
      std::memcpy(&bits, &r, 4);
      const uint16_t high = static_cast<uint16_t>(bits >> 16);
      std::memcpy(out.data() + 2 * i, &high, 2);
    }
  }
  return out;
}

// `values` on the device as dtype t (stored_as), `offset` elements past a 256-byte aligned
// allocation (1: no vector access).
std::unique_ptr<sa_test::DeviceTensor> on_device(ElemType t, const std::vector<float>& values,
                                                 int64_t offset) {
  auto d = std::make_unique<sa_test::DeviceTensor>(
      std::vector<int64_t>{static_cast<int64_t>(values.size())},
      t == ElemType::f32 ? sa_test::kFloat32 : sa_test::kBfloat16, offset);
  const std::vector<unsigned char> bytes = stored_as(t, values);
  CUDA_OK(cudaMemcpy(d->data(), bytes.data(), bytes.size(), cudaMemcpyHostToDevice));
  return d;
}

std::vector<float> floats_of(const sa_test::DeviceTensor& t) {
  std::vector<float> out(static_cast<std::size_t>(t.numel()));
  CUDA_OK(cudaMemcpy(out.data(), t.data(), t.bytes(), cudaMemcpyDeviceToHost));
  return out;
}

}  // namespace

// The whole-matrix passes take 4 floats a thread (float4s where the arrays allow) over
// matrices larger than one round of their grids, with a partial last group: float32 arrays
// one float past 16-byte alignment give the same bits as aligned ones, the momentum is every
// element's, and the orthogonalized rows have the norms of an orthogonalization (a pass that
// skipped elements leaves them unnormalized, and the iteration diverges).
TEST_CASE("Muon and Newton-Schulz on CUDA: the same bits from any float address, large matrices",
          "[gpu][muon][newton_schulz]") {
  const CublasHandle handle;
  cublasHandle_t blas = handle.get();
  // 1003 x 1101: 1,104,303 elements (> 1024 blocks x 256 threads x 4; 3 left over), m % 8 != 0
  // (poly_init's element-wise rows); 1024 x 1096: m % 8 == 0 (its 16-byte rows).
  const auto [rows, cols] =
      GENERATE(std::pair<int64_t, int64_t>{1003, 1101}, std::pair<int64_t, int64_t>{1096, 1024});
  CAPTURE(rows, cols);
  const std::size_t n = static_cast<std::size_t>(rows * cols);
  const std::vector<float> p = sa::test::random_matrix(rows, cols, 5, 1.0f);
  const std::vector<float> g = sa::test::random_matrix(rows, cols, 6, 0.01f);
  const std::vector<float> b = sa::test::random_matrix(rows, cols, 7, 0.01f);
  sa::kernels::MuonHyper h;
  h.lr = 0.02;
  h.weight_decay = 0.0;  // every change of a param is its update's
  void* work = nullptr;
  CUDA_OK(cudaMalloc(&work, sa::kernels::muon_cuda_work_bytes(rows, cols)));
  std::vector<std::vector<float>> params, bufs, orthogonal;
  for (const int64_t offset : {0, 1}) {
    INFO("offset " << offset);
    auto dp = on_device(ElemType::f32, p, offset), dg = on_device(ElemType::f32, g, offset), db = on_device(ElemType::f32, b, offset);
    const sa::kernels::NsStatus st = sa::kernels::muon_matrix_cuda(
        sa::test::muon_variant(), kCublas, blas,
        sa::test::muon_slot(dp->data(), dg->data(), db->data()), rows, cols, h, nullptr, work,
        nullptr);
    REQUIRE(st.ok());
    params.push_back(floats_of(*dp));
    bufs.push_back(floats_of(*db));
    auto dx = on_device(ElemType::f32, g, offset);
    REQUIRE(sa::kernels::newton_schulz_cuda(kCublas, blas, static_cast<float*>(dx->data()), rows,
                                            cols, h.ns, work, nullptr)
                .ok());
    orthogonal.push_back(floats_of(*dx));
  }
  CHECK(params[0] == params[1]);
  CHECK(bufs[0] == bufs[1]);
  CHECK(orthogonal[0] == orthogonal[1]);
  const sa::kernels::MuonCoeffs c = sa::kernels::muon_coeffs(h, rows, cols);
  std::size_t wrong_buf = 0, unmoved = 0;
  for (std::size_t i = 0; i < n; ++i) {
    float expected = b[i];
    sa::kernels::muon_momentum(c, g[i], expected);
    wrong_buf += bufs[0][i] != expected;
    unmoved += params[0][i] == p[i];
  }
  CHECK(wrong_buf == 0);
  CHECK(unmoved < n / 1000);  // an update rounded away here and there, no more
  // Rows of an orthogonalization of a wide matrix (rows <= cols) are near unit vectors;
  // columns of a tall one's.
  const bool wide = rows <= cols;
  const int64_t lines = wide ? rows : cols, along = wide ? cols : rows;
  double lowest = 1e9, highest = 0.0;
  for (int64_t l = 0; l < lines; ++l) {
    double sum = 0.0;
    for (int64_t k = 0; k < along; ++k) {
      const double v = orthogonal[0][static_cast<std::size_t>(wide ? l * cols + k : k * cols + l)];
      sum += v * v;
    }
    lowest = std::min(lowest, std::sqrt(sum));
    highest = std::max(highest, std::sqrt(sum));
  }
  CAPTURE(lowest, highest);
  CHECK(lowest > 0.3);
  CHECK(highest < 1.5);
  CUDA_OK(cudaFree(work));
}

// A box's passes walk it without a division per element: over a box larger than one round
// of the grid whose width does not divide the grid's stride, every element's momentum lands
// at its place in a wider layout (nothing between the rows written), and the apply reads it
// from there; bit for bit the host's muon_math.h.
TEST_CASE("Muon's box passes on CUDA over a box larger than their grid", "[gpu][muon][sharded]") {
  const int64_t box_rows = 1100, box_cols = 1000, ld = 1003;  // 4096 x 256 % 1000 = 576
  const sa::kernels::MatrixBox box{2 * box_rows, box_cols, box_rows, 0, box_rows, box_cols};
  sa::kernels::MuonHyper h;
  h.lr = 0.02;
  const std::vector<float> p = sa::test::random_matrix(box_rows, box_cols, 8, 1.0f);
  const std::vector<float> g = sa::test::random_matrix(box_rows, box_cols, 9, 0.01f);
  const std::vector<float> b = sa::test::random_matrix(box_rows, box_cols, 10, 0.01f);
  const std::vector<float> sentinel(static_cast<std::size_t>(box_rows * ld), -7.0f);
  auto dp = on_device(ElemType::f32, p, 0), dg = on_device(ElemType::f32, g, 0), db = on_device(ElemType::f32, b, 0), dd = on_device(ElemType::f32, sentinel, 0);
  float* dir = static_cast<float*>(dd->data());
  const sa::kernels::TensorSlot slot = sa::test::muon_slot(dp->data(), dg->data(), db->data());
  CUDA_OK(sa::kernels::muon_box_momentum_cuda(sa::test::muon_variant(), h, box, nullptr, slot, dir,
                                              ld, nullptr));
  CUDA_OK(sa::kernels::muon_box_apply_cuda(sa::test::muon_variant(), h, box, nullptr, dir, ld, slot,
                                           nullptr));
  const std::vector<float> got_p = floats_of(*dp), got_b = floats_of(*db), got_d = floats_of(*dd);
  const sa::kernels::MuonCoeffs c = sa::kernels::muon_coeffs(h, box.rows, box.cols);
  std::size_t wrong = 0;
  for (int64_t r = 0; r < box_rows; ++r) {
    for (int64_t k = 0; k < ld; ++k) {
      const std::size_t at = static_cast<std::size_t>(r * ld + k);
      if (k >= box_cols) {
        wrong += got_d[at] != -7.0f;
        continue;
      }
      const std::size_t i = static_cast<std::size_t>(r * box_cols + k);
      float buf = b[i];
      const float u = sa::kernels::muon_momentum(c, g[i], buf);
      wrong += got_b[i] != buf;
      wrong += got_d[at] != u;
      wrong += got_p[i] != sa::kernels::muon_apply(c, p[i], u);
    }
  }
  CHECK(wrong == 0);
}

// Muon's storage forms on CUDA, each against what it must equal: a bfloat16 param's float32
// master steps as a float32 param does, bit for bit, and the param is its master rounded;
// bfloat16 grads step as float32 grads of the same values; a bfloat16 momentum_buffer's first
// step is (1 - momentum) g rounded. Arrays one element past vector alignment (element-wise
// passes) give the same bits as aligned ones, over a matrix larger than one round of the grid.
TEST_CASE("Muon on CUDA over bfloat16 params (float32 master), grads and momentum_buffer",
          "[gpu][muon]") {
  const CublasHandle handle;
  cublasHandle_t blas = handle.get();
  const auto [rows, cols] =
      GENERATE(std::pair<int64_t, int64_t>{40, 12}, std::pair<int64_t, int64_t>{1003, 1101});
  CAPTURE(rows, cols);
  sa::kernels::MuonHyper h;
  h.lr = 0.02;
  h.momentum = 0.9;
  const std::size_t n = static_cast<std::size_t>(rows * cols);
  const std::vector<float> start = sa::test::random_matrix(rows, cols, 31, 1.0f);
  std::vector<std::vector<float>> grads;
  for (int step = 0; step < 3; ++step)
    grads.push_back(sa::test::random_matrix(rows, cols, 40 + static_cast<unsigned>(step), 0.01f));
  void* work = nullptr;
  CUDA_OK(cudaMalloc(&work, sa::kernels::muon_cuda_work_bytes(rows, cols)));
  struct Result {
    std::vector<unsigned char> param, master, buf;
  };
  // `steps` steps of variant v from `start`, grads and buffer stored in v's dtypes (the grads
  // rounded first when `rounded_grads`), its arrays `offset` elements past alignment.
  auto run = [&](const sa::kernels::Variant& v, int64_t offset, int steps, bool rounded_grads) {
    const auto param = on_device(v.param, start, offset),
               master = on_device(ElemType::f32, start, offset),
               buf = on_device(v.moment, std::vector<float>(n, 0.0f), offset);
    for (int step = 0; step < steps; ++step) {
      std::vector<float> g = grads[static_cast<std::size_t>(step)];
      if (rounded_grads)
        for (float& x : g) x = static_cast<float>(sa_test::round_to_bf16(x));
      const auto grad = on_device(v.grad, g, offset);
      const sa::kernels::NsStatus st = sa::kernels::muon_matrix_cuda(
          v, kCublas, blas,
          sa::test::muon_slot(param->data(), grad->data(), buf->data(),
                              v.master == sa::kernels::MasterKind::fp32 ? master->data() : nullptr),
          rows, cols, h, nullptr, work, nullptr);
      REQUIRE(st.ok());
      CUDA_OK(cudaDeviceSynchronize());
    }
    return Result{param->download(), master->download(), buf->download()};
  };
  const sa::kernels::Variant f32 = sa::test::muon_variant(),
                             bf16_param = sa::test::muon_variant(ElemType::bf16),
                             bf16_grad = sa::test::muon_variant(ElemType::f32, ElemType::bf16),
                             bf16_buf =
                                 sa::test::muon_variant(ElemType::f32, ElemType::f32, ElemType::bf16);
  const Result plain = run(f32, 0, 3, false), plain_rounded = run(f32, 0, 3, true);
  std::vector<float> plain_p(n);
  std::memcpy(plain_p.data(), plain.param.data(), 4 * n);
  for (const int64_t offset : {0, 1}) {
    INFO("offset " << offset);
    const Result p16 = run(bf16_param, offset, 3, false);
    CHECK(p16.master == plain.param);
    CHECK(p16.param == stored_as(ElemType::bf16, plain_p));
    CHECK(p16.buf == plain.buf);
    const Result g16 = run(bf16_grad, offset, 3, false);  // stored_as rounds them
    CHECK(g16.param == plain_rounded.param);
    CHECK(g16.buf == plain_rounded.buf);
    const Result b16_first = run(bf16_buf, offset, 1, false);
    std::vector<float> first(n);
    for (std::size_t i = 0; i < n; ++i)
      first[i] = static_cast<float>(static_cast<double>(static_cast<float>(1.0 - h.momentum)) *
                                    grads[0][i]);  // one rounding of the float product, as fmaf
    CHECK(b16_first.buf == stored_as(ElemType::bf16, first));
    if (offset == 1) {  // the element-wise passes against the vector ones, over 3 steps
      const Result aligned = run(bf16_buf, 0, 3, false), unaligned = run(bf16_buf, 1, 3, false);
      CHECK(aligned.param == unaligned.param);
      CHECK(aligned.buf == unaligned.buf);
    }
  }
  CUDA_OK(cudaFree(work));
}

// A Muon step captured in a CUDA graph (Newton-Schulz's cuBLAS GEMMs on the optimizer's own
// workspace: nothing allocated in the capture) replays as eager steps run: two optimizers
// over the same matrices (float32, and bfloat16 with a float32 master), one stepping eagerly
// on the stream, the other replaying its captured step with new grads in the same buffers,
// end bit for bit equal.
TEST_CASE("a captured Muon step replays in a CUDA graph as eager steps run, bit for bit",
          "[gpu][muon]") {
  using namespace sa_test;
  sa_group_config muon = SA_GROUP_CONFIG_INIT;
  muon.update_rule = SA_RULE_MUON;
  muon.lr = 0.02;
  const std::vector<std::pair<int64_t, int64_t>> shapes{{48, 160}, {160, 48}, {64, 64}};
  struct Side {  // the tensors outlive the optimizer, which owns views of them
    std::vector<std::unique_ptr<DeviceTensor>> params, grads;
    OptimizerPtr opt = make_optimizer();
  };
  Side eager, graph;
  for (Side* side : {&eager, &graph}) {
    int32_t g = -1;
    REQUIRE_SA_OK(side->opt.get(), sa_optimizer_add_group(side->opt.get(), &muon, &g));
    for (std::size_t i = 0; i < shapes.size(); ++i) {
      const auto [rows, cols] = shapes[i];
      const DLDataType dtype = i == 2 ? kBfloat16 : kFloat32;
      side->params.push_back(std::make_unique<DeviceTensor>(std::vector<int64_t>{rows, cols}, dtype));
      side->grads.push_back(std::make_unique<DeviceTensor>(std::vector<int64_t>{rows, cols}, dtype));
      const std::vector<unsigned char> start =
          stored_as(i == 2 ? ElemType::bf16 : ElemType::f32,
                    sa::test::random_matrix(rows, cols, 60 + static_cast<unsigned>(i), 1.0f));
      CUDA_OK(cudaMemcpy(side->params[i]->data(), start.data(), start.size(), cudaMemcpyHostToDevice));
      int64_t index = -1;
      REQUIRE_SA_OK(side->opt.get(),
                    sa_optimizer_add_param(side->opt.get(), ("w" + std::to_string(i)).c_str(), 0,
                                           side->params[i]->versioned(), nullptr, nullptr, &index));
      const DLTensor dl = side->grads[i]->dl();
      REQUIRE_SA_OK(side->opt.get(), sa_optimizer_set_grad(side->opt.get(), index, &dl));
    }
  }
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  // Step `step`'s grads into both sides' buffers, on the stream.
  auto fill = [&](int step) {
    for (std::size_t i = 0; i < shapes.size(); ++i) {
      const auto [rows, cols] = shapes[i];
      const std::vector<unsigned char> g = stored_as(
          i == 2 ? ElemType::bf16 : ElemType::f32,
          sa::test::random_matrix(rows, cols, 300 + 10 * static_cast<unsigned>(step) + i, 0.01f));
      for (Side* side : {&eager, &graph})
        CUDA_OK(cudaMemcpyAsync(side->grads[i]->data(), g.data(), g.size(), cudaMemcpyHostToDevice,
                                stream));
      CUDA_OK(cudaStreamSynchronize(stream));  // g is freed next
    }
  };
  // Step 0 outside capture on both: plans, cuBLAS's handle and the scratch are made.
  fill(0);
  REQUIRE_SA_OK(eager.opt.get(), sa_optimizer_step(eager.opt.get(), nullptr, stream));
  REQUIRE_SA_OK(graph.opt.get(), sa_optimizer_step(graph.opt.get(), nullptr, stream));
  const CapturedStep captured = capture_step(graph.opt.get(), stream);
  INFO(captured.message);
  REQUIRE(captured.status == SA_OK);
  REQUIRE(captured.ended == cudaSuccess);
  REQUIRE(captured.graph != nullptr);
  cudaGraphExec_t exec = nullptr;
  CUDA_OK(cudaGraphInstantiate(&exec, captured.graph, 0));
  for (int step = 1; step <= 3; ++step) {
    fill(step);
    REQUIRE_SA_OK(eager.opt.get(), sa_optimizer_step(eager.opt.get(), nullptr, stream));
    CUDA_OK(cudaGraphLaunch(exec, stream));
  }
  CUDA_OK(cudaStreamSynchronize(stream));
  for (std::size_t i = 0; i < shapes.size(); ++i) {
    INFO("matrix " << i);
    CHECK(graph.params[i]->download() == eager.params[i]->download());
    const int64_t index = static_cast<int64_t>(i);
    CHECK(download_view(state_view(graph.opt.get(), index, "momentum_buffer")) ==
          download_view(state_view(eager.opt.get(), index, "momentum_buffer")));
  }
  CHECK(graph.params[0]->download() != stored_as(ElemType::f32, sa::test::random_matrix(48, 160, 60, 1.0f)));
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(captured.graph);
  cudaStreamDestroy(stream);
}
