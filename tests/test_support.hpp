// tests/test_support.hpp — what the unit tests share: an owning host tensor that can be
// handed to the optimizer as a DLPack tensor (and records whether its deleter ran), seeded
// random data, dtype conversions, an RAII optimizer handle, status checks that also read
// the handle's error message, and the float64 Adam reference every numeric test compares
// against.
//
// The reference is written from the formula in the comment on sa_group_config
// (shardadam.h), in double, with its own rounding to bfloat16/float16: it shares no code
// with kernels/adam_math.h. (Test *inputs* are converted with adam_math.h's conversions,
// which test_cpu_kernel.cpp checks against independent references.)
#ifndef SHARDADAM_TESTS_TEST_SUPPORT_HPP_
#define SHARDADAM_TESTS_TEST_SUPPORT_HPP_

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/adam_math.h"
#include "shardadam/shardadam.h"

namespace sa_test {

// ---- dtypes -----------------------------------------------------------------------------

constexpr DLDataType kFloat32 = {kDLFloat, 32, 1};
constexpr DLDataType kBfloat16 = {kDLBfloat, 16, 1};
constexpr DLDataType kFloat16 = {kDLFloat, 16, 1};
constexpr DLDataType kFloat64 = {kDLFloat, 64, 1};
constexpr DLDataType kInt32 = {kDLInt, 32, 1};
constexpr DLDataType kInt16 = {kDLInt, 16, 1};
constexpr DLDataType kUint8 = {kDLUInt, 8, 1};  // moment_dtype: 8-bit blockwise moments
constexpr DLDataType kFloat8E4m3fn = {kDLFloat8_e4m3fn, 8, 1};  // moment_dtype: float8 blocks
constexpr DLDataType kDefaultDtype = {0, 0, 0};  // "use the default" in sa_param_options

inline bool same_dtype(DLDataType a, DLDataType b) {
  return a.code == b.code && a.bits == b.bits && a.lanes == b.lanes;
}

inline std::size_t dtype_bytes(DLDataType d) {
  return (static_cast<std::size_t>(d.bits) * d.lanes + 7) / 8;
}

inline std::string dtype_label(DLDataType d) {
  if (same_dtype(d, kFloat32)) return "f32";
  if (same_dtype(d, kBfloat16)) return "bf16";
  if (same_dtype(d, kFloat16)) return "f16";
  if (same_dtype(d, kInt16)) return "i16";
  return "code" + std::to_string(d.code) + "/" + std::to_string(d.bits);
}

// Test-input conversions (bit patterns <-> float), from adam_math.h.
inline float bf16_bits_to_float(uint16_t h) { return sa::kernels::bf16_to_float(h); }
inline uint16_t float_to_bf16_bits(float f) { return sa::kernels::float_to_bf16(f); }
inline float f16_bits_to_float(uint16_t h) { return sa::kernels::half_to_float(h); }
inline uint16_t float_to_f16_bits(float f) { return sa::kernels::float_to_half(f); }

// ---- independent rounding (for the reference) ------------------------------------------
// Rounds x to `precision` significant bits with ties to even (the default FP rounding mode
// of nearbyint), binary exponents below min_exp rounding as subnormals, and magnitudes
// above max_finite becoming infinity. Exact in double for the float formats below.
inline double round_significand(double x, int precision, int min_exp, double max_finite) {
  if (x == 0.0 || !std::isfinite(x)) return x;
  const int e = std::max(std::ilogb(x), min_exp);
  const double quantum = std::ldexp(1.0, e - (precision - 1));
  const double r = std::nearbyint(x / quantum) * quantum;
  return std::fabs(r) > max_finite ? std::copysign(HUGE_VAL, x) : r;
}

inline double round_to_bf16(double x) {
  return round_significand(x, 8, -126, std::ldexp(255.0, 120));  // max 0x7F7F
}
inline double round_to_f16(double x) { return round_significand(x, 11, -14, 65504.0); }
inline double round_to_f32(double x) { return static_cast<double>(static_cast<float>(x)); }

// The bfloat16 nearest x with ties away from zero (the SA_MASTER_REMAINDER param rule).
inline double round_to_bf16_ties_away(double x) {
  if (x == 0.0 || !std::isfinite(x)) return x;
  const int e = std::max(std::ilogb(x), -126);
  const double quantum = std::ldexp(1.0, e - 7);
  return std::round(x / quantum) * quantum;  // std::round: halfway cases away from zero
}

// One unit in the last place of a format of `precision` significant bits at x.
inline double ulp_at(double x, int precision, int min_exp) {
  const int e = x == 0.0 ? min_exp : std::max(std::ilogb(x), min_exp);
  return std::ldexp(1.0, e - (precision - 1));
}

// ---- seeded randomness --------------------------------------------------------------------

// mt19937_64's output sequence is fixed by the standard; the conversions below are ours,
// so the data is the same with every standard library.
class Rng {
 public:
  explicit Rng(uint64_t seed) : gen_(seed) {}
  double uniform() { return static_cast<double>(gen_() >> 11) * 0x1.0p-53; }  // [0, 1)
  double uniform(double lo, double hi) { return lo + (hi - lo) * uniform(); }
  int64_t integer(int64_t lo, int64_t hi) {  // inclusive
    return lo + static_cast<int64_t>(gen_() % static_cast<uint64_t>(hi - lo + 1));
  }
  bool chance(double p) { return uniform() < p; }
  double normal() {  // Box-Muller
    const double u1 = 1.0 - uniform();
    const double u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }
  // A random sign times a magnitude log-uniform in [lo, hi]: grads spanning decades, so
  // that eps matters for some elements and not for others.
  double signed_log_uniform(double lo, double hi) {
    const double mag = std::exp(uniform(std::log(lo), std::log(hi)));
    return chance(0.5) ? mag : -mag;
  }

