// fp8 params (float8_e4m3fn, float8_e5m2) with a float32 master and a scaling
// (sa_param_scaling), on the CPU backend, against references written here from the
// formats' definitions: fp8 values by ldexp, the saturating round-to-nearest-even cast by
// searching every code, the MX scale exponent by ilogb. The master must be exactly a
// float32 param's trajectory (that path is checked against float64 elsewhere), the param
// and its scales exactly the reference cast of the master.
#include <catch2/catch.hpp>

#include <cfloat>
#include <cmath>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "shardadam/shardadam.h"
#include "test_state_io_support.hpp"
#include "test_support.hpp"
#include "test_thread_comm.hpp"

namespace {

using namespace sa_test;

constexpr DLDataType kE4m3 = {kDLFloat8_e4m3fn, 8, 1};
constexpr DLDataType kE5m2 = {kDLFloat8_e5m2, 8, 1};
constexpr DLDataType kE8m0 = {kDLFloat8_e8m0fnu, 8, 1};

struct Format {
  DLDataType dtype;
  int exp_bits;
  int mant_bits;
  int bias;
  double max;  // the largest finite value
  int emax;    // log2 of its largest power of two
  const char* name;
};
const Format kFormats[] = {{kE4m3, 4, 3, 7, 448.0, 8, "float8_e4m3fn"},
                           {kE5m2, 5, 2, 15, 57344.0, 15, "float8_e5m2"}};

// The value of a code: NaN for e4m3fn's S.1111.111 and e5m2's exponent 31 with a nonzero
// mantissa (e5m2's infinities never come out of a saturating cast, nor are they made here).
double fp8_value(const Format& f, uint8_t code) {
  const int mant = code & ((1 << f.mant_bits) - 1);
  const int exp = (code >> f.mant_bits) & ((1 << f.exp_bits) - 1);
  const double sign = (code & 0x80) ? -1.0 : 1.0;
  const int top = (1 << f.exp_bits) - 1;
  if (f.exp_bits == 4 && exp == top && mant == (1 << f.mant_bits) - 1) return NAN;
  if (f.exp_bits == 5 && exp == top) return mant ? NAN : sign * INFINITY;
  if (exp == 0) return sign * std::ldexp(mant, 1 - f.bias - f.mant_bits);
  return sign * std::ldexp(1.0 + std::ldexp(mant, -f.mant_bits), exp - f.bias);
}

// The saturating cast: |x| above the largest finite value (infinity included) gives the
// largest; otherwise the nearest code, ties to the even one; the sign is x's.
uint8_t fp8_cast(const Format& f, float x) {
  if (std::isnan(x)) return std::signbit(x) ? 0xFF : 0x7F;
  const uint8_t sign = std::signbit(x) ? 0x80 : 0;
  const double a = std::fabs(static_cast<double>(x));
  uint8_t best = 0;
  double best_err = INFINITY;
  for (int c = 0; c < 0x80; ++c) {
    const double v = fp8_value(f, static_cast<uint8_t>(c));
    if (!std::isfinite(v)) continue;
    const double err = std::fabs(std::fmin(a, f.max) - v);
    if (err < best_err || (err == best_err && (c & 1) == 0)) {
      best = static_cast<uint8_t>(c);
      best_err = err;
    }
  }
  return static_cast<uint8_t>(sign | best);
}

float amax_of(const float* x, int64_t n) {
  float m = 0.0f;
  for (int64_t i = 0; i < n; ++i) m = std::fmax(m, std::fabs(x[i]));
  return m;
}

// MXFP8's X as an unbiased exponent: floor(log2 amax) - emax, clamped to [-127, 127].
int mx_exponent(const Format& f, float amax) {
  if (amax == 0.0f) return -127;
  const int x = std::ilogb(amax) - f.emax;
  return x < -127 ? -127 : (x > 127 ? 127 : x);
}

float block128_scale(const Format& f, float amax) {
  if (amax == 0.0f) return 1.0f;
  const float s = static_cast<float>(f.max) / amax;
  return std::isinf(s) ? FLT_MAX : s;
}

struct Scaling {
  int32_t value;
  int64_t block;  // 0: per tensor
  const char* name;
};
const Scaling kScalings[] = {{SA_SCALING_DELAYED, 0, "delayed"},
                             {SA_SCALING_MXFP8, 32, "mxfp8"},
                             {SA_SCALING_BLOCK128, 128, "block128"}};

// The param codes and scales the reference cast gives for master values x (one shard).
struct Cast {
  std::vector<uint8_t> codes;
  std::vector<uint8_t> mx_scales;   // mxfp8: e8m0 codes per block
  std::vector<float> block_scales;  // block128: scale_inv per block
};
Cast reference_cast(const Format& f, const Scaling& s, const std::vector<float>& x,
                    float delayed_scale) {
  Cast out;
  out.codes.resize(x.size());
  if (s.block == 0) {
    for (std::size_t i = 0; i < x.size(); ++i) out.codes[i] = fp8_cast(f, x[i] * delayed_scale);
    return out;
  }
  for (std::size_t b = 0; b < x.size(); b += static_cast<std::size_t>(s.block)) {
    const float amax = amax_of(x.data() + b, s.block);
    for (int64_t i = 0; i < s.block; ++i) {
      const float xi = x[b + static_cast<std::size_t>(i)];
      if (s.value == SA_SCALING_MXFP8) {
        const int e = mx_exponent(f, amax);
        out.codes[b + static_cast<std::size_t>(i)] = fp8_cast(f, xi * std::ldexp(1.0f, -e));
        if (i == 0) out.mx_scales.push_back(static_cast<uint8_t>(e + 127));
      } else {
        const float scale = block128_scale(f, amax);
        out.codes[b + static_cast<std::size_t>(i)] = fp8_cast(f, xi * scale);
        if (i == 0) out.block_scales.push_back(1.0f / scale);
      }
    }
  }
  return out;
}

// The master value of code i under its scale (add_param's start).
float reference_master(const Format& f, const Scaling& s, uint8_t code, const HostTensor& scale,
                       int64_t i) {
  const auto v = static_cast<float>(fp8_value(f, code));
  if (s.block == 0) return v / scale.as<float>()[0];
  const int64_t b = i / s.block;
  if (s.value == SA_SCALING_MXFP8) return v * std::ldexp(1.0f, scale.as<uint8_t>()[b] - 127);
  return v * scale.as<float>()[b];
}

HostTensor scale_tensor(const Scaling& s, const std::vector<int64_t>& shape) {
  if (s.block == 0) return HostTensor({1}, kFloat32);
  std::vector<int64_t> scale_shape = shape;
  scale_shape.back() /= s.block;
  return HostTensor(scale_shape, s.value == SA_SCALING_MXFP8 ? kE8m0 : kFloat32);
}

sa_param_options fp8_options(const Scaling& s, HostTensor& scale, HostTensor* amax) {
  sa_param_options o = SA_PARAM_OPTIONS_INIT;
  o.scaling = s.value;
  o.scale = scale.versioned();
  o.amax = amax ? amax->versioned() : nullptr;
  return o;
}

std::vector<float> master_of(sa_optimizer* opt, int64_t param) {
  const StateView v = state_view(opt, param, "master");
  std::vector<float> out(static_cast<std::size_t>(v.numel()));
  if (!out.empty())  // an empty shard's view has no data pointer (memcpy from NULL is UB)
    std::memcpy(out.data(), v.data(), out.size() * sizeof(float));
  return out;
}

// One step of an fp8 param's optimizer and of its twin, a float32 param `reference`, on the
// same grad (param 0 of each); returns the fp8 param's master, which must be the twin's
// param bit for bit.
std::vector<float> step_twins(sa_optimizer* opt, sa_optimizer* twin, const HostTensor& grad,
                              const HostTensor& reference) {
  const DLTensor g = grad.dl();
  REQUIRE_SA_OK(opt, sa_optimizer_set_grad(opt, 0, &g));
  REQUIRE_SA_OK(twin, sa_optimizer_set_grad(twin, 0, &g));
  REQUIRE_SA_OK(opt, sa_optimizer_step(opt, nullptr, nullptr));
  REQUIRE_SA_OK(twin, sa_optimizer_step(twin, nullptr, nullptr));
  std::vector<float> m = master_of(opt, 0);
  REQUIRE(std::memcmp(m.data(), reference.data(), reference.bytes()) == 0);
  return m;
}

// Adds `param` with `options` to `opt` and its float32 twin `reference` to `twin` (param 0 of
// each, group 0), checks that the fp8 param's master starts as the twin, and returns the
// fp8 param's info.
sa_param_info add_twins(sa_optimizer* opt, sa_optimizer* twin, HostTensor& param,
                        HostTensor& reference, const sa_param_options& options) {
  REQUIRE_SA_OK(opt,
                sa_optimizer_add_param(opt, "w", 0, param.versioned(), nullptr, &options, nullptr));
  REQUIRE_SA_OK(
      twin, sa_optimizer_add_param(twin, "w", 0, reference.versioned(), nullptr, nullptr, nullptr));
  sa_param_info info = SA_PARAM_INFO_INIT;
  REQUIRE_SA_OK(opt, sa_optimizer_param_info(opt, 0, &info));
  const std::vector<float> m = master_of(opt, 0);
  CHECK(std::memcmp(m.data(), reference.data(), reference.bytes()) == 0);
  return info;
}

int32_t add_group(sa_optimizer* opt, const sa_group_config& c) {
  int32_t g = -1;
  REQUIRE_SA_OK(opt, sa_optimizer_add_group(opt, &c, &g));
  return g;
}

}  // namespace

