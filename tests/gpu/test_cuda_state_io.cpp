// tests/gpu/test_cuda_state_io.cpp — shard files of CUDA state: a CUDA optimizer exports
// exactly the bytes the CPU optimizer exports for the same training, imports into another
// layout bit for bit as the CPU path does (through pinned staging, one block or everything
// at once, with bfloat16 <-> float32 moment casts), and trains on identically. Then the
// throughput of export and import for ~1 GiB of CUDA state, next to pinned cudaMemcpy in
// the same run.
//
// Built only with CUDA; gpu_main.cpp skips the binary where no CUDA device is usable.
#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <vector>

#include "gpu/cuda_test_support.hpp"
#include "test_state_io_support.hpp"

using namespace sa_test;

namespace {

constexpr int kSaveAt = 3;
constexpr int kSteps = 6;

// A simulated rank whose params and grads live on the GPU (Rank's twin, test_state_io_support.hpp).
class GpuRank {
 public:
  GpuRank(const Problem& prob, const Scenario& scenario, int64_t rank, const std::vector<Bytes>& values,
          const std::vector<sa_group_config>& groups = io_groups(), GpuState state = GpuState::device)
      : prob_(prob) {
    opt_ = make_optimizer();
    for (const sa_group_config& c : groups) REQUIRE_SA_OK(opt_.get(), sa_optimizer_add_group(opt_.get(), &c, nullptr));
    for (std::size_t k = 0; k < prob.params.size(); ++k) {
      const GlobalParam& g = prob.params[k];
      placements_.push_back(scenario.place(g.shape, rank));
      const Box& box = placements_.back().box;
      HostTensor host(box.shape, g.dtype);
      copy_box(values[k].data(), host.data(), g.shape, box, dtype_bytes(g.dtype), true);
      params_.push_back(std::make_unique<DeviceTensor>(box.shape, g.dtype));
      params_.back()->upload(host);
      host_grads_.emplace_back(box.shape, g.grad_dtype);
      grads_.push_back(std::make_unique<DeviceTensor>(box.shape, g.grad_dtype));
    }
    for (std::size_t k = 0; k < prob.params.size(); ++k) {
      const GlobalParam& g = prob.params[k];
      const sa_layout layout = placements_[k].layout();
      sa_param_options options = param_options(g.grad_dtype, g.moment_dtype, g.master);
      options.state_placement = placement_of(state, k);
      REQUIRE_SA_OK(opt_.get(), sa_optimizer_add_param(opt_.get(), g.name.c_str(), g.group, params_[k]->versioned(),
                                                       &layout, &options, nullptr));
    }
    std::vector<const void*> ptrs;
    for (const auto& grad : grads_) ptrs.push_back(grad->numel() ? grad->data() : nullptr);
    REQUIRE_SA_OK(opt_.get(), sa_optimizer_set_grad_ptrs(opt_.get(), static_cast<int64_t>(ptrs.size()), ptrs.data()));
  }
  ~GpuRank() { opt_.reset(); }  // before the device tensors it updates

  void step(int s) {
    for (std::size_t k = 0; k < prob_.params.size(); ++k) {
      copy_box(prob_.grads[static_cast<std::size_t>(s)][k].data(), host_grads_[k].data(), prob_.params[k].shape,
               placements_[k].box, dtype_bytes(prob_.params[k].grad_dtype), true);
      grads_[k]->upload(host_grads_[k]);
    }
    REQUIRE_SA_OK(opt_.get(), sa_optimizer_step(opt_.get(), nullptr, nullptr));
    CUDA_OK(cudaDeviceSynchronize());
  }
  Bytes state_bytes(std::size_t k, const char* key) const {
    return download_view(state_view(opt_.get(), static_cast<int64_t>(k), key));
  }
  Bytes param_bytes(std::size_t k) const { return params_[k]->download(); }
  sa_optimizer* opt() const { return opt_.get(); }

