// tests/gpu/test_cuda_clip.cpp — gradient-norm clipping and the found-inf consensus on CUDA.
//
// The CPU backend is the reference (tests/test_clip_comm.cpp checks it against float64 on
// 4 ranks). The two backends sum the norm in different orders, so norms agree to 1e-12
// and params to a few float32 ulps rather than bit for bit. Communicators: an NCCL
// communicator of one rank and a host one must give exactly what no communicator gives;
// two GPUs with NCCL (when present) must give the norm of the whole.
#include <cuda_runtime.h>

#include <atomic>
#include <cmath>
#include <limits>
#include <thread>
#include <tuple>

#ifdef SHARDADAM_TEST_NCCL
#include <nccl.h>
#endif

#include "gpu/cuda_test_support.hpp"
#include "gpu/twin.hpp"
#include "test_support.hpp"

using namespace sa_test;

namespace {

struct CommDeleter {
  void operator()(sa_comm* comm) const { sa_comm_destroy(comm); }
};
using CommPtr = std::unique_ptr<sa_comm, CommDeleter>;

bool with_nccl() { return std::string(sa_build_info()).find("nccl: built") != std::string::npos; }

CommPtr nccl_single_rank() {
  sa_nccl_unique_id id{};
  REQUIRE_SA_OK(nullptr, sa_nccl_unique_id_create(&id));
  sa_comm* comm = nullptr;
  REQUIRE_SA_OK(nullptr, sa_comm_create_nccl(&id, 1, 0, 0, &comm));
  return CommPtr(comm);
}

// A host communicator of one rank: all_reduce leaves the values as they are.
int identity_all_reduce(void* ctx, double*, int32_t, sa_reduce_op) {
  ++*static_cast<std::atomic<int>*>(ctx);
  return 0;
}

CommPtr host_single_rank(std::atomic<int>& calls) {
  sa_host_comm callbacks = SA_HOST_COMM_INIT;
  callbacks.ctx = &calls;
  callbacks.all_reduce = identity_all_reduce;
  sa_comm* comm = nullptr;
  REQUIRE_SA_OK(nullptr, sa_comm_create_host(&callbacks, &comm));
  return CommPtr(comm);
}

// A CUDA optimizer over fp32 shards of the given sizes, grads bound once.
struct GpuRun {
  std::vector<std::unique_ptr<DeviceTensor>> params, grads;
  OptimizerPtr opt = make_optimizer();
  ~GpuRun() { opt.reset(); }

  GpuRun(const std::vector<int64_t>& sizes, const std::vector<HostTensor>& initial) {
    const sa_group_config c = group_config(1e-2, 1e-2, 1);
    REQUIRE_SA_OK(opt.get(), sa_optimizer_add_group(opt.get(), &c, nullptr));
    std::vector<const void*> ptrs;
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      params.push_back(std::make_unique<DeviceTensor>(std::vector<int64_t>{sizes[i]}, kFloat32));
      params.back()->upload(initial[i]);
      grads.push_back(std::make_unique<DeviceTensor>(std::vector<int64_t>{sizes[i]}, kFloat32));
      const std::string name = "p" + std::to_string(i);
      REQUIRE_SA_OK(opt.get(), sa_optimizer_add_param(opt.get(), name.c_str(), 0, params.back()->versioned(),
                                                      nullptr, nullptr, nullptr));
      ptrs.push_back(sizes[i] ? grads.back()->data() : nullptr);
    }
    REQUIRE_SA_OK(opt.get(), sa_optimizer_set_grad_ptrs(opt.get(), static_cast<int64_t>(ptrs.size()), ptrs.data()));
  }

  void upload_grads(const std::vector<HostTensor>& g) {
    for (std::size_t i = 0; i < g.size(); ++i) grads[i]->upload(g[i]);
  }

  std::vector<std::vector<unsigned char>> param_bytes() const {
    std::vector<std::vector<unsigned char>> out;
    for (const auto& p : params) out.push_back(p->download());
    return out;
  }
};

std::vector<HostTensor> random_tensors(const std::vector<int64_t>& sizes, Rng& rng, double lo, double hi) {
  std::vector<HostTensor> out;
  for (int64_t n : sizes) {
    out.emplace_back(std::vector<int64_t>{n}, kFloat32);
    fill_log_uniform(out.back(), rng, lo, hi);
  }
  return out;
}

}  // namespace