 private:
  std::mt19937_64 gen_;
};

// ---- an owning host tensor that can be handed over as DLPack ------------------------------

// Owns 64-byte aligned host memory (plus `misalign_bytes`, to build misaligned tensors) and
// exposes it as a DLTensor, a DLManagedTensorVersioned or a legacy DLManagedTensor. The
// managed forms' deleters free nothing: they count their calls, so a test can check the
// DLPack ownership contract while the data stays readable after the optimizer is gone.
// Movable; the managed structs live on the heap, so pointers handed out stay valid.
// A tensor an optimizer has taken must outlive that optimizer (declare it first): the
// optimizer updates its data and, at destroy, calls its deleter.
class HostTensor {
 public:
  HostTensor(std::vector<int64_t> shape, DLDataType dtype, std::size_t misalign_bytes = 0)
      : body_(std::make_unique<Body>()) {
    Body& b = *body_;
    b.shape = std::move(shape);
    b.dtype = dtype;
    b.device = DLDevice{kDLCPU, 0};
    b.numel = 1;
    for (int64_t d : b.shape) b.numel *= d;
    b.bytes = static_cast<std::size_t>(b.numel) * dtype_bytes(dtype);
    const std::size_t total = (b.bytes + misalign_bytes + 64 + 63) / 64 * 64;
    b.storage.reset(static_cast<unsigned char*>(std::aligned_alloc(64, total)));
    REQUIRE(b.storage != nullptr);
    std::memset(b.storage.get(), 0, total);
    b.data = b.storage.get() + misalign_bytes;
  }

  int64_t numel() const { return body_->numel; }
  int32_t ndim() const { return static_cast<int32_t>(body_->shape.size()); }
  const std::vector<int64_t>& shape() const { return body_->shape; }
  DLDataType dtype() const { return body_->dtype; }
  std::size_t bytes() const { return body_->bytes; }
  void* data() const { return body_->data; }
  template <class T>
  T* as() const {
    return static_cast<T*>(body_->data);
  }

