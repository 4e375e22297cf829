// tests/python/write_shards.cpp — writes the shard files the Python tests read with the
// real safetensors package: `shardadam_write_shards OUTDIR` trains a small model of every
// storage variant (8-bit and float8 moments among them) for 3 steps on simulated ranks of two meshes and writes, per mesh,
//   OUTDIR/<mesh>/rank<r>.safetensors   through sa_file_writer (what is being tested)
//   OUTDIR/<mesh>/manifest.json         each rank's mesh coordinate, groups, and every
//                                       state view's dtype, shape and bytes (hex)
// The manifest comes from sa_optimizer_state_view, not from the files, so the Python side
// compares what safetensors reads against what the optimizer holds.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kernels/adam_math.h"
#include "shardadam/shardadam.h"

namespace {

using nlohmann::json;
using Dims = std::vector<int64_t>;

[[noreturn]] void die(const std::string& what, const char* detail) {
  std::fprintf(stderr, "write_shards: %s: %s\n", what.c_str(), detail);
  std::exit(1);
}

void ok(sa_status status, sa_optimizer* opt, const std::string& what) {
  if (status != SA_OK) die(what, sa_optimizer_last_error(opt));
}

struct ParamSpec {
  const char* name;
  Dims shape;
  DLDataType dtype;
  DLDataType moment;
  int32_t master;
  int32_t group;
};

const DLDataType kF32{kDLFloat, 32, 1}, kBF16{kDLBfloat, 16, 1}, kF16{kDLFloat, 16, 1};
const DLDataType kU8{kDLUInt, 8, 1}, kF8{kDLFloat8_e4m3fn, 8, 1};  // block moments

const std::vector<ParamSpec> kParams = {
    {"w", {7, 5}, kF32, kF32, SA_MASTER_NONE, 0},
    {"layers.0/attn.q", {6, 4}, kBF16, kBF16, SA_MASTER_FP32, 1},
    {"r", {5, 3}, kBF16, kF32, SA_MASTER_REMAINDER, 0},
    {"h", {4, 4}, kF16, kF32, SA_MASTER_FP32, 1},
    {"cube", {3, 2, 4}, kF32, kF32, SA_MASTER_NONE, 0},
    {"e", {0, 3}, kF32, kF32, SA_MASTER_NONE, 0},
    {"q8", {9, 70}, kF32, kU8, SA_MASTER_NONE, 0},
    {"fp8.amsgrad", {7, 130}, kF32, kF8, SA_MASTER_NONE, 1},
};

int64_t numel(const Dims& d) {
  int64_t n = 1;
  for (int64_t x : d) n *= x;
  return n;
}

std::size_t size_of(DLDataType d) { return d.bits / 8u; }

// A deterministic value in [-1, 1) for (param, step, element).
float value(uint64_t seed) {
  seed = seed * 6364136223846793005ull + 1442695040888963407ull;
  seed ^= seed >> 33;
  return static_cast<float>(static_cast<double>(seed % 2000001) / 1000000.0 - 1.0);
}

void store(void* data, DLDataType d, int64_t i, float v) {
  if (d.bits == 32) {
    std::memcpy(static_cast<char*>(data) + 4 * i, &v, 4);
    return;
  }
  const uint16_t h = d.code == kDLBfloat ? sa::kernels::float_to_bf16(v) : sa::kernels::float_to_half(v);
  std::memcpy(static_cast<char*>(data) + 2 * i, &h, 2);
}

struct Tensor {
  Dims shape;
  DLDataType dtype{};
  std::vector<unsigned char> bytes;
  DLManagedTensorVersioned managed{};
  DLTensor dl() {
    DLTensor t{};
    t.data = bytes.data();
    t.device = {kDLCPU, 0};
    t.ndim = static_cast<int32_t>(shape.size());
    t.dtype = dtype;
    t.shape = shape.data();
    return t;
  }
};

std::string hex(const void* data, std::size_t n) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  const auto* p = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < n; ++i) {
    out += digits[p[i] >> 4];
    out += digits[p[i] & 15];
  }
  return out;
}