TEST_CASE("clipping on CUDA: the norm equals the CPU's to 1e-12 and params stay within 4 ulps, every "
          "variant, L2 and inf norms",
          "[gpu][clip]") {
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  for (int32_t norm_type : {SA_NORM_L2, SA_NORM_INF}) {
    DYNAMIC_SECTION((norm_type == SA_NORM_L2 ? "L2" : "inf")) {
      Rng rng(0xC11F + static_cast<uint64_t>(norm_type));
      Twin t;
      t.add_groups(false);
      int index = 0;
      for (const VariantSpec& v : kVariants) {
        if (v.amsgrad) continue;  // groups are not amsgrad here
        for (int64_t n : shard_sizes(rng, 6)) {
          t.add("p" + std::to_string(index), index % 2, v, {n}, index % 5, rng);
          ++index;
        }
      }
      for (int s = 0; s < 6; ++s) {
        t.bind_new_grads(rng, s % 2 == 1, true);
        // A bound well below the norm, then one above it (no clipping).
        const double bound = s == 4 ? 1e30 : (norm_type == SA_NORM_L2 ? 5.0 : 0.5);
        const auto [cpu_norm, gpu_norm] = t.step_both_clipped(bound, norm_type, stream);
        INFO("step " << s << ": cpu norm " << cpu_norm << ", gpu norm " << gpu_norm);
        CHECK(std::fabs(gpu_norm - cpu_norm) <= 1e-12 * cpu_norm);
        CHECK(cpu_norm > 2 * (norm_type == SA_NORM_L2 ? 5.0 : 0.5));  // so the bound clips
      }
      t.require_close(4.0);
      CHECK(step_count(t.gpu.get(), 0) == 6);
    }
  }
  cudaStreamDestroy(stream);
}

// The norm and the skip decision read grads only: with the state on the host, stepped there
// by the GPU or the CPU, clipped and skipped steps give the norms and bits of state in device
// memory.
TEST_CASE("clipping and found_inf with the state on the host give the bits of state on the device",
          "[gpu][clip][offload]") {
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  for (int32_t norm_type : {SA_NORM_L2, SA_NORM_INF}) {
    DYNAMIC_SECTION((norm_type == SA_NORM_L2 ? "L2" : "inf")) {
      Twin on_device(GpuState::device), on_host(GpuState::all_three);
      for (Twin* t : {&on_device, &on_host}) {
        Rng rng(0x0FF1 + static_cast<uint64_t>(norm_type));  // the same shards and grads
        t->add_groups(false);
        int index = 0;
        for (const VariantSpec& v : kVariants) {
          if (v.amsgrad) continue;  // groups are not amsgrad here
          for (int64_t n : shard_sizes(rng, 4)) {
            t->add("p" + std::to_string(index), index % 2, v, {n}, index % 5, rng);
            ++index;
          }
        }
        for (int s = 0; s < 5; ++s) {
          t->bind_new_grads(rng, s % 2 == 1, true);
          if (s == 2) {
            t->step_both(1.0f, 1.0f, stream);  // found_inf: skipped
            continue;
          }
          const double bound = s == 4 ? 1e30 : (norm_type == SA_NORM_L2 ? 5.0 : 0.5);
          t->step_both_clipped(bound, norm_type, stream);
        }
      }
      on_host.require_gpu_identical(on_device);
      CHECK(step_count(on_host.gpu.get(), 0) == 4);
    }
  }
  cudaStreamDestroy(stream);
}