  // Element i as a float (bfloat16/float16 widened exactly). Byte copies, so that the
  // deliberately misaligned tensors of the bad-input tests can be filled too.
  float get(int64_t i) const {
    const DLDataType d = body_->dtype;
    const unsigned char* at = static_cast<const unsigned char*>(body_->data) + i * dtype_bytes(d);
    if (same_dtype(d, kFloat32)) {
      float f;
      std::memcpy(&f, at, sizeof f);
      return f;
    }
    uint16_t h;
    std::memcpy(&h, at, sizeof h);
    if (same_dtype(d, kBfloat16)) return bf16_bits_to_float(h);
    if (same_dtype(d, kFloat16)) return f16_bits_to_float(h);
    FAIL("HostTensor::get on dtype " << dtype_label(d));
    return 0.0f;
  }
  // Stores v rounded to nearest even in the tensor's dtype.
  void set(int64_t i, float v) {
    const DLDataType d = body_->dtype;
    unsigned char* at = static_cast<unsigned char*>(body_->data) + i * dtype_bytes(d);
    if (same_dtype(d, kFloat32)) {
      std::memcpy(at, &v, sizeof v);
      return;
    }
    uint16_t h = 0;
    if (same_dtype(d, kBfloat16)) {
      h = float_to_bf16_bits(v);
    } else if (same_dtype(d, kFloat16)) {
      h = float_to_f16_bits(v);
    } else {
      FAIL("HostTensor::set on dtype " << dtype_label(d));
    }
    std::memcpy(at, &h, sizeof h);
  }
  std::vector<unsigned char> raw_bytes() const {
    const auto* p = static_cast<const unsigned char*>(body_->data);
    return std::vector<unsigned char>(p, p + body_->bytes);
  }

  // Knobs for the bad-input tests; they apply to every form handed out afterwards.
  void set_strides(std::vector<int64_t> strides) { body_->strides = std::move(strides); }
  void set_device(DLDevice device) { body_->device = device; }

  // A borrowed view (as a grad is bound).
  DLTensor dl() const {
    Body& b = *body_;
    DLTensor t{};
    t.data = b.data;
    t.device = b.device;
    t.ndim = static_cast<int32_t>(b.shape.size());
    t.dtype = b.dtype;
    t.shape = b.shape.data();
    t.strides = b.strides.empty() ? nullptr : b.strides.data();
    t.byte_offset = 0;
    return t;
  }

  // The managed form an owner hands over; refreshed from the knobs on every call.
  DLManagedTensorVersioned* versioned() {
    DLManagedTensorVersioned& m = body_->versioned;
    m.version = DLPackVersion{DLPACK_MAJOR_VERSION, DLPACK_MINOR_VERSION};
    m.manager_ctx = body_.get();
    m.deleter = [](DLManagedTensorVersioned* self) {
      ++static_cast<Body*>(self->manager_ctx)->deleter_calls;
    };
    m.flags = 0;
    m.dl_tensor = dl();
    return &m;
  }
  DLManagedTensor* legacy() {
    DLManagedTensor& m = body_->legacy;
    m.manager_ctx = body_.get();
    m.deleter = [](DLManagedTensor* self) {
      ++static_cast<Body*>(self->manager_ctx)->deleter_calls;
    };
    m.dl_tensor = dl();
    return &m;
  }

  // How often either managed form's deleter has run.
  int deleter_calls() const { return body_->deleter_calls; }