void write_mesh(const std::string& dir, const char* label, const Dims& mesh, const std::vector<sa_placement>& placements) {
  const int64_t ranks = numel(mesh);
  json manifest = {{"mesh_shape", mesh}, {"ranks", json::array()}};
  for (int64_t r = 0; r < ranks; ++r) {
    Dims coord(mesh.size());
    for (int64_t d = static_cast<int64_t>(mesh.size()) - 1, rest = r; d >= 0; --d) {
      coord[static_cast<std::size_t>(d)] = rest % mesh[static_cast<std::size_t>(d)];
      rest /= mesh[static_cast<std::size_t>(d)];
    }
    sa_optimizer* opt = nullptr;
    ok(sa_optimizer_create(nullptr, &opt), nullptr, "create");
    sa_group_config adamw = SA_GROUP_CONFIG_INIT;
    adamw.lr = 1e-2;
    sa_group_config adam = SA_GROUP_CONFIG_INIT;
    adam.lr = 3e-3;
    adam.decoupled_weight_decay = 0;
    adam.amsgrad = 1;
    ok(sa_optimizer_add_group(opt, &adamw, nullptr), opt, "add_group");
    ok(sa_optimizer_add_group(opt, &adam, nullptr), opt, "add_group");
    std::vector<std::unique_ptr<Tensor>> params, grads;
    for (std::size_t k = 0; k < kParams.size(); ++k) {
      const ParamSpec& spec = kParams[k];
      sa_layout layout = SA_LAYOUT_INIT;
      layout.ndim = static_cast<int32_t>(spec.shape.size());
      layout.global_shape = spec.shape.data();
      layout.mesh_ndim = static_cast<int32_t>(mesh.size());
      layout.mesh_shape = mesh.data();
      layout.mesh_coord = coord.data();
      layout.placements = placements.data();
      Dims local(spec.shape.size()), offset(spec.shape.size());
      ok(sa_layout_local_box(&layout, local.data(), offset.data()), nullptr, "local_box");
      auto p = std::make_unique<Tensor>();
      p->shape = local;
      p->dtype = spec.dtype;
      p->bytes.resize(static_cast<std::size_t>(numel(local)) * size_of(spec.dtype));
      for (int64_t i = 0; i < numel(local); ++i) store(p->bytes.data(), spec.dtype, i, value(k * 1000003 + static_cast<uint64_t>(i)));
      p->managed.version = {DLPACK_MAJOR_VERSION, DLPACK_MINOR_VERSION};
      p->managed.dl_tensor = p->dl();
      sa_param_options options = SA_PARAM_OPTIONS_INIT;
      options.moment_dtype = spec.moment;
      options.master = spec.master;
      ok(sa_optimizer_add_param(opt, spec.name, spec.group, &p->managed, &layout, &options, nullptr), opt,
         "add_param");
      auto g = std::make_unique<Tensor>();
      g->shape = local;
      g->dtype = spec.dtype;
      g->bytes.resize(p->bytes.size());
      params.push_back(std::move(p));
      grads.push_back(std::move(g));
    }
    for (int step = 0; step < 3; ++step) {
      for (std::size_t k = 0; k < kParams.size(); ++k) {
        Tensor& g = *grads[k];
        // By local index: replicas of one shard get the same grads, as HSDP replicas do.
        for (int64_t i = 0; i < numel(g.shape); ++i)
          store(g.bytes.data(), g.dtype, i, value(7919u * static_cast<uint64_t>(step + 1) + k * 31 + static_cast<uint64_t>(i)));
        DLTensor t = g.dl();
        ok(sa_optimizer_set_grad(opt, static_cast<int64_t>(k), &t), opt, "set_grad");
      }
      ok(sa_optimizer_step(opt, nullptr, nullptr), opt, "step");
    }
    const std::string file = "rank" + std::to_string(r) + ".safetensors";
    sa_writer writer = SA_WRITER_INIT;
    ok(sa_file_writer((dir + "/" + file).c_str(), &writer), nullptr, "file_writer");
    ok(sa_optimizer_export(opt, &writer), opt, "export");
    sa_writer_release(&writer);

    json states = json::object();
    for (std::size_t k = 0; k < kParams.size(); ++k) {
      for (const char* key : {"exp_avg", "exp_avg_sq", "max_exp_avg_sq", "master", "remainder", "exp_avg_absmax",
                              "exp_avg_sq_absmax", "max_exp_avg_sq_absmax"}) {
        DLManagedTensorVersioned* view = nullptr;
        if (sa_optimizer_state_view(opt, static_cast<int64_t>(k), key, &view) != SA_OK) continue;
        const DLTensor& t = view->dl_tensor;
        const Dims shape(t.shape, t.shape + t.ndim);
        const char* dtype = t.dtype.code == kDLInt             ? "I16"
                            : t.dtype.code == kDLBfloat        ? "BF16"
                            : t.dtype.code == kDLUInt          ? "U8"
                            : t.dtype.code == kDLFloat8_e4m3fn ? "F8_E4M3"
                                                               : "F32";
        states[std::string(kParams[k].name) + "/" + key] = {
            {"dtype", dtype}, {"shape", shape}, {"hex", hex(t.data, static_cast<std::size_t>(numel(shape)) * (t.dtype.bits / 8u))}};
        view->deleter(view);
      }
    }
    manifest["ranks"].push_back({{"file", file}, {"mesh_coord", coord}, {"states", states}});
    sa_group_config c = SA_GROUP_CONFIG_INIT;
    if (r == 0) {
      manifest["groups"] = json::array();
      for (int32_t g = 0; g < 2; ++g) {
        ok(sa_optimizer_get_group(opt, g, &c), opt, "get_group");
        int64_t s = 0;
        ok(sa_optimizer_get_step(opt, g, &s), opt, "get_step");
        manifest["groups"].push_back({{"lr", c.lr}, {"beta1", c.beta1}, {"beta2", c.beta2}, {"eps", c.eps},
                                      {"weight_decay", c.weight_decay},
                                      {"decoupled_weight_decay", c.decoupled_weight_decay},
                                      {"bias_correction", c.bias_correction}, {"maximize", c.maximize},
                                      {"amsgrad", c.amsgrad}, {"update_rule", c.update_rule},
                                      {"nesterov", c.nesterov}, {"momentum", c.momentum}, {"ns_a", c.ns_a},
                                      {"ns_b", c.ns_b}, {"ns_c", c.ns_c}, {"ns_steps", c.ns_steps},
                                      {"adjust_lr", c.adjust_lr}, {"step", s}});
      }
    }
    sa_optimizer_destroy(opt);
  }
  manifest["label"] = label;
  std::ofstream(dir + "/manifest.json") << manifest.dump(1) << "\n";
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUTDIR (OUTDIR/fsdp and OUTDIR/hsdp must exist)\n", argv[0]);
    return 2;
  }
  const std::string out = argv[1];
  write_mesh(out + "/fsdp", "Shard(0) over 3", {3}, {{SA_PLACEMENT_SHARD, 0}});
  write_mesh(out + "/hsdp", "(Replicate, Shard(0)) over 2x2", {2, 2},
             {{SA_PLACEMENT_REPLICATE, 0}, {SA_PLACEMENT_SHARD, 0}});
  std::printf("write_shards: wrote %s/fsdp and %s/hsdp\n", out.c_str(), out.c_str());
  return 0;
}
