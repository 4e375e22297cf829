// tests/test_muon_rule.cpp — a Muon group (sa_group_config.update_rule = SA_RULE_MUON)
// through the C ABI on the CPU backend: its steps against the float64 Muon of
// muon_reference.hpp, beside an AdamW group it must not disturb; its state, its shard files,
// the step arguments it honours (found_inf, inv_grad_scale, clipping), and what it refuses.
#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "muon_reference.hpp"
#include "src/errors.hpp"
#include "src/plan.hpp"
#include "test_state_io_support.hpp"
#include "test_support.hpp"
#include "test_thread_comm.hpp"

namespace {

using namespace sa_test;
using sa::test::Matrix;

// A Muon group of these fields, the others at their defaults.
sa_group_config muon_config(bool nesterov, int32_t adjust, int32_t ns_steps) {
  sa_group_config c = SA_GROUP_CONFIG_INIT;
  c.update_rule = SA_RULE_MUON;
  c.lr = 0.02;
  c.weight_decay = 0.1;
  c.eps = 1e-7;
  c.momentum = 0.9;
  c.nesterov = nesterov ? 1 : 0;
  c.adjust_lr = adjust;
  c.ns_steps = ns_steps;
  return c;
}

// The same hyperparameters as the reference takes them.
sa::kernels::MuonHyper hyper_of(const sa_group_config& c) {
  sa::kernels::MuonHyper h;
  h.lr = c.lr;
  h.weight_decay = c.weight_decay;
  h.momentum = c.momentum;
  h.nesterov = c.nesterov != 0;
  h.adjust_lr = static_cast<sa::kernels::MuonLrAdjust>(c.adjust_lr);
  h.ns.a = static_cast<float>(c.ns_a);
  h.ns.b = static_cast<float>(c.ns_b);
  h.ns.c = static_cast<float>(c.ns_c);
  h.ns.steps = c.ns_steps;
  h.ns.eps = static_cast<float>(c.eps);
  return h;
}

double max_error(const HostTensor& got, const Matrix& want) {
  double worst = 0.0;
  for (int64_t i = 0; i < got.numel(); ++i)
    worst = std::max(worst, std::abs(got.get(i) - want[static_cast<std::size_t>(i)]));
  return worst;
}

struct Shape {
  int64_t rows;
  int64_t cols;
};

// Matrices of the Muon group (wide, tall, square) and a bias in an AdamW group; grads
// bound once (their values change in place every step). The matrices and their grads are of
// `dtype` (stored as HostTensor::set rounds), their momentum_buffer of `moment` (unset: the
// library's default).
struct Model {
  std::vector<Shape> shapes{{8, 24}, {24, 8}, {17, 17}};
  std::vector<HostTensor> params, grads;
  HostTensor bias{{24}, kFloat32}, bias_grad{{24}, kFloat32};
  OptimizerPtr opt = make_optimizer();

  explicit Model(const sa_group_config& muon, DLDataType dtype = kFloat32,
                 DLDataType moment = DLDataType{0, 0, 0}) {
    const sa_group_config adamw = SA_GROUP_CONFIG_INIT;
    int32_t g = -1;
    REQUIRE_SA_OK(opt.get(), sa_optimizer_add_group(opt.get(), &adamw, &g));
    REQUIRE_SA_OK(opt.get(), sa_optimizer_add_group(opt.get(), &muon, &g));
    for (std::size_t i = 0; i < shapes.size(); ++i) {
      params.emplace_back(std::vector<int64_t>{shapes[i].rows, shapes[i].cols}, dtype);
      grads.emplace_back(std::vector<int64_t>{shapes[i].rows, shapes[i].cols}, dtype);
      const std::vector<float> start =
          sa::test::random_matrix(shapes[i].rows, shapes[i].cols, 11 + i, 1.0f);
      for (std::size_t e = 0; e < start.size(); ++e) params.back().set(static_cast<int64_t>(e), start[e]);
    }
    for (int64_t i = 0; i < bias.numel(); ++i) bias.set(i, 0.01f * static_cast<float>(i));
    sa_param_options options = SA_PARAM_OPTIONS_INIT;
    options.moment_dtype = moment;
    for (std::size_t i = 0; i < params.size(); ++i) {
      const std::string name = "w" + std::to_string(i);
      int64_t index = -1;
      REQUIRE_SA_OK(opt.get(),
                    sa_optimizer_add_param(opt.get(), name.c_str(), 1, params[i].versioned(),
                                           nullptr, moment.bits != 0 ? &options : nullptr, &index));
    }
    int64_t index = -1;
    REQUIRE_SA_OK(opt.get(), sa_optimizer_add_param(opt.get(), "bias", 0, bias.versioned(), nullptr,
                                                    nullptr, &index));
    std::vector<DLTensor> dl;
    for (const HostTensor& t : grads) dl.push_back(t.dl());
    dl.push_back(bias_grad.dl());
    std::vector<const DLTensor*> ptrs;
    for (const DLTensor& t : dl) ptrs.push_back(&t);
    REQUIRE_SA_OK(opt.get(), sa_optimizer_set_grads(opt.get(), static_cast<int64_t>(ptrs.size()),
                                                    ptrs.data()));
  }

  // Step `step`'s grads: matrix i's from a seed of its own, the bias's from another.
  std::vector<std::vector<float>> fill_grads(int step, float scale = 1.0f) {
    std::vector<std::vector<float>> out;
    for (std::size_t i = 0; i < shapes.size(); ++i) {
      std::vector<float> g =
          sa::test::random_matrix(shapes[i].rows, shapes[i].cols, 1000 * step + i, 0.01f);
      out.push_back(g);
      for (std::size_t e = 0; e < g.size(); ++e) grads[i].set(static_cast<int64_t>(e), g[e] * scale);
    }
    for (int64_t i = 0; i < bias_grad.numel(); ++i)
      bias_grad.set(i, scale * 0.001f * static_cast<float>((i * 7 + step) % 5 - 2));
    return out;
  }

  void step(const sa_step_args* args = nullptr) {
    REQUIRE_SA_OK(opt.get(), sa_optimizer_step(opt.get(), args, nullptr));
  }
};

}  // namespace