using namespace sa_test;

TEST_CASE("an fp8 param's master steps as a float32 param, and the param is its reference cast",
          "[fp8param]") {
  const Format& f = kFormats[GENERATE(0, 1)];
  const Scaling& s = kScalings[GENERATE(0, 1, 2)];
  // 2 x 35072 elements: several 32768-element work items over two threads, so a delayed
  // amax is folded from the ranges of different threads.
  const std::vector<int64_t> shape =
      GENERATE(0, 1) == 0 ? std::vector<int64_t>{6, 256} : std::vector<int64_t>{2, 35072};
  INFO(f.name << " " << s.name << " " << shape[0] << "x" << shape[1]);
  const int64_t n = shape[0] * shape[1];
  Rng rng(17);

  HostTensor param(shape, f.dtype);
  for (int64_t i = 0; i < n; ++i) {  // finite codes, some zero blocks' worth of zeros
    uint8_t c = static_cast<uint8_t>(rng.integer(0, 255));
    if (!std::isfinite(fp8_value(f, c))) c = 0x3A;
    param.as<uint8_t>()[i] = i < 64 ? 0 : c;
  }
  HostTensor scale = scale_tensor(s, shape);
  for (int64_t b = 0; b < scale.numel(); ++b) {
    if (s.value == SA_SCALING_MXFP8)
      scale.as<uint8_t>()[b] = static_cast<uint8_t>(rng.integer(110, 129));
    else
      scale.as<float>()[b] = static_cast<float>(std::fabs(rng.signed_log_uniform(1e-3, 1e2)));
  }
  HostTensor amax({1}, kFloat32);
  HostTensor reference(shape, kFloat32);  // the float32 param the master must follow
  for (int64_t i = 0; i < n; ++i)
    reference.as<float>()[i] = reference_master(f, s, param.as<uint8_t>()[i], scale, i);

  const sa_group_config config = group_config(1e-2, 0.1, 1);
  OptimizerPtr opt = make_optimizer(2);
  OptimizerPtr ref = make_optimizer(2);
  add_group(opt.get(), config);
  add_group(ref.get(), config);
  const sa_param_options options = fp8_options(s, scale, s.block == 0 ? &amax : nullptr);
  const sa_param_info info = add_twins(opt.get(), ref.get(), param, reference, options);
  CHECK(info.scaling == s.value);
  CHECK(info.master == SA_MASTER_FP32);

  HostTensor grad(shape, kFloat32);
  for (int step = 0; step < 4; ++step) {
    INFO("step " << step);
    fill_normal(grad, rng, step == 2 ? 1e3 : 1.0);
    for (int64_t i = 0; i < 64; ++i) grad.as<float>()[i] = 0.0f;        // zero blocks stay zero
    if (s.block == 0) scale.as<float>()[0] = step == 3 ? 0.5f : 64.0f;  // the engine's update
    const std::vector<float> m = step_twins(opt.get(), ref.get(), grad, reference);
    const Cast want = reference_cast(f, s, m, s.block == 0 ? scale.as<float>()[0] : 0.0f);
    int64_t wrong = 0, first = -1;
    for (int64_t i = 0; i < n; ++i)
      if (param.as<uint8_t>()[i] != want.codes[static_cast<std::size_t>(i)]) {
        if (first < 0) first = i;
        ++wrong;
      }
    INFO("first wrong code at " << first << " (master " << (first >= 0 ? m[first] : 0.0f) << ")");
    CHECK(wrong == 0);
    if (s.value == SA_SCALING_MXFP8)
      CHECK(std::memcmp(scale.data(), want.mx_scales.data(), want.mx_scales.size()) == 0);
    if (s.value == SA_SCALING_BLOCK128)
      CHECK(std::memcmp(scale.data(), want.block_scales.data(), scale.bytes()) == 0);
    if (s.block == 0) CHECK(amax.as<float>()[0] == amax_of(m.data(), n));
  }
  opt.reset();
  CHECK(param.deleter_calls() == 1);
  CHECK(scale.deleter_calls() == 1);
  if (s.block == 0) CHECK(amax.deleter_calls() == 1);
}