TEST_CASE("CUDA: an NCCL communicator of one rank and a host one give the bits no communicator gives; "
          "a NaN grad skips the step on the device",
          "[gpu][clip][comm]") {
  if (!with_nccl()) WARN("this build has no NCCL: the NCCL communicator is not tested");
  Rng rng(0xBEE);
  const std::vector<int64_t> sizes = {70000, 0, 5, 16384, 33};
  const std::vector<HostTensor> initial = random_tensors(sizes, rng, 0.1, 1.0);
  GpuRun plain(sizes, initial), via_host(sizes, initial);
  std::unique_ptr<GpuRun> via_nccl;
  std::atomic<int> host_calls{0};
  CommPtr host = host_single_rank(host_calls);
  REQUIRE_SA_OK(via_host.opt.get(), sa_optimizer_set_comm(via_host.opt.get(), host.get()));
  CommPtr nccl;
  if (with_nccl()) {
    nccl = nccl_single_rank();
    via_nccl = std::make_unique<GpuRun>(sizes, initial);
    REQUIRE_SA_OK(via_nccl->opt.get(), sa_optimizer_set_comm(via_nccl->opt.get(), nccl.get()));
  }
  std::vector<GpuRun*> runs = {&plain, &via_host};
  if (via_nccl) runs.push_back(via_nccl.get());

  DeviceFloat found_inf;
  found_inf.set(0.0f);
  auto step_all = [&](double bound) {
    std::vector<double> norms;
    std::vector<int32_t> skipped;
    for (GpuRun* run : runs) {
      sa_step_args args = SA_STEP_ARGS_INIT;
      args.max_grad_norm = bound;
      args.found_inf = found_inf.get();
      double norm = -1.0;
      int32_t skip = -1;
      args.host_grad_norm = &norm;
      args.skipped = &skip;
      REQUIRE_SA_OK(run->opt.get(), sa_optimizer_step(run->opt.get(), &args, nullptr));
      norms.push_back(norm);
      skipped.push_back(skip);
    }
    return std::make_pair(norms, skipped);
  };

  for (int s = 0; s < 3; ++s) {
    const auto grads = random_tensors(sizes, rng, 1e-3, 2.0);
    for (GpuRun* run : runs) run->upload_grads(grads);
    const auto [norms, skipped] = step_all(1.0);
    for (std::size_t r = 1; r < runs.size(); ++r) {
      CHECK(norms[r] == norms[0]);
      CHECK(skipped[r] == 0);
    }
  }
  CHECK(host_calls == 3);
  for (std::size_t r = 1; r < runs.size(); ++r) CHECK(runs[r]->param_bytes() == plain.param_bytes());

  // A NaN grad: the norm is NaN, every run skips, nothing moves, no count advances.
  auto grads = random_tensors(sizes, rng, 1e-3, 2.0);
  grads[3].set(100, std::numeric_limits<float>::quiet_NaN());
  for (GpuRun* run : runs) run->upload_grads(grads);
  const auto before = plain.param_bytes();
  const auto [norms, skipped] = step_all(1.0);
  for (std::size_t r = 0; r < runs.size(); ++r) {
    CHECK(std::isnan(norms[r]));
    CHECK(skipped[r] == 1);
    CHECK(runs[r]->param_bytes() == before);
    CHECK(step_count(runs[r]->opt.get(), 0) == 3);
  }
  // found_inf set alone (no norm): the consensus path skips too.
  found_inf.set(1.0f);
  for (GpuRun* run : runs) {
    sa_step_args args = SA_STEP_ARGS_INIT;
    args.found_inf = found_inf.get();
    int32_t skip = -1;
    args.skipped = &skip;
    REQUIRE_SA_OK(run->opt.get(), sa_optimizer_step(run->opt.get(), &args, nullptr));
    CHECK(skip == 1);
    CHECK(step_count(run->opt.get(), 0) == 3);
  }
}