TEST_CASE("a Muon group steps each whole matrix as torch.optim.Muon does, beside an AdamW group",
          "[muon]") {
  const bool nesterov = GENERATE(true, false);
  const int32_t adjust = GENERATE(SA_MUON_LR_ORIGINAL, SA_MUON_LR_MATCH_RMS_ADAMW);
  const int32_t ns_steps = GENERATE(1, 5);
  CAPTURE(nesterov, adjust, ns_steps);
  const sa_group_config config = muon_config(nesterov, adjust, ns_steps);
  Model m(config);
  // The AdamW group alone, in an optimizer of its own: what the bias must end as.
  HostTensor lone_bias({24}, kFloat32), lone_grad({24}, kFloat32);
  OptimizerPtr lone = make_optimizer();
  const sa_group_config adamw = SA_GROUP_CONFIG_INIT;
  int32_t g = -1;
  int64_t index = -1;
  REQUIRE_SA_OK(lone.get(), sa_optimizer_add_group(lone.get(), &adamw, &g));
  std::memcpy(lone_bias.data(), m.bias.data(), m.bias.bytes());
  REQUIRE_SA_OK(lone.get(), sa_optimizer_add_param(lone.get(), "bias", 0, lone_bias.versioned(),
                                                   nullptr, nullptr, &index));
  const DLTensor lone_dl = lone_grad.dl();
  REQUIRE_SA_OK(lone.get(), sa_optimizer_set_grad(lone.get(), 0, &lone_dl));

  std::vector<Matrix> p64, buf64;
  for (const HostTensor& p : m.params) {
    p64.push_back(values_of(p));
    buf64.emplace_back(static_cast<std::size_t>(p.numel()), 0.0);
  }
  const std::vector<Matrix> start = p64;
  const sa::kernels::MuonHyper h = hyper_of(config);
  for (int step = 0; step < 4; ++step) {
    const std::vector<std::vector<float>> grads = m.fill_grads(step);
    std::memcpy(lone_grad.data(), m.bias_grad.data(), m.bias_grad.bytes());
    m.step();
    REQUIRE_SA_OK(lone.get(), sa_optimizer_step(lone.get(), nullptr, nullptr));
    for (std::size_t i = 0; i < m.shapes.size(); ++i)
      sa::test::muon_reference(p64[i], Matrix(grads[i].begin(), grads[i].end()), buf64[i],
                               m.shapes[i].rows, m.shapes[i].cols, h);
  }
  for (std::size_t i = 0; i < m.shapes.size(); ++i) {
    INFO("matrix " << i << ": " << m.shapes[i].rows << " x " << m.shapes[i].cols);
    // float32 against float64 over 4 steps, as the kernel tests bound it.
    CHECK(max_error(m.params[i], p64[i]) < 2e-5);
    const StateView buf = state_view(m.opt.get(), static_cast<int64_t>(i), "momentum_buffer");
    double worst = 0.0;
    for (int64_t e = 0; e < buf.numel(); ++e)
      worst = std::max(worst, std::abs(buf.get(e) - buf64[i][static_cast<std::size_t>(e)]));
    CHECK(worst < 1e-6);
    // It moved: 4 steps at lr 0.02 of an orthogonalized direction, far beyond the tolerance.
    CHECK(max_error(m.params[i], start[i]) > 0.01);
  }
  // The AdamW group's param is stepped as if the Muon group were not there, bit for bit.
  CHECK(m.bias.raw_bytes() == lone_bias.raw_bytes());
}

TEST_CASE("a Muon param's state is momentum_buffer alone, and shard files carry it",
          "[muon][state_io]") {
  const sa_group_config config = muon_config(true, SA_MUON_LR_ORIGINAL, 5);
  Model a(config);
  for (int step = 0; step < 2; ++step) {
    a.fill_grads(step);
    a.step();
  }
  const char* keys[8] = {};
  int32_t n = 0;
  REQUIRE_SA_OK(a.opt.get(), sa_optimizer_state_keys(a.opt.get(), 0, keys, 8, &n));
  REQUIRE(n == 1);
  CHECK(std::string(keys[0]) == "momentum_buffer");
  REQUIRE_SA_OK(a.opt.get(), sa_optimizer_state_keys(a.opt.get(), 3, keys, 8, &n));  // the bias
  CHECK(n == 2);
  CHECK(std::string(keys[0]) == "exp_avg");

  // Export from a, import into b (fresh, its params a's values): the next step is equal.
  const Bytes blob = export_blob(a.opt.get());
  CHECK(std::string(blob.begin(), blob.end()).find("w0/momentum_buffer") != std::string::npos);
  Model b(config);
  for (std::size_t i = 0; i < a.params.size(); ++i)
    std::memcpy(b.params[i].data(), a.params[i].data(), a.params[i].bytes());
  std::memcpy(b.bias.data(), a.bias.data(), a.bias.bytes());
  REQUIRE_SA_OK(b.opt.get(), import_blobs(b.opt.get(), {blob}));
  sa_group_config got = SA_GROUP_CONFIG_INIT;
  REQUIRE_SA_OK(b.opt.get(), sa_optimizer_get_group(b.opt.get(), 1, &got));
  CHECK(got.update_rule == SA_RULE_MUON);
  CHECK(got.momentum == 0.9);
  a.fill_grads(7);
  b.fill_grads(7);
  a.step();
  b.step();
  for (std::size_t i = 0; i < a.params.size(); ++i) {
    CHECK(a.params[i].raw_bytes() == b.params[i].raw_bytes());
    CHECK(state_view(a.opt.get(), static_cast<int64_t>(i), "momentum_buffer").raw_bytes() ==
          state_view(b.opt.get(), static_cast<int64_t>(i), "momentum_buffer").raw_bytes());
  }
  // A file's Muon group cannot be loaded into an AdamW group holding the same params.
  HostTensor w({8, 24}, kFloat32);  // outlives the optimizer, which owns a view of it
  OptimizerPtr adam = make_optimizer();
  const sa_group_config adamw = SA_GROUP_CONFIG_INIT;
  int32_t g = -1;
  int64_t index = -1;
  REQUIRE_SA_OK(adam.get(), sa_optimizer_add_group(adam.get(), &adamw, &g));
  REQUIRE_SA_OK(adam.get(), sa_optimizer_add_group(adam.get(), &adamw, &g));
  REQUIRE_SA_OK(adam.get(), sa_optimizer_add_param(adam.get(), "w0", 1, w.versioned(), nullptr,
                                                   nullptr, &index));
  sa_import_options options = SA_IMPORT_OPTIONS_INIT;
  options.allow_unexpected = 1;
  CHECK(import_blobs(adam.get(), {blob}, &options) != SA_OK);
}

// A bfloat16 matrix in a Muon group: a float32 master beside momentum_buffer; with bfloat16
// grads and a float32 buffer its master steps as a float32 matrix of the same values does,
// bit for bit, and the param is its master rounded; with a bfloat16 buffer too, shard files
// carry both states and the next step after an import is the same.
TEST_CASE("a Muon group over bfloat16 matrices: a float32 master, bfloat16 grads and buffer",
          "[muon][state_io]") {
  const sa_group_config config = muon_config(true, SA_MUON_LR_ORIGINAL, 5);
  Model half(config, kBfloat16), whole(config);
  for (std::size_t i = 0; i < half.params.size(); ++i)  // whole starts from the rounded values
    for (int64_t e = 0; e < half.params[i].numel(); ++e)
      whole.params[i].set(e, half.params[i].get(e));
  const char* keys[8] = {};
  int32_t n = 0;
  REQUIRE_SA_OK(half.opt.get(), sa_optimizer_state_keys(half.opt.get(), 0, keys, 8, &n));
  REQUIRE(n == 2);
  CHECK(std::string(keys[0]) == "momentum_buffer");
  CHECK(std::string(keys[1]) == "master");
  for (int step = 0; step < 3; ++step) {
    half.fill_grads(step);
    whole.fill_grads(step);
    for (std::size_t i = 0; i < half.grads.size(); ++i)  // whole's grads: the bfloat16 values
      for (int64_t e = 0; e < half.grads[i].numel(); ++e)
        whole.grads[i].set(e, half.grads[i].get(e));
    half.step();
    whole.step();
  }
  for (std::size_t i = 0; i < half.params.size(); ++i) {
    INFO("matrix " << i);
    const int64_t index = static_cast<int64_t>(i);
    CHECK(state_view(half.opt.get(), index, "master").raw_bytes() == whole.params[i].raw_bytes());
    CHECK(state_view(half.opt.get(), index, "momentum_buffer").raw_bytes() ==
          state_view(whole.opt.get(), index, "momentum_buffer").raw_bytes());
    HostTensor rounded({whole.shapes[i].rows, whole.shapes[i].cols}, kBfloat16);
    for (int64_t e = 0; e < rounded.numel(); ++e) rounded.set(e, whole.params[i].get(e));
    CHECK(half.params[i].raw_bytes() == rounded.raw_bytes());
  }

  Model a(config, kBfloat16, kBfloat16), b(config, kBfloat16, kBfloat16);
  for (int step = 0; step < 2; ++step) {
    a.fill_grads(step);
    a.step();
  }
  CHECK(state_view(a.opt.get(), 0, "momentum_buffer").raw_bytes().size() ==
        static_cast<std::size_t>(2 * a.params[0].numel()));  // kept in bfloat16
  const Bytes blob = export_blob(a.opt.get());
  for (std::size_t i = 0; i < a.params.size(); ++i)
    std::memcpy(b.params[i].data(), a.params[i].data(), a.params[i].bytes());
  std::memcpy(b.bias.data(), a.bias.data(), a.bias.bytes());
  REQUIRE_SA_OK(b.opt.get(), import_blobs(b.opt.get(), {blob}));
  a.fill_grads(7);
  b.fill_grads(7);
  a.step();
  b.step();
  for (std::size_t i = 0; i < a.params.size(); ++i) {
    const int64_t index = static_cast<int64_t>(i);
    CHECK(a.params[i].raw_bytes() == b.params[i].raw_bytes());
    for (const char* key : {"momentum_buffer", "master"})
      CHECK(state_view(a.opt.get(), index, key).raw_bytes() ==
            state_view(b.opt.get(), index, key).raw_bytes());
  }
}