TEST_CASE("fp8 param options that do not fit are refused, and the caller keeps its tensors",
          "[fp8param][errors]") {
  OptimizerPtr opt = make_optimizer();
  add_group(opt.get(), SA_GROUP_CONFIG_INIT);
  HostTensor param({4, 64}, kE4m3);
  HostTensor mx_scale({4, 2}, kE8m0);
  HostTensor one({1}, kFloat32);
  one.as<float>()[0] = 1.0f;
  const auto refuses = [&](sa_status status, sa_param_options o, const sa_layout* layout,
                           const char* part) {
    CHECK_SA_FAILS(
        opt.get(), status,
        sa_optimizer_add_param(opt.get(), "w", 0, param.versioned(), layout, &o, nullptr), part);
  };
  sa_param_options none = SA_PARAM_OPTIONS_INIT;
  refuses(SA_ERR_INVALID_ARGUMENT, none, nullptr,
          "a float8_e4m3fn param needs a scaling (sa_param_options.scaling): SA_SCALING_DELAYED, "
          "SA_SCALING_MXFP8, SA_SCALING_BLOCK128, SA_SCALING_CURRENT or SA_SCALING_CURRENT_POW2");
  sa_param_options o = SA_PARAM_OPTIONS_INIT;
  o.scaling = 9;
  refuses(SA_ERR_INVALID_ARGUMENT, o, nullptr,
          "options.scaling is 9; it must be an sa_param_scaling, SA_SCALING_NONE 0 to "
          "SA_SCALING_CURRENT_POW2 5");
  o.scaling = SA_SCALING_MXFP8;
  refuses(SA_ERR_INVALID_ARGUMENT, o, nullptr, "options.scale is NULL; SA_SCALING_MXFP8 needs one");
  o.scale = one.versioned();
  refuses(SA_ERR_INVALID_ARGUMENT, o, nullptr,
          "options.scale is float32; it must be float8_e8m0fnu");
  HostTensor wrong_shape({4, 4}, kE8m0);
  o.scale = wrong_shape.versioned();
  refuses(SA_ERR_INVALID_ARGUMENT, o, nullptr, "options.scale has shape [4, 4]; it must be [4, 2]");
  o.scale = mx_scale.versioned();
  o.amax = one.versioned();
  refuses(SA_ERR_INVALID_ARGUMENT, o, nullptr,
          "options.amax is set, but SA_SCALING_MXFP8 writes block scales");
  o.amax = nullptr;
  {
    sa_param_options ro = o;
    DLManagedTensorVersioned* v = mx_scale.versioned();
    v->flags = DLPACK_FLAG_BITMASK_READ_ONLY;
    ro.scale = v;
    refuses(SA_ERR_INVALID_ARGUMENT, ro, nullptr, "options.scale is read-only");
  }
  // A Box layout whose last dim starts at 48 of 128: the block [32, 64) is cut.
  const int64_t global_shape[] = {4, 128}, offset[] = {0, 48};
  sa_layout box = SA_LAYOUT_INIT;
  box.ndim = 2;
  box.global_shape = global_shape;
  box.global_offset = offset;
  o.scale = mx_scale.versioned();
  refuses(SA_ERR_INVALID_ARGUMENT, o, &box,
          "this rank holds elements [48, 112) of dim 1, which cuts a block of 32");
  HostTensor odd({4, 48}, kE4m3);
  {
    sa_param_options b = SA_PARAM_OPTIONS_INIT;
    b.scaling = SA_SCALING_BLOCK128;
    HostTensor s({4, 0}, kFloat32);
    b.scale = s.versioned();
    CHECK_SA_FAILS(
        opt.get(), SA_ERR_INVALID_ARGUMENT,
        sa_optimizer_add_param(opt.get(), "odd", 0, odd.versioned(), nullptr, &b, nullptr),
        "dim 1 has 48 elements, not a multiple of 128");
  }
  sa_param_options delayed = SA_PARAM_OPTIONS_INIT;
  delayed.scaling = SA_SCALING_DELAYED;
  HostTensor zero({1}, kFloat32);
  delayed.scale = zero.versioned();
  refuses(SA_ERR_INVALID_ARGUMENT, delayed, nullptr, "the scale is 0; it must be > 0 and finite");
  {
    // One tensor as both would be owned (deleted) twice; two over one element would have
    // the step's amax overwrite the scale it reads.
    sa_param_options twice = delayed;
    twice.scale = twice.amax = one.versioned();
    refuses(SA_ERR_INVALID_ARGUMENT, twice, nullptr,
            "options.scale and options.amax are the same tensor; pass two");
    DLManagedTensorVersioned alias = *one.versioned();
    twice.amax = &alias;
    refuses(SA_ERR_INVALID_ARGUMENT, twice, nullptr,
            "options.scale and options.amax share their element");
  }
  HostTensor f32({4, 64}, kFloat32);
  sa_param_options on_f32 = SA_PARAM_OPTIONS_INIT;
  on_f32.scaling = SA_SCALING_DELAYED;
  on_f32.scale = one.versioned();
  CHECK_SA_FAILS(
      opt.get(), SA_ERR_INVALID_ARGUMENT,
      sa_optimizer_add_param(opt.get(), "f", 0, f32.versioned(), nullptr, &on_f32, nullptr),
      "scaling SA_SCALING_DELAYED is for float8_e4m3fn or float8_e5m2 params, not float32");
  sa_param_options stray = SA_PARAM_OPTIONS_INIT;
  stray.scale = one.versioned();
  CHECK_SA_FAILS(
      opt.get(), SA_ERR_INVALID_ARGUMENT,
      sa_optimizer_add_param(opt.get(), "f", 0, f32.versioned(), nullptr, &stray, nullptr),
      "options.scale is set but the param is not scaled");
  CHECK(sa_optimizer_num_params(opt.get()) == 0);
  opt.reset();
  for (const HostTensor* t : {&param, &mx_scale, &one, &wrong_shape, &odd, &zero, &f32})
    CHECK(t->deleter_calls() == 0);
}

TEST_CASE("an import casts fp8 params from the loaded master, on another layout",
          "[fp8param][state_io]") {
  const Format& f = kFormats[0];
  const Scaling& s = kScalings[GENERATE(1, 2)];  // mxfp8, block128
  INFO(s.name);
  const std::vector<int64_t> global = {6, 256};
  Rng rng(5);
  // Two ranks, Shard(0): rows [0, 3) and [3, 6); each steps twice.
  std::vector<std::unique_ptr<HostTensor>> params, scales;
  std::vector<Bytes> blobs;
  std::vector<OptimizerPtr> ranks;
  for (int64_t r = 0; r < 2; ++r) {
    params.push_back(std::make_unique<HostTensor>(std::vector<int64_t>{3, 256}, f.dtype));
    for (int64_t i = 0; i < params.back()->numel(); ++i)
      params.back()->as<uint8_t>()[i] = static_cast<uint8_t>(rng.integer(0, 0x6F));
    scales.push_back(std::make_unique<HostTensor>(scale_tensor(s, {3, 256})));
    for (int64_t b = 0; b < scales.back()->numel(); ++b) {
      if (s.value == SA_SCALING_MXFP8)
        scales.back()->as<uint8_t>()[b] = 120;
      else
        scales.back()->as<float>()[b] = 0.25f;
    }
    MeshLayout layout{global, {2}, {r}, {shard(0)}};
    const sa_layout l = layout.get();
    OptimizerPtr opt = make_optimizer();
    add_group(opt.get(), group_config(1e-2, 0.0, 1));
    const sa_param_options o = fp8_options(s, *scales.back(), nullptr);
    REQUIRE_SA_OK(opt.get(), sa_optimizer_add_param(opt.get(), "w", 0, params.back()->versioned(),
                                                    &l, &o, nullptr));
    HostTensor grad({3, 256}, kFloat32);
    for (int step = 0; step < 2; ++step) {
      fill_normal(grad, rng, 1.0);
      const DLTensor g = grad.dl();
      REQUIRE_SA_OK(opt.get(), sa_optimizer_set_grad(opt.get(), 0, &g));
      REQUIRE_SA_OK(opt.get(), sa_optimizer_step(opt.get(), nullptr, nullptr));
    }
    blobs.push_back(export_blob(opt.get()));
    ranks.push_back(std::move(opt));
  }
  // One rank holding all of it, from other codes and scales.
  HostTensor param(global, f.dtype);
  HostTensor scale = scale_tensor(s, global);
  for (int64_t b = 0; b < scale.numel(); ++b) {
    if (s.value == SA_SCALING_MXFP8)
      scale.as<uint8_t>()[b] = 127;
    else
      scale.as<float>()[b] = 1.0f;
  }
  OptimizerPtr whole = make_optimizer();
  add_group(whole.get(), group_config(1e-2, 0.0, 1));
  const sa_param_options o = fp8_options(s, scale, nullptr);
  REQUIRE_SA_OK(whole.get(), sa_optimizer_add_param(whole.get(), "w", 0, param.versioned(), nullptr,
                                                    &o, nullptr));
  REQUIRE_SA_OK(whole.get(), import_blobs(whole.get(), blobs));
  // Rows never cross ranks and blocks never cross rows: the codes and scales are the two
  // ranks' side by side, bit for bit.
  const std::size_t half = param.bytes() / 2, scale_half = scale.bytes() / 2;
  CHECK(std::memcmp(param.data(), params[0]->data(), half) == 0);
  CHECK(std::memcmp(param.as<uint8_t>() + half, params[1]->data(), half) == 0);
  CHECK(std::memcmp(scale.data(), scales[0]->data(), scale_half) == 0);
  CHECK(std::memcmp(static_cast<unsigned char*>(scale.data()) + scale_half, scales[1]->data(),
                    scale_half) == 0);
}