#ifdef SHARDADAM_TEST_NCCL
TEST_CASE("a borrowed ncclComm_t (sa_comm_wrap_nccl) reduces like the library's own", "[gpu][clip][comm]") {
  Rng rng(0xB0B);
  const std::vector<int64_t> sizes = {40000, 3, 0, 513};
  const std::vector<HostTensor> initial = random_tensors(sizes, rng, 0.1, 1.0);
  ncclUniqueId id;
  REQUIRE(ncclGetUniqueId(&id) == ncclSuccess);
  ncclComm_t nccl = nullptr;
  CUDA_OK(cudaSetDevice(0));
  REQUIRE(ncclCommInitRank(&nccl, 1, id, 0) == ncclSuccess);
  {
    GpuRun plain(sizes, initial), borrowed(sizes, initial);
    sa_comm* comm = nullptr;
    REQUIRE_SA_OK(nullptr, sa_comm_wrap_nccl(nccl, &comm));
    int32_t rank = -1, nranks = -1;
    REQUIRE_SA_OK(nullptr, sa_comm_info(comm, &rank, &nranks));
    CHECK(rank == 0);
    CHECK(nranks == 1);
    REQUIRE_SA_OK(borrowed.opt.get(), sa_optimizer_set_comm(borrowed.opt.get(), comm));
    sa_comm_destroy(comm);  // the optimizer keeps its reference; the ncclComm_t stays ours
    for (int s = 0; s < 3; ++s) {
      const auto grads = random_tensors(sizes, rng, 1e-3, 2.0);
      double norms[2] = {-1.0, -2.0};
      int k = 0;
      for (GpuRun* run : {&plain, &borrowed}) {
        run->upload_grads(grads);
        sa_step_args args = SA_STEP_ARGS_INIT;
        args.max_grad_norm = 1.0;
        args.host_grad_norm = &norms[k++];
        REQUIRE_SA_OK(run->opt.get(), sa_optimizer_step(run->opt.get(), &args, nullptr));
      }
      CHECK(norms[0] == norms[1]);
    }
    CHECK(borrowed.param_bytes() == plain.param_bytes());
  }  // both optimizers are gone: now the caller may destroy its communicator
  CHECK(ncclCommDestroy(nccl) == ncclSuccess);
}
#endif

TEST_CASE("an NCCL communicator serves only an optimizer on its own CUDA device", "[gpu][comm][errors]") {
  if (!with_nccl()) {
    WARN("SKIPPED: this build has no NCCL");
    return;
  }
  CommPtr comm = nccl_single_rank();  // on cuda:0
  sa_step_args args = SA_STEP_ARGS_INIT;
  args.max_grad_norm = 1.0;

  // A CPU optimizer: NCCL reduces device memory.
  HostTensor param({16}, kFloat32), grad({16}, kFloat32);
  OptimizerPtr cpu = make_optimizer(1, 1);
  const sa_group_config c = group_config(1e-2, 0.0, 1);
  REQUIRE_SA_OK(cpu.get(), sa_optimizer_add_group(cpu.get(), &c, nullptr));
  REQUIRE_SA_OK(cpu.get(), sa_optimizer_add_param(cpu.get(), "p", 0, param.versioned(), nullptr, nullptr, nullptr));
  const DLTensor g = grad.dl();
  REQUIRE_SA_OK(cpu.get(), sa_optimizer_set_grad(cpu.get(), 0, &g));
  REQUIRE_SA_OK(cpu.get(), sa_optimizer_set_comm(cpu.get(), comm.get()));
  CHECK_SA_FAILS(cpu.get(), SA_ERR_MISMATCH, sa_optimizer_step(cpu.get(), &args, nullptr), "cpu",
                 "host-callback communicator");
  CHECK(step_count(cpu.get(), 0) == 0);

  // A CUDA optimizer on another device.
  int devices = 0;
  CUDA_OK(cudaGetDeviceCount(&devices));
  if (devices < 2) return;
  CUDA_OK(cudaSetDevice(1));
  {
    Rng rng(0xD1);
    const std::vector<int64_t> sizes = {100};
    GpuRun on_1(sizes, random_tensors(sizes, rng, 0.1, 1.0));
    REQUIRE_SA_OK(on_1.opt.get(), sa_optimizer_set_comm(on_1.opt.get(), comm.get()));
    CHECK_SA_FAILS(on_1.opt.get(), SA_ERR_MISMATCH, sa_optimizer_step(on_1.opt.get(), &args, nullptr),
                   "cuda:1", "cuda:0");
  }
  CUDA_OK(cudaSetDevice(0));
}