TEST_CASE("a Muon step honours found_inf, inv_grad_scale and clipping", "[muon][step_args]") {
  const sa_group_config config = muon_config(true, SA_MUON_LR_ORIGINAL, 5);
  Model a(config), b(config);
  // found_inf set: nothing moves, the momentum included.
  const float inf_flag = 1.0f;
  sa_step_args skip = SA_STEP_ARGS_INIT;
  skip.found_inf = &inf_flag;
  a.fill_grads(0);
  const std::vector<unsigned char> before = a.params[0].raw_bytes();
  a.step(&skip);
  CHECK(a.params[0].raw_bytes() == before);
  for (int64_t e = 0; e < 8 * 24; ++e)
    CHECK(state_view(a.opt.get(), 0, "momentum_buffer").get(e) == 0.0);
  // Grads twice as large with inv_grad_scale 0.5: the same step bit for bit (both exact).
  const float half = 0.5f;
  sa_step_args scaled = SA_STEP_ARGS_INIT;
  scaled.inv_grad_scale = &half;
  a.fill_grads(1, 2.0f);
  a.step(&scaled);
  b.fill_grads(1);
  b.step();
  for (std::size_t i = 0; i < a.params.size(); ++i)
    CHECK(a.params[i].raw_bytes() == b.params[i].raw_bytes());

  // Clipping: the grads (the bias's too) scaled by max_norm / (norm + 1e-6), computed here
  // in float64 from every grad.
  Model c(config);
  const std::vector<std::vector<float>> grads = c.fill_grads(2);
  double squares = 0.0;
  for (const auto& g : grads)
    for (float x : g) squares += static_cast<double>(x) * x;
  for (int64_t i = 0; i < c.bias_grad.numel(); ++i)
    squares += static_cast<double>(c.bias_grad.get(i)) * c.bias_grad.get(i);
  const double norm = std::sqrt(squares), max_norm = norm / 4;
  const double factor = max_norm / (norm + 1e-6);
  sa_step_args clip = SA_STEP_ARGS_INIT;
  clip.max_grad_norm = max_norm;
  std::vector<Matrix> p64;
  for (const HostTensor& p : c.params) p64.push_back(values_of(p));
  c.step(&clip);
  for (std::size_t i = 0; i < c.params.size(); ++i) {
    Matrix g(grads[i].begin(), grads[i].end()), buf(g.size(), 0.0);
    for (double& x : g) x *= factor;
    sa::test::muon_reference(p64[i], g, buf, c.shapes[i].rows, c.shapes[i].cols, hyper_of(config));
    CHECK(max_error(c.params[i], p64[i]) < 1e-5);
    // The momentum holds the clipped grads (1 - momentum of them, from zero).
    const StateView mb = state_view(c.opt.get(), static_cast<int64_t>(i), "momentum_buffer");
    CHECK(std::abs(mb.get(3) - buf[3]) < 1e-7);
    CHECK(std::abs(mb.get(3)) < 0.5 * std::abs((1 - config.momentum) * grads[i][3]) + 1e-9);
  }
}

TEST_CASE("Muon refuses, by name, the params and groups it cannot step", "[muon][errors]") {
  HostTensor w({4, 4}, kFloat32);  // outlives the optimizer, which owns a view of it
  OptimizerPtr opt = make_optimizer();
  const sa_group_config muon = muon_config(true, SA_MUON_LR_ORIGINAL, 5);
  int32_t g = -1;
  int64_t index = -1;
  REQUIRE_SA_OK(opt.get(), sa_optimizer_add_group(opt.get(), &muon, &g));
  HostTensor vec({16}, kFloat32), cube({2, 3, 4}, kFloat32), half({4, 4}, kFloat16),
      bf16({4, 4}, kBfloat16);
  CHECK_SA_FAILS(opt.get(), SA_ERR_INVALID_ARGUMENT,
                 sa_optimizer_add_param(opt.get(), "norm.weight", 0, vec.versioned(), nullptr,
                                        nullptr, &index),
                 "param 'norm.weight'", "SA_RULE_MUON", "2-D", "[16]", "AdamW group");
  CHECK_SA_FAILS(
      opt.get(), SA_ERR_INVALID_ARGUMENT,
      sa_optimizer_add_param(opt.get(), "conv", 0, cube.versioned(), nullptr, nullptr, &index),
      "param 'conv'", "[2, 3, 4]");
  CHECK_SA_FAILS(
      opt.get(), SA_ERR_UNSUPPORTED,
      sa_optimizer_add_param(opt.get(), "h", 0, half.versioned(), nullptr, nullptr, &index),
      "param 'h'", "Muon steps float32 or bfloat16 with a float32 master params",
      "this param is float16");
  sa_param_options remainder = SA_PARAM_OPTIONS_INIT;
  remainder.master = SA_MASTER_REMAINDER;
  CHECK_SA_FAILS(
      opt.get(), SA_ERR_UNSUPPORTED,
      sa_optimizer_add_param(opt.get(), "r", 0, bf16.versioned(), nullptr, &remainder, &index),
      "param 'r'", "this param is bfloat16 with a remainder master");
  CHECK(sa_optimizer_num_params(opt.get()) == 0);
  // What a Muon group cannot mean.
  for (const char* field : {"maximize", "amsgrad", "decoupled_weight_decay"}) {
    INFO(field);
    const double value = std::string(field) == "decoupled_weight_decay" ? 0.0 : 1.0;
    const char* const names[] = {"update_rule", field};
    const double values[] = {SA_RULE_MUON, value};
    CHECK_SA_FAILS(opt.get(), SA_ERR_INVALID_ARGUMENT,
                   sa_optimizer_add_group_fields(opt.get(), 2, names, values, &g), field,
                   "SA_RULE_MUON");
  }
  CHECK(sa_optimizer_num_groups(opt.get()) == 1);
  // The rule is fixed once the group holds a param.
  REQUIRE_SA_OK(opt.get(),
                sa_optimizer_add_param(opt.get(), "w", 0, w.versioned(), nullptr, nullptr, &index));
  const char* const rule[] = {"update_rule"};
  const double adamw[] = {SA_RULE_ADAMW};
  CHECK_SA_FAILS(opt.get(), SA_ERR_STATE,
                 sa_optimizer_set_group_fields(opt.get(), 0, 1, rule, adamw), "update_rule",
                 "cannot change once the group holds params");
  const char* const steps[] = {"ns_steps"};
  const double bad_steps[] = {100.0};
  CHECK_SA_FAILS(opt.get(), SA_ERR_INVALID_ARGUMENT,
                 sa_optimizer_set_group_fields(opt.get(), 0, 1, steps, bad_steps),
                 "ns_steps is 100", "0 to 99");
}