TEST_CASE("the param scaling table is the header's enum, with each scaling's block and scale dtype",
          "[fp8param][schema]") {
  REQUIRE(sa_num_param_scalings() == 6);
  const struct {
    int32_t value;
    const char* name;
    int64_t block;
    DLDataType scale;
    int32_t writes;
  } expected[] = {{SA_SCALING_NONE, "none", 0, kFloat32, 0},
                  {SA_SCALING_DELAYED, "delayed", 0, kFloat32, 0},
                  {SA_SCALING_MXFP8, "mxfp8", 32, kE8m0, 1},
                  {SA_SCALING_BLOCK128, "block128", 128, kFloat32, 1},
                  {SA_SCALING_CURRENT, "current", 0, kFloat32, 1},
                  {SA_SCALING_CURRENT_POW2, "current_pow2", 0, kFloat32, 1}};
  for (const auto& e : expected) {
    sa_param_scaling_info info = SA_PARAM_SCALING_INFO_INIT;
    REQUIRE_SA_OK(nullptr, sa_param_scaling_describe(e.value, &info));
    CHECK(info.value == e.value);
    CHECK(std::string(info.name) == e.name);
    CHECK(info.block == e.block);
    CHECK(same_dtype(info.scale_dtype, e.scale));
    CHECK(info.step_writes_scale == e.writes);
    CHECK(std::strlen(info.doc) > 0);
  }
  sa_param_scaling_info info = SA_PARAM_SCALING_INFO_INIT;
  CHECK_SA_FAILS(nullptr, SA_ERR_INVALID_ARGUMENT, sa_param_scaling_describe(6, &info),
                 "index 6 is not a param scaling: the library has 6 (0 .. 5)");
}

TEST_CASE("the library's fp8 casts are the reference's for every code and the floats between",
          "[fp8param][dtype]") {
  for (const Format& f : kFormats) {
    INFO(f.name);
    // Through add_param with a delayed scale of 1 and a step of lr 0: the master is the
    // decoded code, and the step's cast of it must give the code back; then a float
    // sweep through the cast: decoded values, their midpoints and a float step either way.
    std::vector<float> xs;
    for (int c = 0; c < 0x100; ++c) {
      const double v = fp8_value(f, static_cast<uint8_t>(c));
      if (!std::isfinite(v)) continue;
      const double next = fp8_value(f, static_cast<uint8_t>(c + 1));
      xs.push_back(static_cast<float>(v));
      if ((c & 0x7F) != 0x7F && std::isfinite(next) && (c & 0x80) == ((c + 1) & 0x80)) {
        const auto mid = static_cast<float>((v + next) / 2);
        xs.push_back(mid);
        xs.push_back(std::nextafter(mid, 0.0f));
        xs.push_back(std::nextafter(mid, INFINITY));
      }
    }
    for (float big : {static_cast<float>(f.max) * 1.01f, FLT_MAX, INFINITY, 1e-30f, -1e-30f, -0.0f})
      xs.push_back(big), xs.push_back(-big);
    while (xs.size() % 32 != 0) xs.push_back(0.0f);
    const int64_t n = static_cast<int64_t>(xs.size());
    HostTensor param({n}, f.dtype), master_init({n}, kFloat32);
    HostTensor scale({1}, kFloat32);
    scale.as<float>()[0] = 1.0f;
    OptimizerPtr opt = make_optimizer();
    sa_group_config c = group_config(0.0, 0.0, 1);
    add_group(opt.get(), c);
    sa_param_options o = SA_PARAM_OPTIONS_INIT;
    o.scaling = SA_SCALING_DELAYED;
    o.scale = scale.versioned();
    REQUIRE_SA_OK(opt.get(), sa_optimizer_add_param(opt.get(), "w", 0, param.versioned(), nullptr,
                                                    &o, nullptr));
    {  // write the sweep into the master (a writable state view), then step with lr 0
      const StateView m = state_view(opt.get(), 0, "master");
      std::memcpy(m.data(), xs.data(), xs.size() * sizeof(float));
    }
    HostTensor grad({n}, kFloat32);
    const DLTensor g = grad.dl();
    REQUIRE_SA_OK(opt.get(), sa_optimizer_set_grad(opt.get(), 0, &g));
    REQUIRE_SA_OK(opt.get(), sa_optimizer_step(opt.get(), nullptr, nullptr));
    const std::vector<float> m = master_of(opt.get(), 0);
    REQUIRE(std::memcmp(m.data(), xs.data(), xs.size() * sizeof(float)) == 0);
    for (int64_t i = 0; i < n; ++i) {
      INFO("x = " << xs[static_cast<std::size_t>(i)]);
      CHECK(static_cast<int>(param.as<uint8_t>()[i]) ==
            static_cast<int>(fp8_cast(f, xs[static_cast<std::size_t>(i)])));
    }
  }
}