TEST_CASE("CUDA graphs: a clipped step with an NCCL communicator captures and replays; a host "
          "communicator refuses capture",
          "[gpu][clip][comm]") {
  Rng rng(0x6AF);
  const std::vector<int64_t> sizes = {50000, 7, 0, 4096};
  const std::vector<HostTensor> initial = random_tensors(sizes, rng, 0.1, 1.0);
  GpuRun eager(sizes, initial), replayed(sizes, initial);
  CommPtr comm;
  if (with_nccl()) {
    comm = nccl_single_rank();
    REQUIRE_SA_OK(replayed.opt.get(), sa_optimizer_set_comm(replayed.opt.get(), comm.get()));
  }
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  DeviceFloat norm_out;
  sa_step_args args = SA_STEP_ARGS_INIT;
  args.max_grad_norm = 1.0;
  args.grad_norm = const_cast<float*>(norm_out.get());

  // One step outside capture builds the plan.
  auto grads = random_tensors(sizes, rng, 1e-3, 2.0);
  for (GpuRun* run : {&eager, &replayed}) run->upload_grads(grads);
  for (GpuRun* run : {&eager, &replayed}) REQUIRE_SA_OK(run->opt.get(), sa_optimizer_step(run->opt.get(), &args, stream));
  CUDA_OK(cudaStreamSynchronize(stream));

  cudaGraph_t graph = nullptr;
  CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  REQUIRE_SA_OK(replayed.opt.get(), sa_optimizer_step(replayed.opt.get(), &args, stream));
  CUDA_OK(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec = nullptr;
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  for (int s = 0; s < 4; ++s) {
    grads = random_tensors(sizes, rng, 1e-3, 2.0 * (s + 1));
    for (GpuRun* run : {&eager, &replayed}) run->upload_grads(grads);
    CUDA_OK(cudaGraphLaunch(exec, stream));
    CUDA_OK(cudaStreamSynchronize(stream));
    float replay_norm = 0.0f;
    CUDA_OK(cudaMemcpy(&replay_norm, norm_out.get(), sizeof replay_norm, cudaMemcpyDeviceToHost));
    double eager_norm = 0.0;
    sa_step_args eager_args = args;
    eager_args.grad_norm = nullptr;
    eager_args.host_grad_norm = &eager_norm;
    REQUIRE_SA_OK(eager.opt.get(), sa_optimizer_step(eager.opt.get(), &eager_args, nullptr));
    CHECK(replay_norm == static_cast<float>(eager_norm));
  }
  CHECK(replayed.param_bytes() == eager.param_bytes());
  CHECK(step_count(replayed.opt.get(), 0) == 5);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);

  std::atomic<int> calls{0};
  CommPtr host = host_single_rank(calls);
  REQUIRE_SA_OK(eager.opt.get(), sa_optimizer_set_comm(eager.opt.get(), host.get()));
  CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  CHECK_SA_FAILS(eager.opt.get(), SA_ERR_STATE, sa_optimizer_step(eager.opt.get(), &args, stream), "captured",
                 "NCCL");
  cudaStreamEndCapture(stream, &graph);
  if (graph) cudaGraphDestroy(graph);
  cudaGetLastError();
  CHECK(calls == 0);
  cudaStreamDestroy(stream);
}