// ---- matrices split across ranks -----------------------------------------------------------

namespace {

// One split of a rows x cols matrix over a mesh of 4 ranks (row-major coordinates).
struct Split {
  const char* what;
  int64_t rows, cols;
  std::vector<int64_t> mesh;
  std::vector<sa_placement> placements;
};

// Each rank holds this many copies of the split matrix (the same values and grads), which
// are split matrices of their own: with ranks that say their numbers, each copy gets
// another owner (equal flops: rank 0, 1, 2), whose result every rank must receive.
constexpr int kCopies = 3;

// What a rank ends with: its box of each copy's param, momentum and master (bfloat16 params),
// as floats, and where the box is.
struct RankResult {
  sa_status status = SA_OK;
  std::string error;
  std::vector<int64_t> offset, shape;
  std::vector<std::vector<float>> param, momentum, master;  // by copy
};

// The n elements of a float32 or bfloat16 array as floats.
std::vector<float> floats_from(const void* data, DLDataType dtype, int64_t n) {
  std::vector<float> out(static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < out.size(); ++i) {
    if (dtype.bits == 32) {
      std::memcpy(&out[i], static_cast<const char*>(data) + 4 * i, 4);
    } else {
      uint16_t h = 0;
      std::memcpy(&h, static_cast<const char*>(data) + 2 * i, 2);
      const uint32_t bits = static_cast<uint32_t>(h) << 16;
      std::memcpy(&out[i], &bits, 4);
    }
  }
  return out;
}

// A step's grads of the whole matrix: the same on every rank and in the reference.
std::vector<float> whole_grad(const Split& s, int step) {
  return sa::test::random_matrix(s.rows, s.cols, 500 + step, 0.01f);
}

// The rows x cols box at (r0, c0) of a row-major matrix with `cols` columns.
std::vector<float> box_of(const std::vector<float>& m, int64_t cols,
                          const std::vector<int64_t>& offset, const std::vector<int64_t>& shape) {
  std::vector<float> out;
  for (int64_t r = 0; r < shape[0]; ++r)
    for (int64_t c = 0; c < shape[1]; ++c) out.push_back(m[(offset[0] + r) * cols + offset[1] + c]);
  return out;
}

// Rank `rank` of the split: its box of each copy of the matrix in a Muon group (with a
// whole 5 x 3 matrix beside them), three steps; no Catch2 macros (it runs on a thread of
// its own). `coordinate_of` >= 0: it gives that rank's mesh coordinate instead of its own.
// The copies, their grads and their momentum_buffer are of `dtype` (bfloat16: with a
// float32 master).
RankResult run_rank(const Split& s, const sa_group_config& config, int rank, sa_comm* comm,
                    int coordinate_of = -1, DLDataType dtype = kFloat32) {
  RankResult out;
  auto fail = [&](sa_status st, sa_optimizer* opt) {
    out.status = st;
    out.error = opt != nullptr ? sa_optimizer_last_error(opt) : sa_last_error();
    return out;
  };
  std::vector<int64_t> coord(s.mesh.size());
  for (int64_t r = coordinate_of >= 0 ? coordinate_of : rank,
               d = static_cast<int64_t>(s.mesh.size()) - 1;
       d >= 0; --d) {
    coord[static_cast<std::size_t>(d)] = r % s.mesh[static_cast<std::size_t>(d)];
    r /= s.mesh[static_cast<std::size_t>(d)];
  }
  MeshLayout mesh{{s.rows, s.cols}, s.mesh, coord, s.placements};
  const sa_layout layout = mesh.get();
  out.offset.assign(2, 0);
  out.shape.assign(2, 0);
  if (sa_status st = sa_layout_local_box(&layout, out.shape.data(), out.offset.data()); st != SA_OK)
    return fail(st, nullptr);
  const std::vector<float> start =
      box_of(sa::test::random_matrix(s.rows, s.cols, 77, 1.0f), s.cols, out.offset, out.shape);
  std::vector<HostTensor> w, g;
  for (int c = 0; c < kCopies; ++c) {
    w.emplace_back(out.shape, dtype);
    g.emplace_back(out.shape, dtype);
    for (std::size_t i = 0; i < start.size(); ++i)  // (an empty shard's is empty)
      w.back().set(static_cast<int64_t>(i), start[i]);
  }
  sa_param_options options = SA_PARAM_OPTIONS_INIT;
  options.moment_dtype = dtype;
  HostTensor v({5, 3}, kFloat32), vg({5, 3}, kFloat32);
  sa_optimizer_config oc = SA_OPTIMIZER_CONFIG_INIT;
  oc.num_threads = 1;
  sa_optimizer* raw = nullptr;
  if (sa_status st = sa_optimizer_create(&oc, &raw); st != SA_OK) return fail(st, nullptr);
  OptimizerPtr opt(raw);
  int32_t group = -1;
  int64_t index = -1;
  sa_status st = sa_optimizer_set_comm(opt.get(), comm);
  if (st == SA_OK) st = sa_optimizer_add_group(opt.get(), &config, &group);
  for (int c = 0; c < kCopies && st == SA_OK; ++c)
    st = sa_optimizer_add_param(opt.get(), ("w" + std::to_string(c)).c_str(), 0,
                                w[static_cast<std::size_t>(c)].versioned(), &layout, &options,
                                &index);
  if (st == SA_OK)
    st = sa_optimizer_add_param(opt.get(), "v", 0, v.versioned(), nullptr, nullptr, &index);
  std::vector<DLTensor> dl;
  for (const HostTensor& t : g) dl.push_back(t.dl());
  dl.push_back(vg.dl());
  std::vector<const DLTensor*> grads;
  for (const DLTensor& t : dl) grads.push_back(&t);
  if (st == SA_OK) st = sa_optimizer_set_grads(opt.get(), kCopies + 1, grads.data());
  for (int step = 0; step < 3 && st == SA_OK; ++step) {
    const std::vector<float> box = box_of(whole_grad(s, step), s.cols, out.offset, out.shape);
    for (HostTensor& t : g)
      for (std::size_t i = 0; i < box.size(); ++i) t.set(static_cast<int64_t>(i), box[i]);
    for (int64_t i = 0; i < 15; ++i) vg.set(i, 0.01f * static_cast<float>(i % 4 - 1));
    st = sa_optimizer_step(opt.get(), nullptr, nullptr);
  }
  if (st != SA_OK) return fail(st, opt.get());
  for (int c = 0; c < kCopies; ++c) {
    const HostTensor& t = w[static_cast<std::size_t>(c)];
    out.param.push_back(floats_from(t.data(), dtype, t.numel()));
    out.momentum.emplace_back();
    out.master.emplace_back();
    if (t.numel() == 0) continue;
    for (const std::string key : {"momentum_buffer", "master"}) {
      if (dtype.bits == 32 && key == "master") continue;
      DLManagedTensorVersioned* view = nullptr;
      if ((st = sa_optimizer_state_view(opt.get(), c, key.c_str(), &view)) != SA_OK)
        return fail(st, opt.get());
      (key == "master" ? out.master : out.momentum).back() =
          floats_from(view->dl_tensor.data, view->dl_tensor.dtype, t.numel());
      view->deleter(view);
    }
  }
  return out;
}

// Both ranks of a 6 x 4 matrix split by rows over 2 threads (run_rank), each giving rank
// `coordinate_of`'s mesh coordinate when it is >= 0.
std::vector<RankResult> run_two_ranks_by_rows(const ThreadComms& comms, int coordinate_of = -1) {
  const Split split{"Shard(0)", 6, 4, {2}, {shard(0)}};
  const sa_group_config config = muon_config(true, SA_MUON_LR_ORIGINAL, 5);
  std::vector<RankResult> results(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      results[static_cast<std::size_t>(r)] = run_rank(split, config, r, comms[r], coordinate_of);
    });
  for (std::thread& t : threads) t.join();
  return results;
}

}  // namespace