 private:
  const Problem& prob_;
  std::vector<RankPlacement> placements_;
  std::vector<std::unique_ptr<DeviceTensor>> params_, grads_;
  std::vector<HostTensor> host_grads_;
  OptimizerPtr opt_;
};

std::vector<std::unique_ptr<GpuRank>> make_gpu_ranks(const Problem& prob, const Scenario& scenario,
                                                     const std::vector<Bytes>& values,
                                                     const std::vector<sa_group_config>& groups = io_groups(),
                                                     GpuState state = GpuState::device) {
  std::vector<std::unique_ptr<GpuRank>> ranks;
  for (int64_t r = 0; r < scenario.ranks; ++r)
    ranks.push_back(std::make_unique<GpuRank>(prob, scenario, r, values, groups, state));
  return ranks;
}

// Every state (and param) of a GPU rank equals the CPU rank's, bit for bit.
void check_same(const Problem& prob, const GpuRank& gpu, const Rank& cpu) {
  for (std::size_t k = 0; k < prob.params.size(); ++k) {
    INFO("param '" << prob.params[k].name << "'");
    CHECK(gpu.param_bytes(k) == cpu.param_bytes(k));
    for (const char* key : state_keys(prob.params[k])) {
      INFO("state " << key);
      CHECK(gpu.state_bytes(k, key) == cpu.state_bytes(k, key));
    }
  }
}

}  // namespace

TEST_CASE("CUDA shard files: the same bytes as the CPU's, and imports into another layout bit for bit",
          "[gpu][state_io]") {
  const Problem& prob = io_problem();
  const Scenario save = mesh_scenario("Shard(0) over 4", {4}, {shard(0)});
  auto cpu_save = make_ranks(prob, save, prob.initial_values());
  auto gpu_save = make_gpu_ranks(prob, save, prob.initial_values());
  for (int s = 0; s < kSaveAt; ++s) {
    for (auto& r : cpu_save) r->step(s);
    for (auto& r : gpu_save) r->step(s);
  }
  std::vector<Bytes> blobs;
  for (std::size_t r = 0; r < gpu_save.size(); ++r) {
    INFO("rank " << r);
    blobs.push_back(export_blob(gpu_save[r]->opt()));
    CHECK(blobs.back() == cpu_save[r]->export_blob());
  }
  const std::vector<Bytes> values = param_values(unsharded_after(prob, kSaveAt));

  for (const Scenario& load : {mesh_scenario("Shard(1) over 3", {3}, {shard(1)}),
                               mesh_scenario("2x2 Shard(0),Shard(1)", {2, 2}, {shard(0), shard(1)})}) {
    // 2 MiB: two halves of one block, one read while the other goes up (pipelined), read once.
    for (uint64_t staging : {uint64_t{0}, uint64_t{1}, uint64_t{2} << 20}) {
      INFO(load.label << ", staging_bytes " << staging);
      sa_import_options options = import_options(staging);
      options.read_once = staging == (uint64_t{2} << 20) ? 1 : 0;
      auto cpu = make_ranks(prob, load, values, other_groups());
      auto gpu = make_gpu_ranks(prob, load, values, other_groups());
      for (std::size_t r = 0; r < gpu.size(); ++r) {
        REQUIRE_SA_OK(cpu[r]->opt(), import_blobs(cpu[r]->opt(), blobs, &options));
        REQUIRE_SA_OK(gpu[r]->opt(), import_blobs(gpu[r]->opt(), blobs, &options));
        check_same(prob, *gpu[r], *cpu[r]);
        check_groups_restored(gpu[r]->opt(), io_groups(), kSaveAt);
      }
      for (int s = kSaveAt; s < kSteps; ++s) {
        for (auto& r : cpu) r->step(s);
        for (auto& r : gpu) r->step(s);
      }
      for (std::size_t r = 0; r < gpu.size(); ++r) check_same(prob, *gpu[r], *cpu[r]);
    }
  }

  // Moments flipped between float32 and bfloat16: the casts go through the pinned bounce.
  std::vector<GlobalParam> flipped = io_params();
  for (auto& p : flipped) p.moment_dtype = same_dtype(p.moment_dtype, kFloat32) ? kBfloat16 : kFloat32;
  const Problem other(flipped);
  const Scenario load = mesh_scenario("Shard(0) over 2", {2}, {shard(0)});
  auto cpu = make_ranks(other, load, values);
  auto gpu = make_gpu_ranks(other, load, values);
  for (std::size_t r = 0; r < gpu.size(); ++r) {
    INFO("casting import, rank " << r);
    REQUIRE_SA_OK(cpu[r]->opt(), import_blobs(cpu[r]->opt(), blobs));
    REQUIRE_SA_OK(gpu[r]->opt(), import_blobs(gpu[r]->opt(), blobs));
    check_same(other, *gpu[r], *cpu[r]);
  }

  // Into 8-bit moments (the saved float32 values land on the host, are quantized by each
  // shard's blocks and go up), then out again: the GPU's codes, absmax values and files
  // equal the CPU's.
  std::vector<GlobalParam> eight = io_params();
  for (auto& p : eight) p.moment_dtype = kUint8;
  const Problem q8(eight);
  auto cpu8 = make_ranks(q8, load, values);
  auto gpu8 = make_gpu_ranks(q8, load, values);
  for (std::size_t r = 0; r < gpu8.size(); ++r) {
    INFO("8-bit import, rank " << r);
    REQUIRE_SA_OK(cpu8[r]->opt(), import_blobs(cpu8[r]->opt(), blobs));
    REQUIRE_SA_OK(gpu8[r]->opt(), import_blobs(gpu8[r]->opt(), blobs));
    check_same(q8, *gpu8[r], *cpu8[r]);
    CHECK(export_blob(gpu8[r]->opt()) == cpu8[r]->export_blob());
  }

  // Those files (8-bit codes and absmax) into 8-bit moments on another layout (blocks
  // copied where the grids agree, re-quantized elsewhere) and into the float32 and
  // bfloat16 moments of io_params (decoded on the host, then up, cast through the pinned
  // bounce), staged whole and a block at a time: the GPU's states equal the CPU's.
  std::vector<Bytes> blobs8;
  for (auto& r : gpu8) blobs8.push_back(export_blob(r->opt()));
  const Scenario columns = mesh_scenario("Shard(1) over 3", {3}, {shard(1)});
  for (const Problem* into : {&q8, &prob}) {
    for (uint64_t staging : {uint64_t{0}, uint64_t{1}}) {
      auto cpu_in = make_ranks(*into, columns, values);
      auto gpu_in = make_gpu_ranks(*into, columns, values);
      const sa_import_options options = import_options(staging);
      for (std::size_t r = 0; r < gpu_in.size(); ++r) {
        INFO((into == &q8 ? "8-bit files into 8-bit moments" : "8-bit files into io_params' moments")
             << ", staging_bytes " << staging << ", rank " << r);
        REQUIRE_SA_OK(cpu_in[r]->opt(), import_blobs(cpu_in[r]->opt(), blobs8, &options));
        REQUIRE_SA_OK(gpu_in[r]->opt(), import_blobs(gpu_in[r]->opt(), blobs8, &options));
        check_same(*into, *gpu_in[r], *cpu_in[r]);
      }
    }
  }
}