TEST_CASE(
    "recast_params casts fp8 params from masters written by the engine, reset_masters "
    "sets masters from the params, and bad ranges change nothing",
    "[fp8param][sync]") {
  const Format& f = kFormats[GENERATE(0, 1)];
  const Scaling& s = kScalings[GENERATE(0, 1, 2)];
  INFO(f.name << " " << s.name);
  const std::vector<int64_t> shape{4, 256};
  const int64_t n = shape[0] * shape[1];
  Rng rng(29);
  // Param 0: a float32 param (no master; both calls leave it), param 1: the fp8 one,
  // param 2: bfloat16 with a float32 master, param 3: bfloat16 with a remainder.
  HostTensor plain({8}, kFloat32);
  for (int64_t i = 0; i < 8; ++i) plain.as<float>()[i] = static_cast<float>(i);
  HostTensor param(shape, f.dtype), scale = scale_tensor(s, shape), amax({1}, kFloat32);
  for (int64_t b = 0; b < scale.numel(); ++b) {
    if (s.value == SA_SCALING_MXFP8)
      scale.as<uint8_t>()[b] = 127;
    else
      scale.as<float>()[b] = 1.0f;
  }
  HostTensor bf16({8}, kBfloat16), bf16r({8}, kBfloat16);
  // After the tensors: the optimizer runs their deleters when it is destroyed.
  OptimizerPtr opt = make_optimizer(1);
  add_group(opt.get(), group_config(1e-2, 0.0, 1));
  const sa_param_options options = fp8_options(s, scale, s.block == 0 ? &amax : nullptr);
  sa_param_options remainder = SA_PARAM_OPTIONS_INIT;
  remainder.master = SA_MASTER_REMAINDER;
  REQUIRE_SA_OK(opt.get(), sa_optimizer_add_param(opt.get(), "plain", 0, plain.versioned(), nullptr,
                                                  nullptr, nullptr));
  REQUIRE_SA_OK(opt.get(), sa_optimizer_add_param(opt.get(), "w", 0, param.versioned(), nullptr,
                                                  &options, nullptr));
  REQUIRE_SA_OK(opt.get(), sa_optimizer_add_param(opt.get(), "b", 0, bf16.versioned(), nullptr,
                                                  nullptr, nullptr));
  REQUIRE_SA_OK(opt.get(), sa_optimizer_add_param(opt.get(), "r", 0, bf16r.versioned(), nullptr,
                                                  &remainder, nullptr));

  // A state dict's master, written through the view: the param and its block scales follow.
  if (s.block == 0) scale.as<float>()[0] = 2.0f;  // the engine's scale at the recast
  std::vector<float> loaded(static_cast<std::size_t>(n));
  for (float& x : loaded) x = static_cast<float>(rng.signed_log_uniform(1e-4, 3e4));
  {
    const StateView v = state_view(opt.get(), 1, "master");
    std::memcpy(v.data(), loaded.data(), loaded.size() * sizeof(float));
  }
  amax.as<float>()[0] = -1.0f;  // written as a step writes it: the masters' amax
  REQUIRE_SA_OK(opt.get(), sa_optimizer_recast_params(opt.get(), 0, 4));
  const Cast want = reference_cast(f, s, loaded, 2.0f);
  CHECK(std::memcmp(param.data(), want.codes.data(), want.codes.size()) == 0);
  if (s.value == SA_SCALING_MXFP8)
    CHECK(std::memcmp(scale.data(), want.mx_scales.data(), want.mx_scales.size()) == 0);
  if (s.value == SA_SCALING_BLOCK128)
    CHECK(std::memcmp(scale.data(), want.block_scales.data(), scale.bytes()) == 0);
  if (s.block == 0) CHECK(amax.as<float>()[0] == amax_of(loaded.data(), n));
  for (int64_t i = 0; i < 8; ++i) CHECK(plain.as<float>()[i] == static_cast<float>(i));

  // New weights in the params (a model checkpoint loaded after add_param): the masters follow.
  for (int64_t i = 0; i < n; ++i) {
    uint8_t c = static_cast<uint8_t>(rng.integer(0, 255));
    if (!std::isfinite(fp8_value(f, c))) c = 0x21;
    param.as<uint8_t>()[i] = c;
  }
  for (int64_t i = 0; i < 8; ++i) {
    bf16.as<uint16_t>()[i] = static_cast<uint16_t>(0x3F80 + 3 * i);   // 1.0, 1.0234375, ...
    bf16r.as<uint16_t>()[i] = static_cast<uint16_t>(0xBF80 + 5 * i);  // -1.0, ...
  }
  {  // a remainder that is not zero, as after steps
    const StateView r = state_view(opt.get(), 3, "remainder");
    for (int64_t i = 0; i < 8; ++i)
      static_cast<int16_t*>(r.data())[i] = static_cast<int16_t>(100 + i);
  }
  // A bad range first: nothing changes.
  CHECK_SA_FAILS(opt.get(), SA_ERR_INVALID_ARGUMENT, sa_optimizer_reset_masters(opt.get(), 1, 4),
                 "params [1, 1 + 4) is not a range of params (the optimizer has 4)");
  CHECK_SA_FAILS(opt.get(), SA_ERR_INVALID_ARGUMENT, sa_optimizer_recast_params(opt.get(), -1, 1),
                 "is not a range of params");
  CHECK(master_of(opt.get(), 1) == loaded);
  REQUIRE_SA_OK(opt.get(), sa_optimizer_reset_masters(opt.get(), 0, 4));
  const std::vector<float> m = master_of(opt.get(), 1);
  int64_t wrong = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float expect = reference_master(f, s, param.as<uint8_t>()[i], scale, i);
    if (std::memcmp(&m[static_cast<std::size_t>(i)], &expect, sizeof expect) != 0) ++wrong;
  }
  CHECK(wrong == 0);
  const std::vector<float> mb = master_of(opt.get(), 2);
  for (int64_t i = 0; i < 8; ++i) {
    CHECK(mb[static_cast<std::size_t>(i)] == bf16_bits_to_float(bf16.as<uint16_t>()[i]));
  }
  const StateView r = state_view(opt.get(), 3, "remainder");
  for (int64_t i = 0; i < 8; ++i) CHECK(static_cast<const int16_t*>(r.data())[i] == 0);
  CHECK(plain.as<float>()[0] == 0.0f);
}

// ---- current scaling: the whole tensor's amax, reduced across ranks --------------------------

namespace {

struct Current {
  Scaling scaling;
  bool pow2;
};
const Current kCurrents[] = {{{SA_SCALING_CURRENT, 0, "current"}, false},
                             {{SA_SCALING_CURRENT_POW2, 0, "current_pow2"}, true}};

// fp8_max / amax as block128's rule, divided by 2^margin (ldexp); pow2: 2^floor(log2) of
// it, by ilogb.
float current_scale_of(const Format& f, float amax, bool pow2, int margin = 0) {
  const float s = std::ldexp(block128_scale(f, amax), -margin);
  return pow2 ? std::ldexp(1.0f, std::ilogb(s)) : s;
}

// A [scale, scale_inv] tensor holding the scale_inv the engine cast its codes with.
HostTensor current_scale_tensor(float scale_inv) {
  HostTensor t({2}, kFloat32);
  t.as<float>()[0] = 1.0f / scale_inv;
  t.as<float>()[1] = scale_inv;
  return t;
}

// Checks codes, scale and amax against the reference for a shard whose tensor's max
// |master| is `amax`.
void check_current_cast(const Format& f, const Current& c, const HostTensor& param,
                        const std::vector<float>& master, const HostTensor& scale,
                        const HostTensor* amax_out, float amax, int margin = 0) {
  const float want = current_scale_of(f, amax, c.pow2, margin);
  CHECK(scale.as<float>()[0] == want);
  CHECK(scale.as<float>()[1] == 1.0f / want);
  if (amax_out != nullptr) CHECK(amax_out->as<float>()[0] == amax);
  int64_t wrong = 0, first = -1;
  for (std::size_t i = 0; i < master.size(); ++i)
    if (param.as<uint8_t>()[i] != fp8_cast(f, master[i] * want)) {
      if (first < 0) first = static_cast<int64_t>(i);
      ++wrong;
    }
  INFO("first wrong code at " << first << " of " << master.size());
  CHECK(wrong == 0);
}

}  // namespace