TEST_CASE("a Muon matrix split across 4 ranks steps as the whole matrix does on one, bit for bit",
          "[muon][sharded]") {
  const sa_placement s0 = shard(0), s1 = shard(1), rep = replicate();
  const std::vector<Split> splits = {
      {"Shard(0), uneven rows (3, 3, 3, 1)", 10, 12, {4}, {s0}},
      {"Shard(1), uneven columns (2, 2, 2, 1)", 9, 7, {4}, {s1}},
      {"Shard(0) with an empty shard (1, 1, 1, 0)", 3, 8, {4}, {s0}},
      {"HSDP 2 x 2: Replicate, Shard(0)", 11, 6, {2, 2}, {rep, s0}},
      {"TP x FSDP 2 x 2: Shard(1), Shard(0)", 8, 10, {2, 2}, {s1, s0}},
  };
  const sa_group_config config = muon_config(true, SA_MUON_LR_ORIGINAL, 5);
  // float32 matrices; bfloat16 ones with a float32 master and a bfloat16 momentum_buffer.
  const DLDataType dtype = GENERATE(kFloat32, kBfloat16);
  CAPTURE(static_cast<int>(dtype.bits));
  for (const Split& s : splits) {
    INFO(s.what);
    // The whole matrix on one rank.
    HostTensor w({s.rows, s.cols}, dtype), g({s.rows, s.cols}, dtype);
    OptimizerPtr one = make_optimizer();  // after w: w outlives it
    const std::vector<float> start = sa::test::random_matrix(s.rows, s.cols, 77, 1.0f);
    for (std::size_t i = 0; i < start.size(); ++i) w.set(static_cast<int64_t>(i), start[i]);
    const std::vector<float> stored = floats_from(w.data(), dtype, w.numel());
    int32_t group = -1;
    int64_t index = -1;
    sa_param_options options = SA_PARAM_OPTIONS_INIT;
    options.moment_dtype = dtype;
    REQUIRE_SA_OK(one.get(), sa_optimizer_add_group(one.get(), &config, &group));
    REQUIRE_SA_OK(one.get(), sa_optimizer_add_param(one.get(), "w", 0, w.versioned(), nullptr,
                                                    &options, &index));
    const DLTensor gd = g.dl();
    REQUIRE_SA_OK(one.get(), sa_optimizer_set_grad(one.get(), 0, &gd));
    for (int step = 0; step < 3; ++step) {
      const std::vector<float> grad = whole_grad(s, step);
      for (std::size_t i = 0; i < grad.size(); ++i) g.set(static_cast<int64_t>(i), grad[i]);
      REQUIRE_SA_OK(one.get(), sa_optimizer_step(one.get(), nullptr, nullptr));
    }
    const std::vector<float> whole = floats_from(w.data(), dtype, w.numel());
    const StateView mb = state_view(one.get(), 0, "momentum_buffer");
    const std::vector<float> whole_mb = floats_from(mb.data(), dtype, mb.numel());
    std::vector<float> whole_master;
    if (dtype.bits == 16) {
      const StateView master = state_view(one.get(), 0, "master");
      whole_master = floats_from(master.data(), kFloat32, master.numel());
    }
    CHECK(whole != stored);  // the steps moved it
    // The same on 4 threaded ranks: each copy orthogonalized by its owner (ranks that say
    // their numbers: boxes exchanged through all_to_all, or through all_reduce without
    // one), or on every rank (ranks that do not: summed whole).
    struct Mode {
      const char* what;
      bool said, all_to_all;
    };
    for (const Mode mode : {Mode{"ranks said, all_to_all: one owner a matrix", true, true},
                            Mode{"ranks said, no all_to_all: one owner, through all_reduce", true,
                                 false},
                            Mode{"ranks unsaid: every rank, summed whole", false, false}}) {
      INFO(mode.what);
      ThreadComms comms(4, mode.said, -1, mode.all_to_all);
      std::vector<RankResult> results(4);
      std::vector<std::thread> threads;
      for (int r = 0; r < 4; ++r)
        threads.emplace_back([&, r] {
          results[static_cast<std::size_t>(r)] = run_rank(s, config, r, comms[r], -1, dtype);
        });
      for (std::thread& t : threads) t.join();
      int64_t covered = 0;
      for (int r = 0; r < 4; ++r) {
        const RankResult& got = results[static_cast<std::size_t>(r)];
        INFO("rank " << r << ": " << got.error);
        REQUIRE(got.status == SA_OK);
        for (int c = 0; c < kCopies; ++c) {
          INFO("copy " << c);
          CHECK(got.param[static_cast<std::size_t>(c)] ==
                box_of(whole, s.cols, got.offset, got.shape));
          CHECK(got.momentum[static_cast<std::size_t>(c)] ==
                box_of(whole_mb, s.cols, got.offset, got.shape));
          if (dtype.bits == 16)
            CHECK(got.master[static_cast<std::size_t>(c)] ==
                  box_of(whole_master, s.cols, got.offset, got.shape));
        }
        covered += got.shape[0] * got.shape[1];
      }
      const int64_t replicas = s.placements[0].type == SA_PLACEMENT_REPLICATE ? 2 : 1;
      CHECK(covered == replicas * s.rows * s.cols);  // every element on some rank
    }
  }
}