 private:
  struct FreeDeleter {
    void operator()(unsigned char* p) const { std::free(p); }
  };
  struct Body {
    std::vector<int64_t> shape;
    std::vector<int64_t> strides;  // empty: NULL strides (C-contiguous)
    DLDataType dtype{};
    DLDevice device{};
    int64_t numel = 0;
    std::size_t bytes = 0;
    std::unique_ptr<unsigned char, FreeDeleter> storage;
    void* data = nullptr;
    DLManagedTensorVersioned versioned{};
    DLManagedTensor legacy{};
    int deleter_calls = 0;
  };
  std::unique_ptr<Body> body_;
};

// Every element of t, widened to double.
inline std::vector<double> values_of(const HostTensor& t) {
  std::vector<double> out(static_cast<std::size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) out[static_cast<std::size_t>(i)] = t.get(i);
  return out;
}

// Fills t with normal(0, scale) values, rounded to its dtype.
inline void fill_normal(HostTensor& t, Rng& rng, double scale) {
  for (int64_t i = 0; i < t.numel(); ++i) t.set(i, static_cast<float>(scale * rng.normal()));
}

// Fills t with sign * log-uniform magnitudes in [lo, hi], rounded to its dtype.
inline void fill_log_uniform(HostTensor& t, Rng& rng, double lo, double hi) {
  for (int64_t i = 0; i < t.numel(); ++i)
    t.set(i, static_cast<float>(rng.signed_log_uniform(lo, hi)));
}

// ---- the optimizer handle ----------------------------------------------------------------

struct OptimizerDeleter {
  void operator()(sa_optimizer* opt) const { sa_optimizer_destroy(opt); }
};
using OptimizerPtr = std::unique_ptr<sa_optimizer, OptimizerDeleter>;

inline OptimizerPtr make_optimizer(int32_t num_threads = 1, int32_t cpu_simd = 1) {
  sa_optimizer_config config = SA_OPTIMIZER_CONFIG_INIT;
  config.num_threads = num_threads;
  config.cpu_simd = cpu_simd;
  sa_optimizer* opt = nullptr;
  const sa_status status = sa_optimizer_create(&config, &opt);
  INFO("sa_optimizer_create: " << sa_status_string(status) << ": " << sa_last_error());
  REQUIRE(status == SA_OK);
  REQUIRE(opt != nullptr);
  return OptimizerPtr(opt);
}

inline sa_group_config group_config(double lr, double weight_decay, int32_t decoupled) {
  sa_group_config c = SA_GROUP_CONFIG_INIT;
  c.lr = lr;
  c.weight_decay = weight_decay;
  c.decoupled_weight_decay = decoupled;
  return c;
}

inline sa_param_options param_options(DLDataType grad_dtype, DLDataType moment_dtype,
                                      int32_t master) {
  sa_param_options o = SA_PARAM_OPTIONS_INIT;
  o.grad_dtype = grad_dtype;
  o.moment_dtype = moment_dtype;
  o.master = master;
  return o;
}

// A 1-D mesh-form layout over `ranks` with Shard(dim); arrays owned by the struct.
struct MeshLayout {
  std::vector<int64_t> global_shape;
  std::vector<int64_t> mesh_shape;
  std::vector<int64_t> mesh_coord;
  std::vector<sa_placement> placements;
  sa_layout get() const {
    sa_layout l = SA_LAYOUT_INIT;
    l.ndim = static_cast<int32_t>(global_shape.size());
    l.global_shape = global_shape.data();
    l.mesh_ndim = static_cast<int32_t>(mesh_shape.size());
    l.mesh_shape = mesh_shape.data();
    l.mesh_coord = mesh_coord.data();
    l.placements = placements.data();
    return l;
  }
};

inline sa_placement shard(int32_t dim) { return sa_placement{SA_PLACEMENT_SHARD, dim}; }
inline sa_placement replicate() { return sa_placement{SA_PLACEMENT_REPLICATE, 0}; }
inline sa_placement partial() { return sa_placement{SA_PLACEMENT_PARTIAL, 0}; }

// ---- status checks -------------------------------------------------------------------------

// The call succeeds; on failure the report shows the status and the handle's message.
#define REQUIRE_SA_OK(opt, call)                                       \
  do {                                                                 \
    const sa_status sa_status_ = (call);                               \
    INFO(#call << " returned " << sa_status_string(sa_status_) << ": " \
               << sa_optimizer_last_error(opt));                       \
    REQUIRE(std::string(sa_status_string(sa_status_)) == "SA_OK");     \
  } while (0)

// The call fails with `expected`, and the error message kept on `opt` (the thread-local
// one when opt is NULL) contains every one of the given substrings.
#define CHECK_SA_FAILS(opt, expected, call, ...)                                       \
  do {                                                                                 \
    const sa_status sa_status_ = (call);                                               \
    const std::string sa_message_ = sa_optimizer_last_error(opt);                      \
    INFO(#call << "\n  returned " << sa_status_string(sa_status_) << "\n  message: \"" \
               << sa_message_ << "\"");                                                \
    CHECK(std::string(sa_status_string(sa_status_)) == sa_status_string(expected));    \
    /* strings, not pointers: a part may point into a temporary of the range's */      \
    /* initializer, which dies before the loop's body runs */                         \
    for (const std::string& sa_part_ : std::initializer_list<std::string>{__VA_ARGS__}) \
      CHECK_THAT(sa_message_, Catch::Contains(sa_part_));                              \
  } while (0)

// ---- reading state -------------------------------------------------------------------------

// A state view, released when this goes out of scope.
struct StateView {
  DLManagedTensorVersioned* view = nullptr;
  StateView() = default;
  explicit StateView(DLManagedTensorVersioned* v) : view(v) {}
  StateView(StateView&& o) noexcept : view(o.view) { o.view = nullptr; }
  StateView& operator=(StateView&& o) noexcept {
    std::swap(view, o.view);
    return *this;
  }
  StateView(const StateView&) = delete;
  StateView& operator=(const StateView&) = delete;
  ~StateView() {
    if (view && view->deleter) view->deleter(view);
  }
  int64_t numel() const {
    int64_t n = 1;
    for (int32_t d = 0; d < view->dl_tensor.ndim; ++d) n *= view->dl_tensor.shape[d];
    return n;
  }
  void* data() const {
    return static_cast<char*>(view->dl_tensor.data) + view->dl_tensor.byte_offset;
  }
  // Element i widened to double (float32 / bfloat16 / int16 states).
  double get(int64_t i) const {
    const DLDataType d = view->dl_tensor.dtype;
    if (same_dtype(d, kFloat32)) return static_cast<const float*>(data())[i];
    if (same_dtype(d, kBfloat16))
      return bf16_bits_to_float(static_cast<const uint16_t*>(data())[i]);
    if (same_dtype(d, kInt16)) return static_cast<const int16_t*>(data())[i];
    FAIL("StateView::get on dtype " << dtype_label(d));
    return 0.0;
  }
  std::vector<unsigned char> raw_bytes() const {
    const auto* p = static_cast<const unsigned char*>(data());
    return std::vector<unsigned char>(p, p + numel() * dtype_bytes(view->dl_tensor.dtype));
  }
};

inline StateView state_view(sa_optimizer* opt, int64_t param, const char* key) {
  DLManagedTensorVersioned* out = nullptr;
  REQUIRE_SA_OK(opt, sa_optimizer_state_view(opt, param, key, &out));
  REQUIRE(out != nullptr);
  return StateView(out);
}

inline int64_t step_count(const sa_optimizer* opt, int32_t group) {
  int64_t step = -1;
  REQUIRE_SA_OK(opt, sa_optimizer_get_step(opt, group, &step));
  return step;
}

// The fp32 value hi:rem of a bfloat16 param with an int16 remainder, by its definition in
// shardadam.h: (param bits << 16) + remainder, as 32-bit two's complement arithmetic.
inline float join_param_and_remainder(uint16_t hi, int16_t rem) {
  const uint32_t bits =
      (static_cast<uint32_t>(hi) << 16) + static_cast<uint32_t>(static_cast<int32_t>(rem));
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// ---- the float64 Adam reference -------------------------------------------------------------

// How a value is stored between steps; the reference rounds to it after every step.
enum class Storage { f32, bf16, f16 };

inline double round_to(Storage s, double x) {
  switch (s) {
    case Storage::f32:
      return round_to_f32(x);
    case Storage::bf16:
      return round_to_bf16(x);
    case Storage::f16:
      return round_to_f16(x);
  }
  return x;
}

inline Storage storage_of(DLDataType d) {
  if (same_dtype(d, kBfloat16)) return Storage::bf16;
  if (same_dtype(d, kFloat16)) return Storage::f16;
  return Storage::f32;
}

// Deliberate mistakes, so a test can show that its tolerance would catch them.
enum class RefBug {
  none,
  no_bias_correction,          // forgets 1 - beta^t
  swapped_betas,               // beta1 <-> beta2
  eps_before_bias_correction,  // (sqrt(v) + eps) / sqrt(bc2) instead of sqrt(v) / sqrt(bc2) + eps
  eps_inside_sqrt,             // sqrt(v / bc2 + eps)
  decay_swapped,               // L2 where decoupled was asked, and vice versa
  moments_not_carried,         // starts every step from zero moments
};

// One param's reference state: `value` is the full-precision value (kept as float32 by the
// library: the fp32 param, the fp32 master, or param:remainder), m/v/vmax the moments in
// `moment_storage`.
struct RefState {
  Storage moment_storage = Storage::f32;
  std::vector<double> value, m, v, vmax;

  RefState() = default;
  RefState(std::vector<double> initial_value, Storage moments)
      : moment_storage(moments), value(std::move(initial_value)) {
    m.assign(value.size(), 0.0);
    v.assign(value.size(), 0.0);
    vmax.assign(value.size(), 0.0);
  }
};

// Per-element magnitudes of one reference step, which the tests scale their tolerances by:
// the step size actually applied (lr / bc1), and the sizes of the terms summed into m and
// v (float rounding errors are relative to the terms, not to a sum that may cancel, and
// the grad is itself a sum under L2 decay).
struct RefScales {
  double step_size = 0.0;
  std::vector<double> m_terms, v_terms;
};

// One step of the update documented on sa_group_config, in double; t is the group's step
// count after this step. Within the step the unrounded moments are used (the library
// computes a whole step in registers); what is stored is rounded to its storage format.
inline void reference_step(RefState& s, const sa_group_config& c, int64_t t,
                           const std::vector<double>& grad, double inv_grad_scale,
                           RefBug bug = RefBug::none, RefScales* scales = nullptr) {
  double beta1 = c.beta1;
  double beta2 = c.beta2;
  if (bug == RefBug::swapped_betas) std::swap(beta1, beta2);
  bool decoupled = c.decoupled_weight_decay != 0;
  if (bug == RefBug::decay_swapped) decoupled = !decoupled;
  const bool corrected = c.bias_correction != 0 && bug != RefBug::no_bias_correction;
  const double bc1 = corrected ? 1.0 - std::pow(beta1, static_cast<double>(t)) : 1.0;
  const double bc2 = corrected ? 1.0 - std::pow(beta2, static_cast<double>(t)) : 1.0;
  if (scales) {
    scales->step_size = c.lr / bc1;
    scales->m_terms.resize(s.value.size());
    scales->v_terms.resize(s.value.size());
  }
  for (std::size_t i = 0; i < s.value.size(); ++i) {
    double p = s.value[i];
    double g = grad[i] * inv_grad_scale;
    if (c.maximize) g = -g;
    if (c.weight_decay != 0.0 && !decoupled) g += c.weight_decay * p;
    if (c.weight_decay != 0.0 && decoupled) p *= 1.0 - c.lr * c.weight_decay;
    const bool carried = bug != RefBug::moments_not_carried;
    const double m_prev = carried ? s.m[i] : 0.0;
    const double v_prev = carried ? s.v[i] : 0.0;
    const double m = beta1 * m_prev + (1.0 - beta1) * g;
    const double v = beta2 * v_prev + (1.0 - beta2) * g * g;
    double v_used = v;
    double vmax = carried ? s.vmax[i] : 0.0;
    if (c.amsgrad) {
      vmax = std::max(vmax, v);
      v_used = vmax;
    }
    double denom = std::sqrt(v_used) / std::sqrt(bc2) + c.eps;
    if (bug == RefBug::eps_before_bias_correction)
      denom = (std::sqrt(v_used) + c.eps) / std::sqrt(bc2);
    if (bug == RefBug::eps_inside_sqrt) denom = std::sqrt(v_used / bc2 + c.eps);
    p -= (c.lr / bc1) * m / denom;
    if (scales) {
      // g itself is a sum when L2 decay adds to it: its rounding is relative to the terms.
      const double g_terms =
          std::fabs(grad[i] * inv_grad_scale) +
          (c.weight_decay != 0.0 && !decoupled ? std::fabs(c.weight_decay * s.value[i]) : 0.0);
      scales->m_terms[i] = std::fabs(beta1 * m_prev) + (1.0 - beta1) * g_terms;
      scales->v_terms[i] = std::fabs(beta2 * v_prev) + (1.0 - beta2) * g_terms * g_terms;
    }
    s.value[i] = round_to_f32(p);
    s.m[i] = round_to(s.moment_storage, m);
    s.v[i] = round_to(s.moment_storage, v);
    s.vmax[i] = round_to(s.moment_storage, vmax);
  }
}

// ---- tolerances -----------------------------------------------------------------------------
// The library computes a step in float32 with explicit FMAs; the reference in double. From
// the same state, one step differs by float32 rounding only:
//  - the full-precision value: 2 float32 ulps of the value, plus 1e-5 of the step size
//    lr / bc1 (the float32 error of m / denom, relative to the step, is ~1e-6);
//  - a moment: 6e-7 of the terms summed into it (2-3 float32 roundings of products, the
//    fma, and the coefficients), plus, for bfloat16 storage, one bfloat16 ulp (float32 and
//    double can round a near-tie to different neighbours).
// Over many free-running steps these add up, and bfloat16 moments, once rounded apart,
// make the trajectories drift: see free_running_allowance. (Measured on the tests' data:
// the worst free-running distance uses about half of the float32-moment allowance and a
// fifth of the bfloat16-moment one.)

inline double f32_ulp(double x) { return ulp_at(std::fabs(x), 24, -126); }
inline double bf16_ulp(double x) { return ulp_at(std::fabs(x), 8, -126); }

inline double step_value_tolerance(double value, double step_size) {
  return 2.0 * f32_ulp(value) + 1e-5 * step_size;
}

inline double step_moment_tolerance(double want, double terms, Storage storage) {
  const double arithmetic = 6e-7 * terms;
  if (storage == Storage::bf16) return arithmetic + bf16_ulp(std::fabs(want) + arithmetic);
  return arithmetic;
}

// What one free-running step may add to the distance between the library's value and the
// reference's, beyond 2 float32 ulps of the value: a fraction of the step size.
inline double free_running_allowance(double step_size, Storage moments) {
  return (moments == Storage::bf16 ? 4e-3 : 1e-4) * step_size;
}

// The worst |got - want| / tolerance over a comparison, and where it happened. A NaN
// counts as infinitely wrong.
class Worst {
 public:
  explicit Worst(std::string what) : what_(std::move(what)) {}
  void add(int64_t index, double got, double want, double tolerance) {
    const double diff = std::fabs(got - want);
    double ratio = diff == 0.0 ? 0.0 : diff / tolerance;
    if (std::isnan(ratio)) ratio = HUGE_VAL;
    ++count_;
    if (ratio > 1.0) ++failures_;
    if (ratio > ratio_ || index_ < 0) {
      ratio_ = ratio;
      index_ = index;
      got_ = got;
      want_ = want;
      tolerance_ = tolerance;
    }
  }
  double ratio() const { return ratio_; }
  int64_t failures() const { return failures_; }
  bool ok() const { return ratio_ <= 1.0; }
  std::string describe() const {
    std::ostringstream out;
    out.precision(9);
    out << what_ << ": worst element " << index_ << " got " << got_ << " want " << want_
        << " (|diff| = " << std::fabs(got_ - want_) << ", tolerance " << tolerance_ << ", ratio "
        << ratio_ << "); " << failures_ << " of " << count_ << " elements out of tolerance";
    return out.str();
  }

 private:
  std::string what_;
  double ratio_ = 0.0;
  int64_t index_ = -1;
  double got_ = 0.0, want_ = 0.0, tolerance_ = 0.0;
  int64_t count_ = 0;
  int64_t failures_ = 0;
};

#define CHECK_WITHIN(worst)   \
  do {                        \
    INFO((worst).describe()); \
    CHECK((worst).ok());      \
  } while (0)

}  // namespace sa_test

#endif  // SHARDADAM_TESTS_TEST_SUPPORT_HPP_