// Placement is not saved: state on the host exports the bytes state on the device does, and a
// file from either loads into the other.
TEST_CASE("CUDA shard files of state on the host: the CPU's bytes, loaded across placements",
          "[gpu][state_io][offload]") {
  const Problem& prob = io_problem();
  const Scenario save = mesh_scenario("Shard(0) over 2", {2}, {shard(0)});
  auto cpu_save = make_ranks(prob, save, prob.initial_values());
  // Every placement: on the device, on the host, stepped by the CPU (by param index % 3).
  auto host_save =
      make_gpu_ranks(prob, save, prob.initial_values(), io_groups(), GpuState::all_three);
  for (int s = 0; s < kSaveAt; ++s) {
    for (auto& r : cpu_save) r->step(s);
    for (auto& r : host_save) r->step(s);
  }
  std::vector<Bytes> blobs;
  for (std::size_t r = 0; r < host_save.size(); ++r) {
    INFO("rank " << r);
    blobs.push_back(export_blob(host_save[r]->opt()));
    CHECK(blobs.back() == cpu_save[r]->export_blob());
    CHECK(export_appended(host_save[r]->opt()) == blobs.back());
    // An async export snapshots host state too.
    sa_writer writer = SA_WRITER_INIT;
    REQUIRE_SA_OK(nullptr, sa_memory_writer(&writer));
    sa_export_job* job = nullptr;
    REQUIRE_SA_OK(host_save[r]->opt(), sa_optimizer_export_async(host_save[r]->opt(), &writer, &job));
    host_save[r]->step(kSaveAt);  // changes the host state while the job writes
    CHECK(sa_export_job_wait(job) == SA_OK);
    sa_export_job_release(job);
    const void* data = nullptr;
    std::size_t size = 0;
    REQUIRE_SA_OK(nullptr, sa_memory_writer_data(&writer, &data, &size));
    CHECK(Bytes(static_cast<const unsigned char*>(data), static_cast<const unsigned char*>(data) + size) ==
          blobs.back());
    sa_writer_release(&writer);
  }
  const std::vector<Bytes> values = param_values(unsharded_after(prob, kSaveAt));
  const Scenario load = mesh_scenario("Shard(1) over 3", {3}, {shard(1)});
  for (GpuState into : {GpuState::host, GpuState::mixed, GpuState::all_three, GpuState::device}) {
    for (uint64_t staging : {uint64_t{0}, uint64_t{1}}) {
      INFO("into placement " << static_cast<int>(into) << ", staging_bytes " << staging);
      const sa_import_options options = import_options(staging);
      auto cpu = make_ranks(prob, load, values, other_groups());
      auto gpu = make_gpu_ranks(prob, load, values, other_groups(), into);
      for (std::size_t r = 0; r < gpu.size(); ++r) {
        REQUIRE_SA_OK(cpu[r]->opt(), import_blobs(cpu[r]->opt(), blobs, &options));
        REQUIRE_SA_OK(gpu[r]->opt(), import_blobs(gpu[r]->opt(), blobs, &options));
        check_same(prob, *gpu[r], *cpu[r]);
      }
      for (int s = kSaveAt; s < kSteps; ++s) {
        for (auto& r : cpu) r->step(s);
        for (auto& r : gpu) r->step(s);
      }
      for (std::size_t r = 0; r < gpu.size(); ++r) {
        check_same(prob, *gpu[r], *cpu[r]);
        CHECK(export_blob(gpu[r]->opt()) == cpu[r]->export_blob());
      }
    }
  }
}