namespace {

// Three ranks' boxes of five split matrices (rows, cols, row0, col0, box_rows, box_cols):
// m0 16 x 16 in rows 6, 6, 4; m1 8 x 8 in columns 3, 3, 2; m2 4 x 8 whole on ranks 0 and 2
// (replicas), none on 1; m3 8 x 4 in rows 4, 4 on ranks 0 and 1; m4 2 x 2 on rank 0 alone.
const std::vector<sa::kernels::MatrixBox> kBoxes = {
    {16, 16, 0, 0, 6, 16}, {8, 8, 0, 0, 8, 3}, {4, 8, 0, 0, 4, 8}, {8, 4, 0, 0, 4, 4}, {2, 2, 0, 0, 2, 2},
    {16, 16, 6, 0, 6, 16}, {8, 8, 0, 3, 8, 3}, {4, 8, 0, 0, 0, 0}, {8, 4, 4, 0, 4, 4}, {2, 2, 0, 0, 0, 0},
    {16, 16, 12, 0, 4, 16}, {8, 8, 0, 6, 8, 2}, {4, 8, 0, 0, 4, 8}, {8, 4, 0, 0, 0, 0}, {2, 2, 0, 0, 0, 0},
};

// Rank `rank`'s plan of those matrices, not laid out yet.
sa::Plan plan_of_rank(int rank) {
  sa::Plan plan;
  for (std::size_t m = 0; m < 5; ++m)
    plan.gathered.push_back({kBoxes[static_cast<std::size_t>(rank) * 5 + m], static_cast<int64_t>(m), true});
  return plan;
}

using Copy = std::array<int64_t, 6>;      // from, from_ld, to, to_ld, rows, cols
using Move = std::array<int64_t, 3>;      // peer, at, count
std::vector<Copy> copies(const std::vector<sa::BoxCopy>& v) {
  std::vector<Copy> out;
  for (const sa::BoxCopy& c : v) out.push_back({c.from, c.from_ld, c.to, c.to_ld, c.rows, c.cols});
  return out;
}
std::vector<Move> moves(const std::vector<sa::Transfer>& v) {
  std::vector<Move> out;
  for (const sa::Transfer& t : v) out.push_back({t.peer, t.at, t.count});
  return out;
}

}  // namespace

TEST_CASE("split Muon matrices get owners balanced by Newton-Schulz's flops among their holders, "
          "and each rank holds its boxes and its owned matrices",
          "[muon][sharded]") {
  // Largest first, each to the least loaded rank that holds a box of it (the lowest on a
  // tie): m0 (16^2 16 = 4096 flops) -> 0; m1 (512) -> 1; m2 (4^2 8 = 128; held by 0 and 2)
  // -> 2; m3 (128; held by 0 and 1, loads 4096 and 512) -> 1; m4 (8; held by 0 alone) -> 0.
  const std::vector<int> owners = {0, 1, 2, 1, 0};
  std::vector<sa::Plan> plans;
  for (int r = 0; r < 3; ++r) {
    plans.push_back(plan_of_rank(r));
    sa::lay_out_gathered(plans.back(), r, 3, kBoxes);
    for (std::size_t m = 0; m < 5; ++m) {
      INFO("rank " << r << ", matrix " << m);
      CHECK((plans.back().gathered[m].whole >= 0) == (owners[m] == r));
    }
  }
  // Rank 0: its boxes, each on its own (96 + 24 + 32 + 16 + 4 doubles), then m0 and m4 whole.
  const sa::Plan& p0 = plans[0];
  CHECK(p0.gather_zero == 172);
  CHECK(p0.gathered[0].whole == 172);
  CHECK(p0.gathered[4].whole == 428);
  CHECK(p0.gather_elems == 432);  // no staging: what it receives is whole rows
  CHECK(p0.gathered[3].dir == 152);
  CHECK(p0.gathered[3].ld == 4);
  // m2's replicas: rank 2, the owner, holds one, so it sends its own, not rank 0's.
  CHECK(!p0.gathered[2].contributes);
  CHECK(p0.gathered[0].contributes);
  CHECK(copies(p0.to_owners.before) == std::vector<Copy>{{0, 16, 172, 16, 6, 16}, {168, 2, 428, 2, 2, 2}});
  CHECK(moves(p0.to_owners.sends) == std::vector<Move>{{1, 96, 24}, {1, 152, 16}});
  CHECK(moves(p0.to_owners.recvs) == std::vector<Move>{{1, 172 + 6 * 16, 96}, {2, 172 + 12 * 16, 64}});
  CHECK(p0.to_owners.after.empty());
  CHECK(copies(p0.from_owners.before) ==
        std::vector<Copy>{{172, 16, 0, 16, 6, 16}, {428, 2, 168, 2, 2, 2}});
  CHECK(moves(p0.from_owners.sends) == std::vector<Move>{{1, 268, 96}, {2, 364, 64}});
  CHECK(moves(p0.from_owners.recvs) == std::vector<Move>{{1, 96, 24}, {2, 120, 32}, {1, 152, 16}});
  // Rank 1: boxes (96 + 24 + 0 + 16 + 0), m1 and m3 whole, then staging for m1's column
  // boxes, which are not runs of their whole.
  const sa::Plan& p1 = plans[1];
  CHECK(p1.gather_zero == 136);
  CHECK(p1.gathered[1].whole == 136);
  CHECK(p1.gathered[3].whole == 200);
  CHECK(p1.gather_elems == 232 + 24 + 16);
  CHECK(copies(p1.to_owners.before) == std::vector<Copy>{{96, 3, 139, 8, 8, 3}, {120, 4, 216, 4, 4, 4}});
  CHECK(moves(p1.to_owners.sends) == std::vector<Move>{{0, 0, 96}});
  CHECK(moves(p1.to_owners.recvs) == std::vector<Move>{{0, 232, 24}, {2, 256, 16}, {0, 200, 16}});
  CHECK(copies(p1.to_owners.after) == std::vector<Copy>{{232, 3, 136, 8, 8, 3}, {256, 2, 142, 8, 8, 2}});
  CHECK(copies(p1.from_owners.before) ==
        std::vector<Copy>{{136, 8, 232, 3, 8, 3}, {139, 8, 96, 3, 8, 3}, {142, 8, 256, 2, 8, 2},
                          {216, 4, 120, 4, 4, 4}});
  CHECK(moves(p1.from_owners.sends) == std::vector<Move>{{0, 232, 24}, {2, 256, 16}, {0, 200, 16}});
  CHECK(moves(p1.from_owners.recvs) == std::vector<Move>{{0, 0, 96}});
  // Every pair's sends and receives match, in order: what NCCL and all_to_all need.
  for (const bool back : {false, true})
    for (int a = 0; a < 3; ++a)
      for (int b = 0; b < 3; ++b) {
        INFO((back ? "back" : "to owners") << ": " << a << " -> " << b);
        auto counts = [&](const std::vector<sa::Transfer>& v, int peer) {
          std::vector<int64_t> out;
          for (const sa::Transfer& t : v)
            if (t.peer == peer) out.push_back(t.count);
          return out;
        };
        const sa::MatrixExchange& xa = back ? plans[a].from_owners : plans[a].to_owners;
        const sa::MatrixExchange& xb = back ? plans[b].from_owners : plans[b].to_owners;
        CHECK(counts(xa.sends, b) == counts(xb.recvs, a));
      }
  // With default rounds, one round; with at most 3 transfers a rank a round, every rank cuts
  // the same rounds ({m0}, {m1, m2}, {m3, m4}: m1 would take rank 0 to 4, m3 rank 1 to 5),
  // and each round's sends are received in that round.
  CHECK(p0.to_owners.rounds.size() == 1);
  std::vector<sa::Plan> small;
  for (int r = 0; r < 3; ++r) {
    small.push_back(plan_of_rank(r));
    sa::lay_out_gathered(small.back(), r, 3, kBoxes, 3);
  }
  using Ends = std::vector<std::pair<std::size_t, std::size_t>>;
  auto ends = [](const sa::MatrixExchange& x) {
    Ends out;
    for (const auto& round : x.rounds) out.emplace_back(round.sends_end, round.recvs_end);
    return out;
  };
  CHECK(ends(small[0].to_owners) == Ends{{0, 2}, {1, 2}, {2, 2}});
  CHECK(ends(small[0].from_owners) == Ends{{2, 0}, {2, 2}, {2, 3}});
  for (const bool back : {false, true})
    for (std::size_t round = 0; round < 3; ++round)
      for (int a = 0; a < 3; ++a)
        for (int b = 0; b < 3; ++b) {
          INFO((back ? "back" : "to owners") << ", round " << round << ": " << a << " -> " << b);
          auto counts = [&](const sa::MatrixExchange& x, bool sends, int peer) {
            REQUIRE(x.rounds.size() == 3);
            const std::vector<sa::Transfer>& v = sends ? x.sends : x.recvs;
            const std::size_t first =
                round == 0 ? 0 : (sends ? x.rounds[round - 1].sends_end : x.rounds[round - 1].recvs_end);
            const std::size_t last = sends ? x.rounds[round].sends_end : x.rounds[round].recvs_end;
            std::vector<int64_t> out;
            for (std::size_t i = first; i < last; ++i)
              if (v[i].peer == peer) out.push_back(v[i].count);
            return out;
          };
          const sa::Plan& pa = small[static_cast<std::size_t>(a)];
          const sa::Plan& pb = small[static_cast<std::size_t>(b)];
          CHECK(counts(back ? pa.from_owners : pa.to_owners, true, b) ==
                counts(back ? pb.from_owners : pb.to_owners, false, a));
        }
  // One rank of its own: summed, every matrix whole in param order, each box inside it.
  sa::Plan one = plan_of_rank(1);
  sa::lay_out_gathered(one, 0, 1);
  CHECK(one.gather_elems == 256 + 64 + 32 + 32 + 4);
  CHECK(one.gather_zero == one.gather_elems);
  CHECK(one.gathered[1].whole == 256);
  CHECK(one.gathered[1].dir == 256 + 3);  // rank 1's columns 3..5 of m1
  CHECK(one.gathered[1].ld == 8);
  CHECK(one.to_owners.sends.empty());
}