TEST_CASE("2 GPUs, one rank each with NCCL: the global norm and the clipped step equal one CPU "
          "optimizer over the whole tensors",
          "[gpu][clip][comm][multi]") {
  int devices = 0;
  CUDA_OK(cudaGetDeviceCount(&devices));
  if (devices < 2 || !with_nccl()) {
    WARN("SKIPPED: needs 2 CUDA devices and NCCL (found " << devices << " devices)");
    return;
  }
  // Two params: 'w' (1001 rows of 33, Shard(0): 501 + 500 rows) and 'n' (37, Replicate).
  const std::vector<int64_t> w_shape = {1001, 33};
  const int64_t n_size = 37;
  Rng rng(0x2C9);
  HostTensor w_init(w_shape, kFloat32), n_init({n_size}, kFloat32);
  fill_normal(w_init, rng, 1.0);
  fill_normal(n_init, rng, 1.0);
  constexpr int kSteps = 3;
  std::vector<HostTensor> w_grads, n_grads;
  for (int s = 0; s < kSteps; ++s) {
    w_grads.emplace_back(w_shape, kFloat32);
    n_grads.emplace_back(std::vector<int64_t>{n_size}, kFloat32);
    fill_log_uniform(w_grads.back(), rng, 1e-4, 1.0 + 3 * s);
    fill_log_uniform(n_grads.back(), rng, 1e-4, 1.0);
  }
  const int64_t rows[2] = {501, 500};
  const std::size_t row_bytes = 33 * sizeof(float);

  // The whole, on the CPU.
  const sa_group_config c = group_config(1e-2, 1e-2, 1);
  HostTensor w_cpu(w_shape, kFloat32), n_cpu({n_size}, kFloat32), w_g(w_shape, kFloat32), n_g({n_size}, kFloat32);
  std::memcpy(w_cpu.data(), w_init.data(), w_init.bytes());
  std::memcpy(n_cpu.data(), n_init.data(), n_init.bytes());
  std::vector<double> cpu_norms;
  {
    OptimizerPtr cpu = make_optimizer(2, 1);
    REQUIRE_SA_OK(cpu.get(), sa_optimizer_add_group(cpu.get(), &c, nullptr));
    REQUIRE_SA_OK(cpu.get(), sa_optimizer_add_param(cpu.get(), "w", 0, w_cpu.versioned(), nullptr, nullptr, nullptr));
    REQUIRE_SA_OK(cpu.get(), sa_optimizer_add_param(cpu.get(), "n", 0, n_cpu.versioned(), nullptr, nullptr, nullptr));
    const void* ptrs[2] = {w_g.data(), n_g.data()};
    REQUIRE_SA_OK(cpu.get(), sa_optimizer_set_grad_ptrs(cpu.get(), 2, ptrs));
    for (int s = 0; s < kSteps; ++s) {
      std::memcpy(w_g.data(), w_grads[s].data(), w_g.bytes());
      std::memcpy(n_g.data(), n_grads[s].data(), n_g.bytes());
      double norm = 0.0;
      sa_step_args args = SA_STEP_ARGS_INIT;
      args.max_grad_norm = 1.0;
      args.host_grad_norm = &norm;
      REQUIRE_SA_OK(cpu.get(), sa_optimizer_step(cpu.get(), &args, nullptr));
      cpu_norms.push_back(norm);
    }
  }

  // Two ranks on two GPUs, as threads. Catch's macros are not thread-safe: each thread
  // records what happened and the main thread checks it.
  sa_nccl_unique_id id{};
  REQUIRE_SA_OK(nullptr, sa_nccl_unique_id_create(&id));
  struct RankResult {
    std::string error;
    std::vector<double> norms;
    std::vector<unsigned char> w, n;
  };
  RankResult results[2];
  auto rank_main = [&](int r) {
    RankResult& out = results[r];
    auto check = [&](sa_status st, const sa_optimizer* opt, const char* what) {
      if (st != SA_OK && out.error.empty())
        out.error = std::string(what) + ": " + (opt ? sa_optimizer_last_error(opt) : sa_last_error());
      return st == SA_OK;
    };
    cudaSetDevice(r);
    const int64_t row0 = r == 0 ? 0 : rows[0];
    float *w = nullptr, *n = nullptr, *wg = nullptr, *ng = nullptr;
    cudaMalloc(&w, rows[r] * row_bytes);
    cudaMalloc(&wg, rows[r] * row_bytes);
    cudaMalloc(&n, n_size * sizeof(float));
    cudaMalloc(&ng, n_size * sizeof(float));
    cudaMemcpy(w, w_init.as<float>() + row0 * 33, rows[r] * row_bytes, cudaMemcpyHostToDevice);
    cudaMemcpy(n, n_init.data(), n_size * sizeof(float), cudaMemcpyHostToDevice);
    int64_t w_local[2] = {rows[r], 33}, n_local[1] = {n_size};
    int64_t w_global[2] = {1001, 33}, n_global[1] = {n_size};
    int64_t mesh[1] = {2}, coord[1] = {r};
    sa_placement shard0{SA_PLACEMENT_SHARD, 0}, repl{SA_PLACEMENT_REPLICATE, 0};
    sa_layout wl = SA_LAYOUT_INIT, nl = SA_LAYOUT_INIT;
    wl.ndim = 2, wl.global_shape = w_global, wl.mesh_ndim = 1, wl.mesh_shape = mesh, wl.mesh_coord = coord;
    wl.placements = &shard0;
    nl.ndim = 1, nl.global_shape = n_global, nl.mesh_ndim = 1, nl.mesh_shape = mesh, nl.mesh_coord = coord;
    nl.placements = &repl;
    DLManagedTensorVersioned wt{}, nt{};
    for (auto [t, data, shape, ndim] : {std::make_tuple(&wt, w, w_local, 2), std::make_tuple(&nt, n, n_local, 1)}) {
      t->version = {DLPACK_MAJOR_VERSION, DLPACK_MINOR_VERSION};
      t->dl_tensor.data = data;
      t->dl_tensor.device = {kDLCUDA, r};
      t->dl_tensor.ndim = ndim;
      t->dl_tensor.dtype = kFloat32;
      t->dl_tensor.shape = shape;
    }
    sa_optimizer* opt = nullptr;
    sa_comm* comm = nullptr;
    if (check(sa_comm_create_nccl(&id, 2, r, r, &comm), nullptr, "sa_comm_create_nccl") &&
        check(sa_optimizer_create(nullptr, &opt), nullptr, "create") &&
        check(sa_optimizer_add_group(opt, &c, nullptr), opt, "add_group") &&
        check(sa_optimizer_add_param(opt, "w", 0, &wt, &wl, nullptr, nullptr), opt, "add w") &&
        check(sa_optimizer_add_param(opt, "n", 0, &nt, &nl, nullptr, nullptr), opt, "add n") &&
        check(sa_optimizer_set_comm(opt, comm), opt, "set_comm")) {
      const void* ptrs[2] = {wg, ng};
      check(sa_optimizer_set_grad_ptrs(opt, 2, ptrs), opt, "set_grad_ptrs");
      for (int s = 0; s < kSteps && out.error.empty(); ++s) {
        cudaMemcpy(wg, w_grads[s].as<float>() + row0 * 33, rows[r] * row_bytes, cudaMemcpyHostToDevice);
        cudaMemcpy(ng, n_grads[s].data(), n_size * sizeof(float), cudaMemcpyHostToDevice);
        double norm = 0.0;
        sa_step_args args = SA_STEP_ARGS_INIT;
        args.max_grad_norm = 1.0;
        args.host_grad_norm = &norm;
        if (check(sa_optimizer_step(opt, &args, nullptr), opt, "step")) out.norms.push_back(norm);
      }
      out.w.resize(rows[r] * row_bytes);
      out.n.resize(n_size * sizeof(float));
      cudaMemcpy(out.w.data(), w, out.w.size(), cudaMemcpyDeviceToHost);
      cudaMemcpy(out.n.data(), n, out.n.size(), cudaMemcpyDeviceToHost);
    }
    sa_optimizer_destroy(opt);  // the tensors' deleters are NULL: nothing to release
    sa_comm_destroy(comm);
    cudaFree(w), cudaFree(wg), cudaFree(n), cudaFree(ng);
  };
  std::thread t0(rank_main, 0), t1(rank_main, 1);
  t0.join();
  t1.join();
  for (int r = 0; r < 2; ++r) {
    INFO("rank " << r << ": " << results[r].error);
    REQUIRE(results[r].error.empty());
    REQUIRE(results[r].norms.size() == static_cast<std::size_t>(kSteps));
    for (int s = 0; s < kSteps; ++s) {
      CHECK(results[r].norms[s] == results[0].norms[s]);
      CHECK(std::fabs(results[r].norms[s] - cpu_norms[s]) <= 1e-12 * cpu_norms[s]);
    }
  }
  // Params: within 4 float32 ulps of the CPU's (the norm, and so the clip, may differ in its
  // last bit).
  Worst worst("2 GPUs vs CPU");
  for (int r = 0; r < 2; ++r) {
    const int64_t row0 = r == 0 ? 0 : rows[0];
    for (int64_t i = 0; i < rows[r] * 33; ++i) {
      float got;
      std::memcpy(&got, results[r].w.data() + 4 * i, 4);
      const double want = w_cpu.get(row0 * 33 + i);
      worst.add(i, got, want, 4 * f32_ulp(want));
    }
    for (int64_t i = 0; i < n_size; ++i) {
      float got;
      std::memcpy(&got, results[r].n.data() + 4 * i, 4);
      worst.add(i, got, n_cpu.get(i), 4 * f32_ulp(n_cpu.get(i)));
    }
  }
  INFO(worst.describe());
  CHECK(worst.ok());
}