TEST_CASE("CUDA exports: the CPU's bytes for states of 4 B to 3 MiB around 4 KiB and 1 MiB blocks, "
          "through positional and appending writers",
          "[gpu][state_io]") {
  // State bytes of 4, 4092, 4096, 4100, 1 MiB, 1 MiB + 4 KiB, ~3 MiB of float32; bfloat16
  // moments of 1998 bytes (not whole words); 8-bit codes of 3885 bytes and their absmax.
  const Problem edges({
      {"a", {1, 1}, kFloat32, kFloat32, kFloat32, SA_MASTER_NONE, 0},
      {"b", {1, 1023}, kFloat32, kFloat32, kFloat32, SA_MASTER_NONE, 0},
      {"c", {1, 1024}, kFloat32, kFloat32, kFloat32, SA_MASTER_NONE, 0},
      {"d", {1, 1025}, kFloat32, kFloat32, kFloat32, SA_MASTER_NONE, 0},
      {"e", {256, 1024}, kFloat32, kFloat32, kFloat32, SA_MASTER_NONE, 0},
      {"f", {257, 1024}, kFloat32, kFloat32, kFloat32, SA_MASTER_NONE, 0},
      {"g", {769, 1023}, kFloat32, kFloat32, kFloat32, SA_MASTER_NONE, 1},
      {"h", {3, 333}, kFloat32, kFloat32, kBfloat16, SA_MASTER_NONE, 0},
      {"q", {5, 777}, kFloat32, kFloat32, kUint8, SA_MASTER_NONE, 0},
  });
  Rank cpu(edges, unsharded_scenario(), 0, edges.initial_values());
  GpuRank gpu(edges, unsharded_scenario(), 0, edges.initial_values());
  cpu.step(0);
  gpu.step(0);
  const Bytes expected = cpu.export_blob();
  CHECK(export_blob(gpu.opt()) == expected);
  CHECK(export_appended(gpu.opt()) == expected);
}

TEST_CASE("CUDA async export: the bytes of a synchronous export at its call, steps during the write staying out",
          "[gpu][state_io]") {
  const Problem& prob = io_problem();
  GpuRank rank(prob, unsharded_scenario(), 0, prob.initial_values());
  rank.step(0);
  for (int round = 0; round < 3; ++round) {  // the first makes the pinned snapshot, the others reuse it
    INFO("async export " << round);
    const Bytes expected = export_blob(rank.opt());
    sa_writer writer = SA_WRITER_INIT;
    REQUIRE_SA_OK(nullptr, sa_memory_writer(&writer));
    sa_export_job* job = nullptr;
    REQUIRE_SA_OK(rank.opt(), sa_optimizer_export_async(rank.opt(), &writer, &job));
    rank.step(1 + round);  // changes the device state while the job checksums and writes
    CHECK(sa_export_job_wait(job) == SA_OK);
    sa_export_job_release(job);
    const void* data = nullptr;
    std::size_t size = 0;
    REQUIRE_SA_OK(nullptr, sa_memory_writer_data(&writer, &data, &size));
    CHECK(Bytes(static_cast<const unsigned char*>(data), static_cast<const unsigned char*>(data) + size) == expected);
    sa_writer_release(&writer);
    CHECK(export_blob(rank.opt()) != expected);
  }
}