TEST_CASE("split Muon matrices whose ranks' boxes do not cover them exactly once are refused, "
          "changing nothing",
          "[muon][sharded][errors]") {
  auto refused = [](std::vector<sa::kernels::MatrixBox> boxes, const char* what) {
    sa::Plan plan = plan_of_rank(0);
    sa::lay_out_gathered(plan, 0, 3, kBoxes);
    const std::vector<Move> before = moves(plan.to_owners.sends);
    try {
      sa::lay_out_gathered(plan, 0, 3, boxes);
      FAIL("laid out");
    } catch (const sa::Error& e) {
      CHECK(e.status() == SA_ERR_MISMATCH);
      CHECK_THAT(e.what(), Catch::Contains(what));
    }
    CHECK(moves(plan.to_owners.sends) == before);  // as it was
    CHECK(plan.gather_ranks == 3);
  };
  std::vector<sa::kernels::MatrixBox> overlap = kBoxes;
  overlap[5].row0 = 5;  // rank 1's rows of m0 from 5: one row also rank 0's
  refused(overlap, "rank 0's box (offset [0, 0] shape [6, 16]) and rank 1's box");
  std::vector<sa::kernels::MatrixBox> gap = kBoxes;
  gap[5] = gap[0];  // rank 1 says rank 0's coordinate: rows 6..11 of m0 in no box
  refused(gap, "in no rank's box");
  std::vector<sa::kernels::MatrixBox> shape = kBoxes;
  shape[14].rows = 3;  // rank 2's m4 is 3 x 2
  refused(shape, "rank 2's split Muon matrix 4 (param 4 here) is 3 x 2, this rank's 2 x 2");
}

TEST_CASE("a host communicator's rank must be in 0..nranks, and its ranks must say each number "
          "once",
          "[muon][sharded][errors]") {
  sa_host_comm callbacks = SA_HOST_COMM_INIT;
  callbacks.all_reduce = [](void*, double*, int32_t, sa_reduce_op) { return 0; };
  sa_comm* comm = nullptr;
  for (const auto& [rank, nranks] : std::vector<std::pair<int32_t, int32_t>>{
           {2, 2}, {-1, 2}, {1, 0}, {0, -1}}) {
    INFO("rank " << rank << " of " << nranks);
    callbacks.rank = rank;
    callbacks.nranks = nranks;
    CHECK(sa_comm_create_host(&callbacks, &comm) == SA_ERR_INVALID_ARGUMENT);
    CHECK(comm == nullptr);
    CHECK_THAT(sa_last_error(), Catch::Contains("0 <= rank < nranks"));
  }
  // Two threaded ranks that both say they are rank 0: refused at the first step, by name.
  ThreadComms comms(2, true, 0);
  for (const RankResult& got : run_two_ranks_by_rows(comms)) {
    CHECK(got.status == SA_ERR_MISMATCH);
    CHECK_THAT(got.error, Catch::Contains("2 ranks say they are rank 0 of 2"));
  }
}

TEST_CASE("ranks that give the same mesh coordinate are refused at the first step, by name",
          "[muon][sharded][errors]") {
  // Rank 1 gives rank 0's coordinate: both hold rows 0..2 of the 6 x 4 matrix, and rows
  // 3..5 are nobody's. Summed, the first rows would count twice; exchanged, it is found.
  ThreadComms comms(2, true);
  for (const RankResult& got : run_two_ranks_by_rows(comms, 0)) {
    CHECK(got.status == SA_ERR_MISMATCH);
    CHECK_THAT(got.error, Catch::Contains("do not cover it exactly once") &&
                              Catch::Contains("element [3, 0] is in no rank's box"));
  }
}

TEST_CASE("one rank that says it is the only one must hold whole matrices",
          "[muon][sharded][errors]") {
  // A communicator of one rank that says so, and a layout that gives this rank half of a
  // 6 x 4 matrix: the other half is nobody's, refused at the first step (unsaid, the half
  // would be orthogonalized as if it were the matrix).
  ThreadComms comms(1, true);
  const RankResult got =
      run_rank({"Shard(0)", 6, 4, {2}, {shard(0)}}, muon_config(true, SA_MUON_LR_ORIGINAL, 5), 0,
               comms[0]);
  CHECK(got.status == SA_ERR_MISMATCH);
  CHECK_THAT(got.error, Catch::Contains("do not cover it exactly once") &&
                            Catch::Contains("element [3, 0] is in no rank's box"));
}

TEST_CASE("a flush checks the ranks' agreement on split Muon matrices, as the first step would",
          "[muon][sharded][errors]") {
  // Ranks that both say they are rank 0: sa_optimizer_flush (what readies a step for a CUDA
  // graph) refuses, so that a captured step never has to gather the ranks' boxes.
  ThreadComms comms(2, true, 0);
  std::vector<sa_status> flushed(2);
  std::vector<std::string> errors(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      const auto i = static_cast<std::size_t>(r);
      HostTensor w({3, 4}, kFloat32), g({3, 4}, kFloat32);
      MeshLayout mesh{{6, 4}, {2}, {r}, {shard(0)}};
      const sa_layout layout = mesh.get();
      const sa_group_config config = muon_config(true, SA_MUON_LR_ORIGINAL, 5);
      OptimizerPtr opt = make_optimizer();
      int32_t group = -1;
      int64_t index = -1;
      sa_status st = sa_optimizer_set_comm(opt.get(), comms[r]);
      if (st == SA_OK) st = sa_optimizer_add_group(opt.get(), &config, &group);
      if (st == SA_OK)
        st = sa_optimizer_add_param(opt.get(), "w", 0, w.versioned(), &layout, nullptr, &index);
      const DLTensor gd = g.dl();
      if (st == SA_OK) st = sa_optimizer_set_grad(opt.get(), 0, &gd);
      if (st == SA_OK) st = sa_optimizer_flush(opt.get(), nullptr);
      flushed[i] = st;
      errors[i] = sa_optimizer_last_error(opt.get());
    });
  for (std::thread& t : threads) t.join();
  for (std::size_t r = 0; r < 2; ++r) {
    INFO("rank " << r << ": " << errors[r]);
    CHECK(flushed[r] == SA_ERR_MISMATCH);
    CHECK_THAT(errors[r], Catch::Contains("2 ranks say they are rank 0 of 2"));
  }
}