TEST_CASE(
    "a current-scaled fp8 param steps its master as a float32 param and casts it with "
    "(fp8_max / amax) / 2^margin (pow2: rounded down), writing [scale, scale_inv] and the amax",
    "[fp8param][current]") {
  const Format& f = kFormats[GENERATE(0, 1)];
  const Current& c = kCurrents[GENERATE(0, 1)];
  const std::vector<int64_t> shape =
      GENERATE(0, 1) == 0 ? std::vector<int64_t>{6, 40} : std::vector<int64_t>{2, 35072};
  const int margin = GENERATE(0, 3, 6);
  INFO(f.name << " " << c.scaling.name << " " << shape[0] << "x" << shape[1] << " margin "
              << margin);
  const int64_t n = shape[0] * shape[1];
  Rng rng(31);
  HostTensor param(shape, f.dtype), reference(shape, kFloat32), amax({1}, kFloat32);
  HostTensor scale = current_scale_tensor(0.125f);
  for (int64_t i = 0; i < n; ++i) {
    uint8_t code = static_cast<uint8_t>(rng.integer(0, 255));
    if (!std::isfinite(fp8_value(f, code))) code = 0x3A;
    param.as<uint8_t>()[i] = code;
    reference.as<float>()[i] = static_cast<float>(fp8_value(f, code)) * 0.125f;
  }
  const sa_group_config config = group_config(1e-2, 0.1, 1);
  OptimizerPtr opt = make_optimizer(2);
  OptimizerPtr ref = make_optimizer(2);
  add_group(opt.get(), config);
  add_group(ref.get(), config);
  sa_param_options options = fp8_options(c.scaling, scale, &amax);
  options.margin = margin;
  // The master starts as fp8 value * scale_inv.
  CHECK(add_twins(opt.get(), ref.get(), param, reference, options).margin == margin);
  HostTensor grad(shape, kFloat32);
  for (int step = 0; step < 3; ++step) {
    INFO("step " << step);
    fill_normal(grad, rng, step == 1 ? 1e3 : 1.0);
    const std::vector<float> m = step_twins(opt.get(), ref.get(), grad, reference);
    check_current_cast(f, c, param, m, scale, &amax, amax_of(m.data(), n), margin);
  }
  // A master written by the engine (a loaded state dict): recast_params rescales the tensor.
  {
    const StateView v = state_view(opt.get(), 0, "master");
    static_cast<float*>(v.data())[n / 2] = -3e4f;
  }
  REQUIRE_SA_OK(opt.get(), sa_optimizer_recast_params(opt.get(), 0, 1));
  check_current_cast(f, c, param, master_of(opt.get(), 0), scale, &amax, 3e4f, margin);
  // The largest finite amax: the margin's division stays exact (kMaxCurrentMargin's reason).
  {
    const StateView v = state_view(opt.get(), 0, "master");
    static_cast<float*>(v.data())[n / 2] = -FLT_MAX;
  }
  REQUIRE_SA_OK(opt.get(), sa_optimizer_recast_params(opt.get(), 0, 1));
  check_current_cast(f, c, param, master_of(opt.get(), 0), scale, &amax, FLT_MAX, margin);
  CHECK(std::isnormal(scale.as<float>()[0]));
  CHECK(std::isfinite(scale.as<float>()[1]));
}

TEST_CASE(
    "4 ranks with a host communicator: a sharded current-scaled param is cast with the "
    "whole tensor's scale on every rank (an empty shard's too), an unsharded one with its "
    "own, recast_params and an import onto one rank give the same codes",
    "[fp8param][current][comm]") {
  constexpr int kRanks = 4;
  const Current& c = kCurrents[GENERATE(0, 1)];
  INFO(c.scaling.name);
  // w: 10 rows over 4 ranks (3, 3, 3, 1); e: 3 rows over 4 (rank 3 holds none), float8_e5m2;
  // own: each rank's own tensor (no layout), of other magnitudes on every rank.
  struct Spec {
    const char* name;
    Dims shape;
    const Format* format;
    bool sharded;
  };
  const Spec specs[] = {{"w", {10, 48}, &kFormats[0], true},
                        {"e", {3, 40}, &kFormats[1], true},
                        {"own", {16}, &kFormats[0], false}};
  constexpr float kScaleInv = 0.25f;
  const Scenario rows = mesh_scenario("Shard(0)", {kRanks}, {shard(0)});
  Rng rng(37);
  // Global codes of each sharded param, and each rank's own tensor.
  std::vector<HostTensor> global_codes;
  for (const Spec& s : specs) {
    HostTensor t(s.shape, s.format->dtype);
    for (int64_t i = 0; i < t.numel(); ++i) {
      uint8_t code = static_cast<uint8_t>(rng.integer(0, 255));
      if (!std::isfinite(fp8_value(*s.format, code))) code = 0x21;
      t.as<uint8_t>()[i] = code;
    }
    global_codes.push_back(std::move(t));
  }
  struct RankState {
    std::vector<RankPlacement> places;
    std::vector<HostTensor> params, scales, amaxes, grads;
    OptimizerPtr opt;  // last: destroyed before the tensors it owns
  };
  ThreadComms comms(kRanks);
  std::vector<RankState> ranks(kRanks);
  for (int r = 0; r < kRanks; ++r) {
    RankState& rank = ranks[static_cast<std::size_t>(r)];
    rank.opt = make_optimizer(1);
    add_group(rank.opt.get(), group_config(1e-2, 0.0, 1));
    REQUIRE_SA_OK(rank.opt.get(), sa_optimizer_set_comm(rank.opt.get(), comms[r]));
    for (std::size_t k = 0; k < std::size(specs); ++k) {
      const Spec& s = specs[k];
      RankPlacement place;
      if (s.sharded) {
        place = rows.place(s.shape, r);
      } else {
        place.global_shape = s.shape;
        place.box = Box{Dims(s.shape.size(), 0), s.shape};
      }
      HostTensor p(place.box.shape, s.format->dtype);
      copy_box(global_codes[k].data(), p.data(), s.shape, place.box, 1, true);
      if (!s.sharded)  // the rank's own values: its codes shifted by r in magnitude
        for (int64_t i = 0; i < p.numel(); ++i)
          p.as<uint8_t>()[i] =
              static_cast<uint8_t>((p.as<uint8_t>()[i] & 0x80) | (0x10 * r + 0x08));
      rank.params.push_back(std::move(p));
      rank.scales.push_back(current_scale_tensor(kScaleInv));
      rank.amaxes.emplace_back(Dims{1}, kFloat32);
      rank.grads.emplace_back(place.box.shape, kFloat32);
      rank.places.push_back(place);
    }
    for (std::size_t k = 0; k < std::size(specs); ++k) {
      const sa_layout layout = rank.places[k].layout();
      const sa_param_options o = fp8_options(c.scaling, rank.scales[k], &rank.amaxes[k]);
      REQUIRE_SA_OK(
          rank.opt.get(),
          sa_optimizer_add_param(rank.opt.get(), specs[k].name, 0, rank.params[k].versioned(),
                                 specs[k].sharded ? &layout : nullptr, &o, nullptr));
    }
  }
  // Every rank at once (the all-reduce needs them all); statuses checked on this thread.
  const auto on_all_ranks = [&](const std::function<sa_status(RankState&)>& call) {
    std::vector<sa_status> status(kRanks, SA_ERR_INTERNAL);
    std::vector<std::string> error(kRanks);
    std::vector<std::thread> threads;
    for (int r = 0; r < kRanks; ++r)
      threads.emplace_back([&, r] {
        status[r] = call(ranks[static_cast<std::size_t>(r)]);
        error[r] = sa_optimizer_last_error(ranks[static_cast<std::size_t>(r)].opt.get());
      });
    for (auto& t : threads) t.join();
    for (int r = 0; r < kRanks; ++r) {
      INFO("rank " << r << ": " << sa_status_string(status[r]) << ": " << error[r]);
      REQUIRE(status[r] == SA_OK);
    }
  };
  // The reference: each rank's masters, assembled into the whole tensor (the update is
  // elementwise, so every rank's master is its box of a float32 param's; checked as a float32
  // twin in the test above), its amax, and each rank's codes against that tensor's scale.
  const auto check_ranks = [&] {
    for (std::size_t k = 0; k < std::size(specs); ++k) {
      const Spec& s = specs[k];
      std::vector<float> whole(static_cast<std::size_t>(numel_of(s.shape)));
      for (int r = 0; r < kRanks; ++r) {
        RankState& rank = ranks[static_cast<std::size_t>(r)];
        if (!s.sharded) continue;
        const std::vector<float> m = master_of(rank.opt.get(), static_cast<int64_t>(k));
        copy_box(m.data(), whole.data(), s.shape, rank.places[k].box, sizeof(float), false);
      }
      for (int r = 0; r < kRanks; ++r) {
        INFO("param '" << s.name << "' on rank " << r);
        RankState& rank = ranks[static_cast<std::size_t>(r)];
        const std::vector<float> m = master_of(rank.opt.get(), static_cast<int64_t>(k));
        const float amax = s.sharded ? amax_of(whole.data(), numel_of(s.shape))
                                     : amax_of(m.data(), static_cast<int64_t>(m.size()));
        check_current_cast(*s.format, c, rank.params[k], m, rank.scales[k], &rank.amaxes[k], amax);
      }
    }
  };
  // A step on every rank, the grads' global values normal times `magnitude`.
  const auto step_all = [&](double magnitude) {
    for (std::size_t k = 0; k < std::size(specs); ++k) {
      HostTensor g(specs[k].shape, kFloat32);
      fill_normal(g, rng, magnitude);
      for (RankState& rank : ranks)
        copy_box(g.data(), rank.grads[k].data(), specs[k].shape, rank.places[k].box, sizeof(float),
                 true);
    }
    on_all_ranks([&](RankState& rank) {
      for (std::size_t k = 0; k < std::size(specs); ++k) {
        const DLTensor g = rank.grads[k].dl();
        const sa_status s = sa_optimizer_set_grad(rank.opt.get(), static_cast<int64_t>(k), &g);
        if (s != SA_OK) return s;
      }
      return sa_optimizer_step(rank.opt.get(), nullptr, nullptr);
    });
  };
  for (int step = 0; step < 3; ++step) {
    INFO("step " << step);
    step_all(step == 1 ? 1e2 : 1.0);
    check_ranks();
  }
  // Rank 0's own amax gives another scale than the tensor's, so a missing reduction shows
  // (for pow2 they may round alike here; the recast below makes them differ).
  if (!c.pow2) {
    const std::vector<float> m0 = master_of(ranks[0].opt.get(), 0);
    CHECK(
        ranks[0].scales[0].as<float>()[0] !=
        current_scale_of(kFormats[0], amax_of(m0.data(), static_cast<int64_t>(m0.size())), false));
  }

  // Masters written on one rank (a loaded state dict): the collective recast rescales all.
  {
    const StateView v = state_view(ranks[3].opt.get(), 0, "master");
    static_cast<float*>(v.data())[5] = 2e4f;
  }
  on_all_ranks([&](RankState& rank) { return sa_optimizer_recast_params(rank.opt.get(), 0, 3); });
  check_ranks();
  CHECK(ranks[1].amaxes[0].as<float>()[0] == 2e4f);

  // Every master a quarter of what it was: the next step's amax falls, and no rank may
  // bring an amax of before into the reduction (an empty shard has none of its own).
  for (RankState& rank : ranks)
    for (std::size_t k = 0; k < std::size(specs); ++k) {
      const StateView v = state_view(rank.opt.get(), static_cast<int64_t>(k), "master");
      for (int64_t i = 0; i < v.numel(); ++i) static_cast<float*>(v.data())[i] *= 0.25f;
    }
  {
    INFO("the step after the masters fell");
    step_all(1.0);
    check_ranks();
  }

  // One rank holding all of w, from the four ranks' files: the whole tensor's scale again,
  // so its codes are the ranks' codes side by side.
  std::vector<Bytes> blobs;
  for (RankState& rank : ranks) blobs.push_back(export_blob(rank.opt.get()));
  HostTensor whole_param(specs[0].shape, kFormats[0].dtype);
  HostTensor whole_scale = current_scale_tensor(1.0f);
  OptimizerPtr whole = make_optimizer(1);
  add_group(whole.get(), group_config(1e-2, 0.0, 1));
  const sa_param_options o = fp8_options(c.scaling, whole_scale, nullptr);
  REQUIRE_SA_OK(whole.get(), sa_optimizer_add_param(whole.get(), "w", 0, whole_param.versioned(),
                                                    nullptr, &o, nullptr));
  sa_import_options allow = SA_IMPORT_OPTIONS_INIT;
  allow.allow_unexpected = 1;  // e and own are not whole's
  REQUIRE_SA_OK(whole.get(), import_blobs(whole.get(), blobs, &allow));
  for (int r = 0; r < kRanks; ++r) {
    const Box& box = ranks[static_cast<std::size_t>(r)].places[0].box;
    CHECK(std::memcmp(whole_param.as<uint8_t>() + box.offset[0] * 48,
                      ranks[static_cast<std::size_t>(r)].params[0].data(),
                      static_cast<std::size_t>(numel_of(box.shape))) == 0);
  }
  CHECK(whole_scale.as<float>()[0] == ranks[0].scales[0].as<float>()[0]);
}