TEST_CASE("CUDA export and import of ~1 GiB of state: throughput (printed)", "[gpu][state_io][bench]") {
  using Clock = std::chrono::steady_clock;
  auto seconds = [](Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); };
  constexpr int kParams = 16;
  const std::vector<int64_t> shape = {8192, 1024};  // 8M fp32 per param: 1 GiB of exp_avg + exp_avg_sq
  const int64_t n = shape[0] * shape[1];
  const double state_bytes = double(kParams) * double(n) * 8;

  // Pinned cudaMemcpy in both directions: what the link gives, in the same run.
  void* pinned = nullptr;
  void* device = nullptr;
  const std::size_t probe = std::size_t{1} << 30;
  CUDA_OK(cudaMallocHost(&pinned, probe));
  CUDA_OK(cudaMalloc(&device, probe));
  std::memset(pinned, 1, probe);
  CUDA_OK(cudaMemcpy(device, pinned, probe, cudaMemcpyHostToDevice));  // warm-up
  auto t0 = Clock::now();
  CUDA_OK(cudaMemcpy(device, pinned, probe, cudaMemcpyHostToDevice));
  const double h2d = double(probe) / seconds(t0) / 1e9;
  t0 = Clock::now();
  CUDA_OK(cudaMemcpy(pinned, device, probe, cudaMemcpyDeviceToHost));
  const double d2h = double(probe) / seconds(t0) / 1e9;
  CUDA_OK(cudaFreeHost(pinned));
  CUDA_OK(cudaFree(device));

  std::vector<std::unique_ptr<DeviceTensor>> params, grads, loaded_params;
  // Every hardware thread checksums and copies (num_threads 0), as a training process's
  // optimizer does by default: with the test default of 1 these printed one core's speed.
  OptimizerPtr saved = make_optimizer(0), loaded = make_optimizer(0);
  sa_group_config group = SA_GROUP_CONFIG_INIT;
  REQUIRE_SA_OK(saved.get(), sa_optimizer_add_group(saved.get(), &group, nullptr));
  REQUIRE_SA_OK(loaded.get(), sa_optimizer_add_group(loaded.get(), &group, nullptr));
  Rng rng(1);
  HostTensor host(shape, kFloat32);
  std::vector<const void*> grad_ptrs;
  for (int k = 0; k < kParams; ++k) {
    for (int64_t i = 0; i < n; i += 4099) host.set(i, static_cast<float>(rng.normal()));
    params.push_back(std::make_unique<DeviceTensor>(shape, kFloat32));
    params.back()->upload(host);
    grads.push_back(std::make_unique<DeviceTensor>(shape, kFloat32));
    grads.back()->upload(host);
    loaded_params.push_back(std::make_unique<DeviceTensor>(shape, kFloat32));
    const std::string name = "layers." + std::to_string(k) + ".w";
    REQUIRE_SA_OK(saved.get(), sa_optimizer_add_param(saved.get(), name.c_str(), 0, params.back()->versioned(),
                                                      nullptr, nullptr, nullptr));
    REQUIRE_SA_OK(loaded.get(), sa_optimizer_add_param(loaded.get(), name.c_str(), 0, loaded_params.back()->versioned(),
                                                       nullptr, nullptr, nullptr));
    grad_ptrs.push_back(grads.back()->data());
  }
  REQUIRE_SA_OK(saved.get(), sa_optimizer_set_grad_ptrs(saved.get(), kParams, grad_ptrs.data()));
  REQUIRE_SA_OK(saved.get(), sa_optimizer_step(saved.get(), nullptr, nullptr));
  CUDA_OK(cudaDeviceSynchronize());

  // Export to a writer that copies into a buffer sized and touched beforehand (the
  // export's own cost: two device-to-host passes through pinned staging, checksums), then
  // to a memory writer, which also grows a buffer in fresh host memory.
  Bytes blob(static_cast<std::size_t>(state_bytes) + (std::size_t{1} << 20), 0);
  struct Sink {
    Bytes* buffer;
    std::size_t size;
  } sink{&blob, 0};
  sa_writer into = SA_WRITER_INIT;
  into.ctx = &sink;
  into.write = [](void* ctx, const void* data, std::size_t bytes) {
    auto* s = static_cast<Sink*>(ctx);
    if (s->size + bytes > s->buffer->size()) return 1;
    std::memcpy(s->buffer->data() + s->size, data, bytes);
    s->size += bytes;
    return 0;
  };
  t0 = Clock::now();
  REQUIRE_SA_OK(saved.get(), sa_optimizer_export(saved.get(), &into));
  const double export_s = seconds(t0);
  // The same buffer (touched already) through write_at: the one-pass export, its chunks'
  // copies overlapping the checksums and writes of the chunk before, on all threads.
  Bytes positioned(blob.size(), 0);
  sa_writer at = SA_WRITER_INIT;
  at.ctx = &positioned;
  at.write = [](void*, const void*, std::size_t) { return 1; };  // never called
  at.write_at = [](void* ctx, uint64_t offset, const void* data, std::size_t bytes) {
    auto* b = static_cast<Bytes*>(ctx);
    if (offset + bytes > b->size()) return 1;
    std::memcpy(b->data() + offset, data, bytes);
    return 0;
  };
  t0 = Clock::now();
  REQUIRE_SA_OK(saved.get(), sa_optimizer_export(saved.get(), &at));
  const double positioned_export_s = seconds(t0);  // its staging and threads were made before: warm
  positioned.assign(positioned.size(), 0);
  t0 = Clock::now();
  REQUIRE_SA_OK(saved.get(), sa_optimizer_export(saved.get(), &at));
  const double positioned_again_s = seconds(t0);
  blob.resize(sink.size);
  positioned.resize(sink.size);
  REQUIRE(positioned == blob);
  sa_writer writer = SA_WRITER_INIT;
  REQUIRE_SA_OK(nullptr, sa_memory_writer(&writer));
  t0 = Clock::now();
  REQUIRE_SA_OK(saved.get(), sa_optimizer_export(saved.get(), &writer));
  const double memory_export_s = seconds(t0);
  sa_writer_release(&writer);
  std::printf("\nCUDA state io, %.2f GiB of fp32 Adam state (%d params [8192, 1024]) on one GPU\n",
              state_bytes / double(1 << 30), kParams);
  std::printf("  pinned cudaMemcpy: H2D %.1f GB/s, D2H %.1f GB/s\n", h2d, d2h);
  std::printf("  export into a ready host buffer:     %.3f s  %6.2f GB/s  (%.2f of D2H; appends: two passes)\n",
              export_s, state_bytes / export_s / 1e9, state_bytes / export_s / 1e9 / d2h);
  std::printf("  export into it through write_at:     %.3f s  %6.2f GB/s  (%.2f of D2H; one pass)\n",
              positioned_export_s, state_bytes / positioned_export_s / 1e9,
              state_bytes / positioned_export_s / 1e9 / d2h);
  std::printf("  the same again:                      %.3f s  %6.2f GB/s  (%.2f of D2H)\n", positioned_again_s,
              state_bytes / positioned_again_s / 1e9, state_bytes / positioned_again_s / 1e9 / d2h);
  std::printf("  export to sa_memory_writer:          %.3f s  %6.2f GB/s  (one pass into fresh memory)\n",
              memory_export_s, state_bytes / memory_export_s / 1e9);
  for (uint64_t staging_mib : {64, 256, 2048}) {
    sa_import_options options = import_options(staging_mib << 20);
    const std::vector<Bytes> blobs = {blob};
    t0 = Clock::now();
    REQUIRE_SA_OK(loaded.get(), import_blobs(loaded.get(), blobs, &options));
    const double import_s = seconds(t0);
    std::printf("  import from a memory reader, %4llu MiB staging: %.3f s  %6.2f GB/s  (%.2f of H2D)%s\n",
                static_cast<unsigned long long>(staging_mib), import_s, state_bytes / import_s / 1e9,
                state_bytes / import_s / 1e9 / h2d,
                double(staging_mib << 20) >= state_bytes ? " (one read + verify)" : " (verify pass + copy pass)");
  }
  for (int k = 0; k < kParams; ++k)
    for (const char* key : {"exp_avg", "exp_avg_sq"}) {
      INFO("param " << k << " " << key);
      REQUIRE(download_view(state_view(loaded.get(), k, key)) == download_view(state_view(saved.get(), k, key)));
    }
  saved.reset();
  loaded.reset();
}