TEST_CASE("a new communicator is checked again: its ranks must say each number once",
          "[muon][sharded][errors]") {
  // Two ranks step a split matrix (and an AdamW param) through a communicator whose ranks
  // say 0 and 1, then are given one whose ranks both say 0: the next step is refused on
  // both before anything changed (the AdamW param and the step count too).
  ThreadComms good(2, true), bad(2, true, 0);
  const sa_group_config config = muon_config(true, SA_MUON_LR_ORIGINAL, 5);
  std::vector<sa_status> first(2), second(2);
  std::vector<std::string> errors(2);
  std::vector<std::vector<float>> before(2), after(2);
  std::vector<int64_t> steps(2, -1);
  sa_group_config adamw = SA_GROUP_CONFIG_INIT;
  adamw.lr = 0.1;
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      const auto i = static_cast<std::size_t>(r);
      HostTensor w({3, 4}, kFloat32), g({3, 4}, kFloat32), v({5}, kFloat32), vg({5}, kFloat32);
      for (int64_t k = 0; k < 12; ++k) {
        w.set(k, 0.1f * static_cast<float>(k + r));
        g.set(k, 0.01f * static_cast<float>(k % 5 - 2));
      }
      for (int64_t k = 0; k < 5; ++k) {
        v.set(k, 1.0f);
        vg.set(k, 0.5f);
      }
      MeshLayout mesh{{6, 4}, {2}, {r}, {shard(0)}};
      const sa_layout layout = mesh.get();
      OptimizerPtr opt = make_optimizer();
      int32_t group_index = -1;
      int64_t index = -1;
      sa_status st = sa_optimizer_set_comm(opt.get(), good[r]);
      if (st == SA_OK) st = sa_optimizer_add_group(opt.get(), &config, &group_index);
      if (st == SA_OK) st = sa_optimizer_add_group(opt.get(), &adamw, &group_index);
      if (st == SA_OK)
        st = sa_optimizer_add_param(opt.get(), "w", 0, w.versioned(), &layout, nullptr, &index);
      if (st == SA_OK)
        st = sa_optimizer_add_param(opt.get(), "v", 1, v.versioned(), nullptr, nullptr, &index);
      const DLTensor gd = g.dl(), vgd = vg.dl();
      const DLTensor* grads[] = {&gd, &vgd};
      if (st == SA_OK) st = sa_optimizer_set_grads(opt.get(), 2, grads);
      if (st == SA_OK) st = sa_optimizer_step(opt.get(), nullptr, nullptr);
      first[i] = st;
      if (st == SA_OK) st = sa_optimizer_set_comm(opt.get(), bad[r]);
      before[i].assign(w.as<float>(), w.as<float>() + 12);
      before[i].insert(before[i].end(), v.as<float>(), v.as<float>() + 5);
      if (st == SA_OK) st = sa_optimizer_step(opt.get(), nullptr, nullptr);
      second[i] = st;
      errors[i] = sa_optimizer_last_error(opt.get());
      after[i].assign(w.as<float>(), w.as<float>() + 12);
      after[i].insert(after[i].end(), v.as<float>(), v.as<float>() + 5);
      sa_optimizer_get_step(opt.get(), 1, &steps[i]);
    });
  for (std::thread& t : threads) t.join();
  for (std::size_t r = 0; r < 2; ++r) {
    INFO("rank " << r << ": " << errors[r]);
    CHECK(first[r] == SA_OK);
    CHECK(second[r] == SA_ERR_MISMATCH);
    CHECK_THAT(errors[r], Catch::Contains("2 ranks say they are rank 0 of 2"));
    CHECK(after[r] == before[r]);  // nothing stepped: the split matrix, the AdamW param
    CHECK(steps[r] == 1);          // and the count
  }
}

TEST_CASE("a split Muon matrix needs a communicator, which then cannot be removed",
          "[muon][sharded][errors]") {
  HostTensor rows({4, 6}, kFloat32);  // both outlive the optimizer, which holds them
  ThreadComms comms(1);
  OptimizerPtr opt = make_optimizer();
  const sa_group_config muon = muon_config(true, SA_MUON_LR_ORIGINAL, 5);
  int32_t g = -1;
  int64_t index = -1;
  REQUIRE_SA_OK(opt.get(), sa_optimizer_add_group(opt.get(), &muon, &g));
  MeshLayout mesh{{8, 6}, {2}, {0}, {shard(0)}};
  const sa_layout layout = mesh.get();
  CHECK_SA_FAILS(
      opt.get(), SA_ERR_INVALID_ARGUMENT,
      sa_optimizer_add_param(opt.get(), "w", 0, rows.versioned(), &layout, nullptr, &index),
      "param 'w'", "8 x 6", "sa_optimizer_set_comm");
  REQUIRE_SA_OK(opt.get(), sa_optimizer_set_comm(opt.get(), comms[0]));
  REQUIRE_SA_OK(opt.get(), sa_optimizer_add_param(opt.get(), "w", 0, rows.versioned(), &layout,
                                                  nullptr, &index));
  CHECK_SA_FAILS(opt.get(), SA_ERR_STATE, sa_optimizer_set_comm(opt.get(), nullptr), "Muon",
                 "cannot be removed");
}

// Run by ctest as muon_without_a_blas, with SHARDADAM_BLAS_LIBRARY naming a file that does
// not exist (tests/CMakeLists.txt): a Muon param on the CPU is refused at add_param, saying
// what to install, and nothing is added; AdamW params are not affected.
TEST_CASE("without a loadable CBLAS a Muon param on the CPU is refused, saying what to install",
          "[.][blas_missing]") {
  const char* chosen = std::getenv("SHARDADAM_BLAS_LIBRARY");
  REQUIRE(chosen != nullptr);
  HostTensor w({4, 4}, kFloat32), b({4}, kFloat32);  // outlive the optimizer
  OptimizerPtr opt = make_optimizer();
  const sa_group_config muon = muon_config(true, SA_MUON_LR_ORIGINAL, 5),
                        adamw = SA_GROUP_CONFIG_INIT;
  int32_t g = -1;
  int64_t index = -1;
  REQUIRE_SA_OK(opt.get(), sa_optimizer_add_group(opt.get(), &muon, &g));
  REQUIRE_SA_OK(opt.get(), sa_optimizer_add_group(opt.get(), &adamw, &g));
  CHECK_SA_FAILS(opt.get(), SA_ERR_UNSUPPORTED,
                 sa_optimizer_add_param(opt.get(), "w", 0, w.versioned(), nullptr, nullptr, &index),
                 "param 'w'", "CBLAS", chosen, "libopenblas0", "SHARDADAM_BLAS_LIBRARY");
  CHECK(sa_optimizer_num_params(opt.get()) == 0);
  REQUIRE_SA_OK(opt.get(),
                sa_optimizer_add_param(opt.get(), "b", 1, b.versioned(), nullptr, nullptr, &index));
}