TEST_CASE("current scaling refuses what would give ranks different scales, and changes nothing",
          "[fp8param][current][errors]") {
  HostTensor param({4, 32}, kE4m3);
  HostTensor scale = current_scale_tensor(1.0f);
  // Rank 0 of a 2-rank Shard(0) layout.
  const MeshLayout rows{{8, 32}, {2}, {0}, {shard(0)}};
  const sa_layout layout = rows.get();
  const sa_param_options o = fp8_options(kCurrents[0].scaling, scale, nullptr);
  OptimizerPtr opt = make_optimizer(1);
  add_group(opt.get(), group_config(1e-2, 0.0, 1));
  CHECK_SA_FAILS(
      opt.get(), SA_ERR_INVALID_ARGUMENT,
      sa_optimizer_add_param(opt.get(), "w", 0, param.versioned(), &layout, &o, nullptr),
      "param 'w': SA_SCALING_CURRENT scales the whole tensor by its amax, and this layout "
      "splits the tensor across ranks, so the amax must be reduced across them: set a "
      "communicator (sa_optimizer_set_comm) before adding the param");
  {
    HostTensor one({1}, kFloat32);
    sa_param_options bad = o;
    bad.scale = one.versioned();
    CHECK_SA_FAILS(
        opt.get(), SA_ERR_INVALID_ARGUMENT,
        sa_optimizer_add_param(opt.get(), "w", 0, param.versioned(), nullptr, &bad, nullptr),
        "options.scale has shape [1]; it must be [2]");
    HostTensor zero = current_scale_tensor(1.0f);
    zero.as<float>()[1] = 0.0f;
    bad.scale = zero.versioned();
    CHECK_SA_FAILS(
        opt.get(), SA_ERR_INVALID_ARGUMENT,
        sa_optimizer_add_param(opt.get(), "w", 0, param.versioned(), nullptr, &bad, nullptr),
        "the scale_inv (scale[1]) is 0; it must be > 0 and finite");
    for (const int margin : {-1, 7}) {
      sa_param_options wide = o;
      wide.margin = margin;
      const std::string said = "options.margin is " + std::to_string(margin) +
                               "; it must be 0 to 6 (a larger one would take the scale of a "
                               "large finite amax below float32's normal range)";
      CHECK_SA_FAILS(
          opt.get(), SA_ERR_INVALID_ARGUMENT,
          sa_optimizer_add_param(opt.get(), "w", 0, param.versioned(), nullptr, &wide, nullptr),
          said.c_str());
    }
    HostTensor delayed_scale({1}, kFloat32);
    delayed_scale.as<float>()[0] = 1.0f;
    sa_param_options delayed = o;
    delayed.scaling = SA_SCALING_DELAYED;
    delayed.scale = delayed_scale.versioned();
    delayed.margin = 1;
    CHECK_SA_FAILS(
        opt.get(), SA_ERR_INVALID_ARGUMENT,
        sa_optimizer_add_param(opt.get(), "w", 0, param.versioned(), nullptr, &delayed, nullptr),
        "options.margin is 1, but only SA_SCALING_CURRENT and SA_SCALING_CURRENT_POW2 take a "
        "margin (a delayed scaling casts with the engine's scale: apply the margin there)");
    CHECK(delayed_scale.deleter_calls() == 0);
  }
  CHECK(sa_optimizer_num_params(opt.get()) == 0);
  CHECK(param.deleter_calls() == 0);
  CHECK(scale.deleter_calls() == 0);

  // With a communicator it is added, and the communicator cannot be taken away.
  ThreadComms comms(2);
  REQUIRE_SA_OK(opt.get(), sa_optimizer_set_comm(opt.get(), comms[0]));
  REQUIRE_SA_OK(opt.get(),
                sa_optimizer_add_param(opt.get(), "w", 0, param.versioned(), &layout, &o, nullptr));
  CHECK_SA_FAILS(opt.get(), SA_ERR_STATE, sa_optimizer_set_comm(opt.get(), nullptr),
                 "param 'w' is SA_SCALING_CURRENT and sharded, so every step reduces its amax "
                 "through the communicator; it cannot be removed");

  // Two ranks that hold other params: the first step says so on both, and steps nothing.
  // rank 1's current-scaled sharded params: 1 ("v"), 2 ("w", "x"), or 3: "w" with margin 1
  const int count = GENERATE(1, 2, 3);
  INFO("rank 1 holds " << count);
  HostTensor other({4, 32}, kE4m3), extra({4, 32}, kE4m3);
  HostTensor other_scale = current_scale_tensor(1.0f), extra_scale = current_scale_tensor(1.0f);
  const MeshLayout rows1{{8, 32}, {2}, {1}, {shard(0)}};
  const sa_layout layout1 = rows1.get();
  OptimizerPtr opt1 = make_optimizer(1);
  add_group(opt1.get(), group_config(1e-2, 0.0, 1));
  REQUIRE_SA_OK(opt1.get(), sa_optimizer_set_comm(opt1.get(), comms[1]));
  sa_param_options o1 = fp8_options(kCurrents[0].scaling, other_scale, nullptr);
  o1.margin = count == 3 ? 1 : 0;
  REQUIRE_SA_OK(opt1.get(), sa_optimizer_add_param(opt1.get(), count == 1 ? "v" : "w", 0,
                                                   other.versioned(), &layout1, &o1, nullptr));
  if (count == 2) {
    const sa_param_options o2 = fp8_options(kCurrents[0].scaling, extra_scale, nullptr);
    REQUIRE_SA_OK(opt1.get(), sa_optimizer_add_param(opt1.get(), "x", 0, extra.versioned(),
                                                     &layout1, &o2, nullptr));
  }
  HostTensor grad({4, 32}, kFloat32);
  grad.as<float>()[0] = 1.0f;
  const DLTensor g = grad.dl();
  for (sa_optimizer* o_ : {opt.get(), opt1.get()}) {
    sa_optimizer_set_grad(o_, 0, &g);
    if (o_ == opt1.get() && count == 2) sa_optimizer_set_grad(o_, 1, &g);
  }
  const std::vector<float> before = master_of(opt.get(), 0);
  sa_status status[2] = {SA_OK, SA_OK};
  std::string error[2];
  {
    std::thread t1([&] {
      status[1] = sa_optimizer_step(opt1.get(), nullptr, nullptr);
      error[1] = sa_optimizer_last_error(opt1.get());
    });
    status[0] = sa_optimizer_step(opt.get(), nullptr, nullptr);
    error[0] = sa_optimizer_last_error(opt.get());
    t1.join();
  }
  const std::string want =
      count != 2 ? "hold 1 current-scaled sharded params each, but not the same ones"
                 : "hold different numbers of current-scaled sharded params (from 1 to 2";
  for (int r = 0; r < 2; ++r) {
    INFO("rank " << r << ": " << error[r]);
    CHECK(status[r] == SA_ERR_MISMATCH);
    CHECK(error[r].find(want) != std::string::npos);
  }
  CHECK(master_of(opt.get(), 0) == before);
  CHECK(param.as<uint8_t>()[0] == 0);
}

TEST_CASE(
    "a communicator failing between the passes of a current-scaled step says the params "
    "are stale, and recast_params mends them",
    "[fp8param][current][comm][errors]") {
  // One rank of a 2-rank Shard(0) layout whose communicator answers as if the other rank
  // held smaller values (the identity), and fails its call number `fail_at`.
  struct Flaky {
    int calls = 0;
    int fail_at = 2;  // 1: the ranks' agreement, 2: the step's amax
  } flaky;
  sa_host_comm callbacks = SA_HOST_COMM_INIT;
  callbacks.ctx = &flaky;
  callbacks.all_reduce = [](void* ctx, double*, int32_t, sa_reduce_op) {
    auto* f = static_cast<Flaky*>(ctx);
    return ++f->calls == f->fail_at ? 7 : 0;
  };
  CommPtr comm = host_comm(callbacks);
  HostTensor param({4, 32}, kE4m3);
  for (int64_t i = 0; i < param.numel(); ++i)
    param.as<uint8_t>()[i] = static_cast<uint8_t>(0x30 + i % 16);
  HostTensor scale = current_scale_tensor(1.0f);
  // Rank 0 of a 2-rank Shard(0) layout.
  const MeshLayout rows{{8, 32}, {2}, {0}, {shard(0)}};
  const sa_layout layout = rows.get();
  OptimizerPtr opt = make_optimizer(1);
  add_group(opt.get(), group_config(1e-2, 0.0, 1));
  REQUIRE_SA_OK(opt.get(), sa_optimizer_set_comm(opt.get(), comm.get()));
  const sa_param_options o = fp8_options(kCurrents[0].scaling, scale, nullptr);
  REQUIRE_SA_OK(opt.get(),
                sa_optimizer_add_param(opt.get(), "w", 0, param.versioned(), &layout, &o, nullptr));
  HostTensor grad({4, 32}, kFloat32);
  Rng rng(41);
  fill_normal(grad, rng, 1.0);
  const DLTensor g = grad.dl();
  REQUIRE_SA_OK(opt.get(), sa_optimizer_set_grad(opt.get(), 0, &g));
  const std::vector<unsigned char> codes_before = param.raw_bytes();
  CHECK_SA_FAILS(opt.get(), SA_ERR_COMM, sa_optimizer_step(opt.get(), nullptr, nullptr),
                 "returned 7",
                 "this step's update was applied, but the current-scaled fp8 params were not "
                 "cast from their new masters: sa_optimizer_recast_params casts them");
  CHECK(param.raw_bytes() == codes_before);  // stale, as the message says
  REQUIRE_SA_OK(opt.get(), sa_optimizer_recast_params(opt.get(), 0, 1));
  const std::vector<float> m = master_of(opt.get(), 0);
  check_current_cast(kFormats[0], kCurrents[0], param, m, scale, nullptr,
                     amax_of(m.data(), static_cast<int64_t>(m.size())));
  CHECK(param.raw_bytes() != codes_before);
}
