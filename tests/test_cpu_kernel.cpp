// tests/test_cpu_kernel.cpp — the CPU Adam kernel (kernels/cpu) and the conversions of
// kernels/adam_math.h it relies on:
//  - the SIMD path equals the scalar path bit for bit (a NaN's payload aside), for every
//    variant, on every SIMD target this CPU supports, and where a range is split does not
//    change any result;
//  - float_to_bf16 / float_to_half round like independent references;
//  - split_remainder / join_remainder restore every float exactly;
//  - one update agrees with the Adam formula evaluated in double.
#include <hwy/targets.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cfloat>
#include <cmath>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "../kernels/adam_math.h"
#include "../kernels/block_moment.h"
#include "../kernels/cpu/adam_cpu.h"
#include "highway_targets.hpp"

namespace {

using sa::kernels::absmax_scalar;
using sa::kernels::absmax_simd;
using sa::kernels::adam_cpu_range;
using sa::kernels::adam_cpu_simd_target;
using sa::kernels::AdamCoeffs;
using sa::kernels::AdamHyper;
using sa::kernels::bf16_to_float;
using sa::kernels::bits_float;
using sa::kernels::cast_fp8_run_scalar;
using sa::kernels::decode_f8e4m3;
using sa::kernels::decode_q8;
using sa::kernels::encode_block;
using sa::kernels::encode_f8e4m3;
using sa::kernels::encode_q8;
using sa::kernels::kQuant8Block;
using sa::kernels::quant8_book;
using sa::kernels::quant8_midpoint;
using sa::kernels::cast_fp8_run_simd;
using sa::kernels::e4m3fn_to_float;
using sa::kernels::e5m2_to_float;
using sa::kernels::ElemType;
using sa::kernels::float_bits;
using sa::kernels::float_to_bf16;
using sa::kernels::float_to_e4m3fn;
using sa::kernels::float_to_e5m2;
using sa::kernels::float_to_half;
using sa::kernels::fold_coefficients;
using sa::kernels::GroupCoeffs;
using sa::kernels::half_to_float;
using sa::kernels::join_remainder;
using sa::kernels::MasterKind;
using sa::kernels::ParamScaling;
using sa::kernels::split_remainder;
using sa::kernels::TensorSlot;
using sa::kernels::Variant;

using Rng = std::mt19937_64;
using sa_test::kernel_targets;
using sa_test::OnlyTarget;

// GCC's own float16 (software rounding in libgcc on x86-64 without AVX512-FP16: round to
// nearest even), the reference for float_to_half / half_to_float.
__extension__ typedef _Float16 RefHalf;

uint16_t ref_half_bits(float f) {
  const RefHalf h = static_cast<RefHalf>(f);
  uint16_t bits;
  memcpy(&bits, &h, sizeof bits);
  return bits;
}

float ref_half_value(uint16_t bits) {
  RefHalf h;
  memcpy(&h, &bits, sizeof h);
  return static_cast<float>(h);
}

bool is_nan_bits(uint32_t x) { return (x & 0x7FFFFFFFu) > 0x7F800000u; }
bool is_nan_bf16(uint16_t h) { return (h & 0x7FFFu) > 0x7F80u; }
bool is_nan_half(uint16_t h) { return (h & 0x7FFFu) > 0x7C00u; }

std::string hex(uint32_t x) {
  std::ostringstream s;
  s << "0x" << std::hex << x;
  return s.str();
}

// ---- awkward random data ----------------------------------------------------------------

uint32_t random_bits(Rng& rng) { return static_cast<uint32_t>(rng()); }

float random_sign(Rng& rng, float f) { return (rng() & 1) ? -f : f; }

// Ordinary values most of the time, and every kind of edge a kernel can meet: NaN with
// random payloads (quiet and signalling), infinities, zeros, huge values, tiny normals,
// subnormals, the float16 limits, and ties of bfloat16 and float16 rounding.
float awkward_float(Rng& rng) {
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int kind = static_cast<int>(rng() % 100);
  if (kind < 50)
    return normal(rng) * std::pow(10.0f, std::uniform_real_distribution<float>(-4, 2)(rng));
  if (kind < 56)
    return random_sign(rng, std::ldexp(1.0f + unit(rng), 90 + static_cast<int>(rng() % 38)));
  if (kind < 62)
    return random_sign(rng, std::ldexp(1.0f + unit(rng), -126 + static_cast<int>(rng() % 20)));
  if (kind < 68) return bits_float((random_bits(rng) & 0x807FFFFFu));  // subnormal or zero
  if (kind < 71) return random_sign(rng, 0.0f);
  if (kind < 74) return random_sign(rng, std::numeric_limits<float>::infinity());
  if (kind < 78) {  // NaN: any sign, any payload, quiet or signalling
    const uint32_t x = random_bits(rng) | 0x7F800000u;
    return bits_float((x & 0x7FFFFFu) != 0 ? x : x | 1u);
  }
  if (kind < 84) {
    const float edges[] = {65504.0f,       65520.0f,       65519.99f,      65535.0f,
                           6.1035156e-05f, 5.9604645e-08f, 2.9802322e-08f, 2.9802326e-08f,
                           FLT_MAX,        FLT_MIN,        1e-45f};
    return random_sign(rng, edges[rng() % (sizeof edges / sizeof edges[0])]);
  }
  if (kind < 92) {  // a float16 tie: halfway between two adjacent halves
    const uint16_t h = static_cast<uint16_t>(rng() % 0x7BFF);
    const double mid = (static_cast<double>(half_to_float(h)) + half_to_float(h + 1)) / 2;
    return random_sign(rng, static_cast<float>(mid));
  }
  // a bfloat16 tie, or one float ulp either side of it
  const uint32_t tie = (random_bits(rng) & 0xFFFF0000u) | 0x8000u;
  return bits_float(tie + static_cast<uint32_t>(rng() % 3) - 1u);
}

// ---- a shard in memory ------------------------------------------------------------------

size_t elem_size(ElemType t) { return t == ElemType::f32 ? 4 : 2; }

// One array in its storage dtype. The shard starts `offset` elements into the allocation,
// so offset 1 makes every pointer misaligned for vectors.
struct Array {
  std::vector<unsigned char> bytes;
  size_t width = 0;
  int offset = 0;

  Array() = default;
  Array(size_t width_, int64_t n, int offset_)
      : bytes(width_ * static_cast<size_t>(n + offset_ + 1)), width(width_), offset(offset_) {}
  void* data() { return bytes.empty() ? nullptr : bytes.data() + width * offset; }
  uint32_t get(int64_t i) const {
    uint32_t x = 0;
    memcpy(&x, bytes.data() + width * (offset + i), width);  // little endian
    return x;
  }
  void set(int64_t i, uint32_t x) { memcpy(bytes.data() + width * (offset + i), &x, width); }
};

// Random contents in a storage dtype: mostly awkward floats rounded to it, sometimes raw
// bit patterns (every 16-bit pattern, NaN encodings included, is a legal input).
uint32_t random_elem(Rng& rng, ElemType t) {
  const float f = awkward_float(rng);
  switch (t) {
    case ElemType::f32:
      return float_bits(f);
    case ElemType::bf16:
      return (rng() % 10 == 0) ? random_bits(rng) & 0xFFFFu : float_to_bf16(f);
    case ElemType::f16:
      return (rng() % 10 == 0) ? random_bits(rng) & 0xFFFFu : float_to_half(f);
    case ElemType::q8:      // block storages: tests/test_quant8.cpp makes their own states
    case ElemType::f8e4m3:  // and fp8 params tests/test_fp8_params.cpp
    case ElemType::f8e5m2:
    case ElemType::e8m0:
      return random_bits(rng) & 0xFFu;
  }
  return 0;
}

// A slot as the core builds one (src/plan.cpp): the states by kind, the master form's
// array under StateKind::master (fp32) or StateKind::remainder (int16).
TensorSlot make_slot(void* param, const void* grad, MasterKind master_kind, void* master,
                     void* exp_avg, void* exp_avg_sq, void* max_exp_avg_sq, int64_t numel) {
  TensorSlot slot{param, grad, {}, numel, 0, 1, {}};
  auto at = [&](sa::StateKind k) -> void*& { return slot.state[static_cast<size_t>(k)]; };
  at(sa::StateKind::exp_avg) = exp_avg;
  at(sa::StateKind::exp_avg_sq) = exp_avg_sq;
  at(sa::StateKind::max_exp_avg_sq) = max_exp_avg_sq;
  if (master_kind == MasterKind::fp32) at(sa::StateKind::master) = master;
  if (master_kind == MasterKind::remainder) at(sa::StateKind::remainder) = master;
  return slot;
}

struct Shard {
  Variant variant;
  int64_t numel;
  Array param, grad, master, exp_avg, exp_avg_sq, max_exp_avg_sq;

  Shard(const Variant& v, int64_t n, int offset, Rng& rng) : variant(v), numel(n) {
    param = Array(elem_size(v.param), n, offset);
    grad = Array(elem_size(v.grad), n, offset);
    if (v.master != MasterKind::none)
      master = Array(v.master == MasterKind::fp32 ? 4 : 2, n, offset);
    exp_avg = Array(elem_size(v.moment), n, offset);
    exp_avg_sq = Array(elem_size(v.moment), n, offset);
    if (v.amsgrad) max_exp_avg_sq = Array(elem_size(v.moment), n, offset);
    for (int64_t i = 0; i < n; ++i) {
      param.set(i, random_elem(rng, v.param));
      if (v.master == MasterKind::fp32) master.set(i, float_bits(awkward_float(rng)));
      if (v.master == MasterKind::remainder) master.set(i, random_bits(rng) & 0xFFFFu);
      exp_avg.set(i, random_elem(rng, v.moment));
      exp_avg_sq.set(i, random_elem(rng, v.moment));
      if (v.amsgrad) max_exp_avg_sq.set(i, random_elem(rng, v.moment));
    }
  }

  void new_grads(Rng& rng) {
    for (int64_t i = 0; i < numel; ++i) grad.set(i, random_elem(rng, variant.grad));
  }

  TensorSlot slot() {
    return make_slot(param.data(), grad.data(), variant.master, master.data(), exp_avg.data(),
                     exp_avg_sq.data(), max_exp_avg_sq.data(), numel);
  }
};

// Whether two stored elements are the same value: the same bits, or both NaN. IEEE 754
// leaves the payload of a NaN result open when several operands are NaN; x86 takes it from
// the operand in a given position, and the compiler picks the FMA form (132/213/231) per
// call site, so the paths may legitimately differ in a NaN's payload, never in anything
// else. (CUDA returns one canonical NaN whatever the inputs.) NaN elements also stay NaN
// in every later step, so nothing downstream depends on the payload.
enum class Encoding { f32, bf16, f16, exact };

Encoding encoding_of(ElemType t) {
  return t == ElemType::f32 ? Encoding::f32 : t == ElemType::bf16 ? Encoding::bf16 : Encoding::f16;
}

bool same_value(Encoding e, uint32_t a, uint32_t b) {
  if (a == b) return true;
  switch (e) {
    case Encoding::f32:
      return is_nan_bits(a) && is_nan_bits(b);
    case Encoding::bf16:
      return is_nan_bf16(static_cast<uint16_t>(a)) && is_nan_bf16(static_cast<uint16_t>(b));
    case Encoding::f16:
      return is_nan_half(static_cast<uint16_t>(a)) && is_nan_half(static_cast<uint16_t>(b));
    case Encoding::exact:
      return false;
  }
  return false;
}

// Where two shards that went through the same steps first differ, or "" if nowhere.
std::string first_difference(const Shard& a, const Shard& b) {
  const Variant& v = a.variant;
  const struct {
    const char* name;
    Encoding encoding;
    const Array& x;
    const Array& y;
  } arrays[] = {{"param", encoding_of(v.param), a.param, b.param},
                {"master", v.master == MasterKind::fp32 ? Encoding::f32 : Encoding::exact, a.master,
                 b.master},
                {"exp_avg", encoding_of(v.moment), a.exp_avg, b.exp_avg},
                {"exp_avg_sq", encoding_of(v.moment), a.exp_avg_sq, b.exp_avg_sq},
                {"max_exp_avg_sq", encoding_of(v.moment), a.max_exp_avg_sq, b.max_exp_avg_sq}};
  for (const auto& arr : arrays) {
    if (arr.x.bytes.empty()) continue;
    for (int64_t i = 0; i < a.numel; ++i) {
      if (!same_value(arr.encoding, arr.x.get(i), arr.y.get(i))) {
        return std::string(arr.name) + "[" + std::to_string(i) + "]: " + hex(arr.x.get(i)) +
               " vs " + hex(arr.y.get(i));
      }
    }
  }
  return "";
}

// ---- variants and coefficients ----------------------------------------------------------

// Every (Variant, l2) the core can produce.
struct Case {
  Variant variant;
  bool l2;
};

std::vector<Case> all_valid_cases() {
  const struct {
    ElemType param;
    MasterKind master;
  } storages[] = {{ElemType::f32, MasterKind::none},
                  {ElemType::bf16, MasterKind::fp32},
                  {ElemType::bf16, MasterKind::remainder},
                  {ElemType::f16, MasterKind::fp32}};
  std::vector<Case> cases;
  for (const auto& s : storages)
    for (ElemType grad : {ElemType::f32, ElemType::bf16, ElemType::f16})
      for (ElemType moment : {ElemType::f32, ElemType::bf16})
        for (bool amsgrad : {false, true})
          for (bool l2 : {false, true})
            cases.push_back({{s.param, grad, moment, s.master, amsgrad, ParamScaling::none}, l2});
  return cases;
}

const char* elem_name(ElemType t) {
  return t == ElemType::f32 ? "f32" : t == ElemType::bf16 ? "bf16" : "f16";
}

std::string describe(const Case& c) {
  const char* masters[] = {"none", "fp32", "remainder"};
  return std::string("param ") + elem_name(c.variant.param) + ", grad " +
         elem_name(c.variant.grad) + ", moment " + elem_name(c.variant.moment) + ", master " +
         masters[static_cast<int>(c.variant.master)] + ", amsgrad " +
         (c.variant.amsgrad ? "1" : "0") + ", l2 " + (c.l2 ? "1" : "0");
}

// The coefficients of step t for a group that uses L2 decay (Adam) or not (AdamW).
GroupCoeffs coeffs_for_step(bool l2, int64_t t, bool maximize) {
  AdamHyper h{};
  h.lr = 1e-3;
  h.beta1 = 0.9;
  h.beta2 = 0.999;
  h.eps = 1e-8;
  h.weight_decay = 0.01;
  h.decoupled_weight_decay = !l2;
  h.bias_correction = true;
  h.maximize = maximize;
  GroupCoeffs g{};
  g.l2 = fold_coefficients(h, t, 1.0f / 1024.0f, g.c);
  REQUIRE(g.l2 == l2);
  return g;
}

const int64_t kLengths[] = {0, 1, 7, 33, 1000, 4099};

}  // namespace

// ---- the kernel -------------------------------------------------------------------------

TEST_CASE("adam_cpu_simd_target names a target with a fused multiply-add when the CPU has one",
          "[cpu_kernel]") {
  const std::string name = adam_cpu_simd_target();
  WARN("CPU kernel SIMD target: " << name);
#if defined(__x86_64__)
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    CHECK(name != "scalar");
  }
#endif
  // A target without FMA must never be named: its MulAdd would round twice.
  CHECK(name != "SSSE3");
  CHECK(name != "SSE4");
  CHECK(name != "EMU128");
  CHECK(name != "SCALAR");
}

TEST_CASE(
    "SIMD and scalar paths agree bit for bit (NaN payloads aside) for every variant on "
    "every target",
    "[cpu_kernel]") {
  const std::vector<Case> cases = all_valid_cases();
  REQUIRE(cases.size() == 96);
  for (const int64_t target : kernel_targets()) {
    const OnlyTarget only(target);
    INFO("Highway target " << hwy::TargetName(target) << ", kernel uses "
                           << adam_cpu_simd_target());
    const std::string used = adam_cpu_simd_target();
    CHECK((used == "scalar" || used == hwy::TargetName(target)));
    Rng rng(1234);
    for (const Case& c : cases) {
      INFO(describe(c));
      for (const int64_t n : kLengths) {
        for (const int offset : {0, 1}) {
          INFO("numel " << n << ", offset " << offset);
          Shard scalar(c.variant, n, offset, rng);
          Shard simd = scalar;
          for (int64_t step = 1; step <= 3; ++step) {
            scalar.new_grads(rng);
            simd.grad = scalar.grad;
            const GroupCoeffs g = coeffs_for_step(c.l2, step, step == 2);
            adam_cpu_range(c.variant, scalar.slot(), g, 0, n, /*simd=*/false);
            adam_cpu_range(c.variant, simd.slot(), g, 0, n, /*simd=*/true);
            INFO("step " << step);
            REQUIRE(first_difference(scalar, simd) == "");
          }
        }
      }
    }
  }
}

TEST_CASE("Splitting a range into several calls gives the same state as one call", "[cpu_kernel]") {
  Rng rng(99);
  for (const Case& c : all_valid_cases()) {
    INFO(describe(c));
    for (const int64_t n : kLengths) {
      for (const bool simd : {true, false}) {
        INFO("numel " << n << ", simd " << simd);
        Shard whole(c.variant, n, 1, rng);
        Shard pieces = whole;
        for (int64_t step = 1; step <= 2; ++step) {
          whole.new_grads(rng);
          pieces.grad = whole.grad;
          const GroupCoeffs g = coeffs_for_step(c.l2, step, false);
          adam_cpu_range(c.variant, whole.slot(), g, 0, n, simd);
          // Arbitrary split points, empty pieces included.
          std::vector<int64_t> cuts = {0, n};
          for (int k = 0; k < 5; ++k)
            cuts.push_back(n == 0 ? 0 : static_cast<int64_t>(rng() % (n + 1)));
          std::sort(cuts.begin(), cuts.end());
          for (size_t k = 0; k + 1 < cuts.size(); ++k) {
            adam_cpu_range(c.variant, pieces.slot(), g, cuts[k], cuts[k + 1], simd);
          }
          REQUIRE(first_difference(whole, pieces) == "");
        }
      }
    }
  }
}

// With grad 0, moments 0, eps 1, decay 1 and a step size of -0, the update leaves every
// param value as it is (x*1 and -0*0 + x are exact), so the kernel's stores show its
// rounding of every input. The SIMD stores must round as adam_math.h's functions do.
TEST_CASE("SIMD stores of bf16, f16 and remainder params round exactly like adam_math.h",
          "[cpu_kernel]") {
  // Every sign/exponent/top-mantissa pattern, each with low bits at and around the
  // bfloat16 and float16 rounding points, plus random low bits.
  std::vector<uint32_t> inputs;
  const uint32_t lows[] = {0x0000, 0x0001, 0x0FFF, 0x1000, 0x1001, 0x2000, 0x3000, 0x7FFF,
                           0x8000, 0x8001, 0x9000, 0xA000, 0xB000, 0xE000, 0xF000, 0xFFFF};
  Rng rng(7);
  for (uint32_t high = 0; high < 0x10000u; ++high) {
    for (const uint32_t low : lows) inputs.push_back(high << 16 | low);
    inputs.push_back(high << 16 | (random_bits(rng) & 0xFFFFu));
  }
  const int64_t n = static_cast<int64_t>(inputs.size());

  AdamCoeffs<float> identity{};
  identity.grad_scale = 1.0f;
  identity.decay_factor = 1.0f;
  identity.eps = 1.0f;
  identity.inv_sqrt_bias_correction2 = 1.0f;
  identity.neg_step_size = -0.0f;
  const GroupCoeffs g{identity, false};

  for (const int64_t target : kernel_targets()) {
    const OnlyTarget only(target);
    INFO("Highway target " << hwy::TargetName(target) << ", kernel uses "
                           << adam_cpu_simd_target());
    for (const ElemType param_type : {ElemType::bf16, ElemType::f16}) {
      for (const MasterKind master : {MasterKind::fp32, MasterKind::remainder}) {
        if (param_type == ElemType::f16 && master == MasterKind::remainder) continue;
        const Variant v{param_type, ElemType::f32, ElemType::f32,
                        master,     false,         ParamScaling::none};
        std::vector<uint16_t> param(n), rem(n);  // rem holds int16 bits
        std::vector<float> master_f32(n), grad(n, 0.0f), m(n, 0.0f), vsq(n, 0.0f);
        for (int64_t i = 0; i < n; ++i) {
          if (master == MasterKind::fp32) {
            master_f32[i] = bits_float(inputs[i]);
          } else {
            int16_t r;
            split_remainder(bits_float(inputs[i]), param[i], r);
            rem[i] = static_cast<uint16_t>(r);
          }
        }
        const std::vector<uint16_t> param_in = param, rem_in = rem;
        void* master_ptr =
            master == MasterKind::fp32 ? static_cast<void*>(master_f32.data()) : rem.data();
        const TensorSlot slot = make_slot(param.data(), grad.data(), master, master_ptr, m.data(),
                                          vsq.data(), nullptr, n);
        adam_cpu_range(v, slot, g, 0, n, /*simd=*/true);
        for (int64_t i = 0; i < n; ++i) {
          if (master == MasterKind::fp32) {
            // A NaN leaves x*1 quiet; what is stored must be float_to_*(the stored master).
            if (!is_nan_bits(inputs[i])) REQUIRE(float_bits(master_f32[i]) == inputs[i]);
            const uint16_t expected = param_type == ElemType::bf16 ? float_to_bf16(master_f32[i])
                                                                   : float_to_half(master_f32[i]);
            if (param[i] != expected)
              FAIL("input " << hex(inputs[i]) << ": param " << hex(param[i]) << ", expected "
                            << hex(expected));
          } else {
            // The value is join(hi, rem) before and after; it must split as split_remainder does.
            uint16_t hi;
            int16_t r;
            split_remainder(join_remainder(param_in[i], static_cast<int16_t>(rem_in[i])), hi, r);
            if (param[i] != hi || static_cast<int16_t>(rem[i]) != r) {
              FAIL("input " << hex(inputs[i]) << ": hi:rem " << hex(param[i]) << ":" << hex(rem[i])
                            << ", expected " << hex(hi) << ":" << hex(static_cast<uint16_t>(r)));
            }
          }
        }
      }
    }
  }
}

// ---- conversions against independent references ------------------------------------------

TEST_CASE("half_to_float converts every float16 exactly and float_to_half round-trips it",
          "[conversions]") {
  for (uint32_t h = 0; h < 0x10000u; ++h) {
    const uint16_t bits = static_cast<uint16_t>(h);
    const float f = half_to_float(bits);
    const float ref = ref_half_value(bits);
    if (is_nan_half(bits)) {
      REQUIRE(std::isnan(f));
      REQUIRE(std::signbit(f) == std::signbit(ref));
      // float_to_half keeps a NaN a NaN, quiet, with its top payload bits.
      REQUIRE(float_to_half(f) == (bits | 0x0200u));
    } else {
      if (float_bits(f) != float_bits(ref)) FAIL("half " << hex(h) << ": " << f << " vs " << ref);
      if (float_to_half(f) != bits) FAIL("half " << hex(h) << " does not round-trip");
    }
  }
}

TEST_CASE("float_to_half rounds to nearest even like GCC's _Float16", "[conversions]") {
  std::vector<float> inputs = {
      0.0f,           -0.0f,          65504.0f,       65519.99f,
      65520.0f,       65536.0f,       FLT_MAX,        std::numeric_limits<float>::infinity(),
      6.1035156e-05f, 6.1035152e-05f, 5.9604645e-08f, 2.9802322e-08f,
      2.9802326e-08f, 1e-45f,         FLT_MIN,        1.0f,
      1.00048828125f, 1.000732421875f};
  // Every midpoint between adjacent halves (a tie), and one float ulp either side of it.
  for (uint32_t h = 0; h < 0x7C00u; ++h) {
    const float mid =
        static_cast<float>((static_cast<double>(half_to_float(static_cast<uint16_t>(h))) +
                            half_to_float(static_cast<uint16_t>(h + 1))) /
                           2);
    inputs.push_back(mid);
    inputs.push_back(std::nextafter(mid, 0.0f));
    inputs.push_back(std::nextafter(mid, INFINITY));
  }
  Rng rng(5);
  for (int i = 0; i < 1000000; ++i) inputs.push_back(bits_float(random_bits(rng)));
  for (int i = 0; i < 1000000; ++i) {  // concentrated on the float16 range and just below it
    const uint32_t exp = 100u + static_cast<uint32_t>(rng() % 45);  // 2^-27 .. 2^17
    inputs.push_back(bits_float((random_bits(rng) & 0x807FFFFFu) | exp << 23));
  }
  for (int i = 0; i < 100000; ++i)
    inputs.push_back(bits_float(random_bits(rng) & 0x807FFFFFu));  // subnormal floats
  const size_t count = inputs.size();
  for (size_t i = 0; i < count; ++i) inputs.push_back(-inputs[i]);

  for (const float f : inputs) {
    const uint16_t got = float_to_half(f);
    const uint16_t ref = ref_half_bits(f);
    if (std::isnan(f)) {
      REQUIRE(is_nan_half(got));
      REQUIRE((got & 0x8000u) == (ref & 0x8000u));
    } else if (got != ref) {
      FAIL("float " << hex(float_bits(f)) << " (" << f << "): " << hex(got) << ", GCC _Float16 "
                    << hex(ref));
    }
  }
}

namespace {

// float -> bfloat16 the long way: the two bfloat16 values around x (truncation, and the
// next one away from zero), compared in double; a tie goes to the even one.
uint16_t ref_bf16_bits(float x) {
  const uint32_t bits = float_bits(x);
  const uint16_t toward_zero = static_cast<uint16_t>(bits >> 16);
  if ((bits & 0xFFFFu) == 0) return toward_zero;
  const uint16_t away = static_cast<uint16_t>(toward_zero + 1);  // may be infinity
  const double below = std::fabs(static_cast<double>(bf16_to_float(toward_zero)));
  // Past the largest bfloat16, IEEE rounding treats infinity as the next value, 2^128.
  const double above = (away & 0x7FFFu) == 0x7F80u
                           ? std::ldexp(1.0, 128)
                           : std::fabs(static_cast<double>(bf16_to_float(away)));
  const double ax = std::fabs(static_cast<double>(x));
  if (ax - below < above - ax) return toward_zero;
  if (ax - below > above - ax) return away;
  return (toward_zero & 1u) ? away : toward_zero;
}

}  // namespace

TEST_CASE("float_to_bf16 rounds to nearest even like a reference computed in double",
          "[conversions]") {
  std::vector<float> inputs = {0.0f,
                               -0.0f,
                               FLT_MAX,
                               FLT_MIN,
                               1e-45f,
                               1.0f,
                               std::numeric_limits<float>::infinity(),
                               bits_float(0x7F7F7FFFu),
                               bits_float(0x7F7F8000u),
                               bits_float(0x7F7EFFFFu)};
  for (uint32_t h = 0; h < 0x7F80u; ++h) {  // every tie, and one float ulp either side
    inputs.push_back(bits_float(h << 16 | 0x8000u));
    inputs.push_back(bits_float(h << 16 | 0x7FFFu));
    inputs.push_back(bits_float(h << 16 | 0x8001u));
  }
  Rng rng(11);
  for (int i = 0; i < 2000000; ++i) inputs.push_back(bits_float(random_bits(rng)));
  for (int i = 0; i < 100000; ++i) inputs.push_back(bits_float(random_bits(rng) & 0x807FFFFFu));
  for (const float f : inputs) {
    const uint16_t got = float_to_bf16(f);
    if (std::isnan(f)) {
      REQUIRE(is_nan_bf16(got));
      REQUIRE((got & 0x0040u) != 0);  // quiet
      REQUIRE((got & 0x8000u) == ((float_bits(f) >> 16) & 0x8000u));
      continue;
    }
    const uint16_t ref = ref_bf16_bits(f);
    if (got != ref)
      FAIL("float " << hex(float_bits(f)) << ": " << hex(got) << ", reference " << hex(ref));
  }
}

TEST_CASE("split_remainder/join_remainder restore every float exactly and hi is a nearest bf16",
          "[conversions]") {
  std::vector<float> inputs = {0.0f,
                               -0.0f,
                               FLT_MAX,
                               -FLT_MAX,
                               FLT_MIN,
                               -FLT_MIN,
                               1e-45f,
                               -1e-45f,
                               std::numeric_limits<float>::infinity(),
                               -std::numeric_limits<float>::infinity(),
                               bits_float(0x7F7F8000u),
                               bits_float(0x7F7F7FFFu),
                               bits_float(0x3F808000u),
                               bits_float(0x3F818000u)};
  Rng rng(13);
  while (inputs.size() < 2000000) {
    const float f = bits_float(random_bits(rng));
    if (!std::isnan(f)) inputs.push_back(f);
  }
  for (uint32_t h = 0; h < 0x7F80u; ++h) inputs.push_back(bits_float(h << 16 | 0x8000u));  // ties
  for (const float x : inputs) {
    uint16_t hi;
    int16_t rem;
    split_remainder(x, hi, rem);
    if (float_bits(join_remainder(hi, rem)) != float_bits(x))
      FAIL("float " << hex(float_bits(x)) << " not restored");
    // hi is no farther from x than its neighbours in magnitude (infinity counting as
    // 2^128, where IEEE rounding puts it).
    auto distance = [&](uint16_t b) {
      const double value = (b & 0x7FFFu) == 0x7F80u
                               ? std::ldexp(1.0, 128)
                               : std::fabs(static_cast<double>(bf16_to_float(b)));
      return std::fabs(value - std::fabs(static_cast<double>(x)));
    };
    if ((hi & 0x7FFFu) == 0x7F80u && std::isinf(x)) continue;
    const double d = distance(hi);
    if ((hi & 0x7FFFu) != 0) REQUIRE(d <= distance(static_cast<uint16_t>(hi - 1)));
    if ((hi & 0x7FFFu) < 0x7F80u) REQUIRE(d <= distance(static_cast<uint16_t>(hi + 1)));
    REQUIRE((hi & 0x8000u) == ((float_bits(x) >> 16) & 0x8000u));
  }
  // A NaN stays a NaN in the param.
  for (const uint32_t nan : {0x7FC00000u, 0xFFC00001u, 0x7F800001u, 0xFF812345u}) {
    uint16_t hi;
    int16_t rem;
    split_remainder(bits_float(nan), hi, rem);
    CHECK(is_nan_bf16(hi));
    CHECK(rem == 0);
  }
}

// ---- the formula --------------------------------------------------------------------------

TEST_CASE("One fp32 step agrees with the Adam formula evaluated in double", "[cpu_kernel]") {
  const double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, wd = 0.01;
  const int64_t t = 3;
  for (const bool l2 : {false, true}) {
    for (const bool amsgrad : {false, true}) {
      for (const bool simd : {false, true}) {
        INFO("l2 " << l2 << ", amsgrad " << amsgrad << ", simd " << simd);
        AdamHyper h{lr, beta1, beta2, eps, wd, !l2, true, false};
        GroupCoeffs g{};
        g.l2 = fold_coefficients(h, t, 1.0f, g.c);
        const int64_t n = 37;
        Rng rng(21);
        std::normal_distribution<float> normal(0.0f, 1.0f);
        std::vector<float> p(n), grad(n), m(n), v(n), vmax(n);
        for (int64_t i = 0; i < n; ++i) {
          p[i] = normal(rng);
          grad[i] = normal(rng);
          m[i] = 0.1f * normal(rng);
          v[i] = 0.01f * std::fabs(normal(rng));
          vmax[i] = 0.01f * std::fabs(normal(rng));
        }
        const std::vector<float> p0 = p, m0 = m, v0 = v, vmax0 = vmax;
        const Variant variant{ElemType::f32,    ElemType::f32, ElemType::f32,
                              MasterKind::none, amsgrad,       ParamScaling::none};
        const TensorSlot slot = make_slot(p.data(), grad.data(), MasterKind::none, nullptr,
                                          m.data(), v.data(), vmax.data(), n);
        adam_cpu_range(variant, slot, g, 0, n, simd);
        for (int64_t i = 0; i < n; ++i) {
          double gd = grad[i];
          double pd = p0[i];
          if (l2)
            gd += wd * pd;
          else
            pd *= 1.0 - lr * wd;
          const double md = beta1 * m0[i] + (1 - beta1) * gd;
          const double vd = beta2 * v0[i] + (1 - beta2) * gd * gd;
          const double vused = amsgrad ? std::max(static_cast<double>(vmax0[i]), vd) : vd;
          const double m_hat = md / (1 - std::pow(beta1, t));
          const double v_hat = vused / (1 - std::pow(beta2, t));
          const double step = -lr * m_hat / (std::sqrt(v_hat) + eps);
          pd += step;
          CHECK(m[i] == Approx(md).epsilon(1e-6).margin(1e-7));
          CHECK(v[i] == Approx(vd).epsilon(1e-6));
          CHECK(p[i] == Approx(pd).epsilon(1e-6).margin(1e-7));
          // The step itself is small next to p; check it on its own scale too, up to the
          // rounding of p (two float ulps).
          const double p_ulp = std::nextafter(std::fabs(p0[i]), INFINITY) - std::fabs(p0[i]);
          CHECK(static_cast<double>(p[i]) - (l2 ? p0[i] : p0[i] * (1.0 - lr * wd)) ==
                Approx(step).epsilon(1e-3).margin(2 * p_ulp));
          if (amsgrad) CHECK(vmax[i] == Approx(vused).epsilon(1e-6));
        }
      }
    }
  }
}

// Every 251st float32 bit pattern (17M floats of every class: zeros, subnormals, normals,
// infinities, NaNs of both signs).
std::vector<float> every_251st_float() {
  std::vector<float> xs;
  for (uint64_t bits = 0; bits <= 0xFFFFFFFFull; bits += 251)
    xs.push_back(bits_float(static_cast<uint32_t>(bits)));
  return xs;
}

TEST_CASE("the SIMD fp8 cast gives the scalar cast's codes on every Highway target",
          "[cpu_kernel][fp8param]") {
  // Every 251st float bit pattern (17M floats of every class: zeros, subnormals, normals,
  // infinities, NaNs of both signs), and each fp8 code's value with its neighbours and the
  // midpoints to the next code, times factors that leave them as they are (1) or move them
  // across rounding boundaries and into saturation (0.75, 3).
  std::vector<float> xs = every_251st_float();
  for (const ElemType type : {ElemType::f8e4m3, ElemType::f8e5m2}) {
    for (int c = 0; c < 0x100; ++c) {
      const float v = type == ElemType::f8e4m3 ? e4m3fn_to_float(static_cast<uint8_t>(c))
                                               : e5m2_to_float(static_cast<uint8_t>(c));
      const float next = type == ElemType::f8e4m3 ? e4m3fn_to_float(static_cast<uint8_t>(c + 1))
                                                  : e5m2_to_float(static_cast<uint8_t>(c + 1));
      for (float x :
           {v, std::nextafter(v, 0.0f), std::nextafter(v, INFINITY), (v + next) / 2,
            std::nextafter((v + next) / 2, 0.0f), std::nextafter((v + next) / 2, INFINITY)})
        xs.push_back(x);
    }
  }
  const auto n = static_cast<int64_t>(xs.size());
  std::vector<uint8_t> want(xs.size()), got(xs.size());
  for (const int64_t target : kernel_targets()) {
    const OnlyTarget only(target);
    for (const ElemType type : {ElemType::f8e4m3, ElemType::f8e5m2}) {
      for (const float factor : {1.0f, 0.75f, 3.0f}) {
        INFO("Highway target " << hwy::TargetName(target) << ", "
                               << (type == ElemType::f8e4m3 ? "e4m3" : "e5m2") << ", factor "
                               << factor);
        cast_fp8_run_scalar(type, xs.data(), n, factor, want.data());
        // Offsets 0 and 3: aligned and not, and a tail shorter than a vector.
        for (const int64_t off : {int64_t{0}, int64_t{3}}) {
          std::fill(got.begin(), got.end(), uint8_t{0xAB});
          cast_fp8_run_simd(type, xs.data() + off, n - off, factor, got.data() + off);
          int64_t wrong = 0, first = -1;
          for (int64_t i = off; i < n; ++i)
            if (got[static_cast<std::size_t>(i)] != want[static_cast<std::size_t>(i)]) {
              if (first < 0) first = i;
              ++wrong;
            }
          INFO("offset " << off << ": first difference at x bits 0x" << std::hex
                         << (first < 0 ? 0u : float_bits(xs[static_cast<std::size_t>(first)])));
          CHECK(wrong == 0);
        }
        // The scalar loop is the element rule itself.
        // quant8_absmax (the amax of a block or a run) lane-wise: the same bits for windows
        // of every length class at many places (NaNs, infinities and subnormals among them).
        if (factor == 1.0f && type == ElemType::f8e4m3) {
          int64_t wrong = 0;
          for (int64_t at = 0; at + 5000 < n; at += 4999 * 37)
            for (const int64_t len : kLengths)
              if (float_bits(absmax_simd(xs.data() + at, len)) !=
                  float_bits(absmax_scalar(xs.data() + at, len)))
                ++wrong;
          CHECK(wrong == 0);
        }
        for (std::size_t i = 0; i < xs.size(); i += 9973)
          CHECK(want[i] == (type == ElemType::f8e4m3 ? float_to_e4m3fn(xs[i] * factor)
                                                     : float_to_e5m2(xs[i] * factor)));
      }
    }
  }
}

// Block-moment codecs by Highway's lanes against the scalar loops: `xs` encoded a block at a
// time both ways (encode(x, n, codes, simd) returns the absmax), each block's codes decoded
// both ways (decode(codes, absmax, n, x, simd)), and every code decoded at absmaxes of every
// kind (a NaN or an infinite block decodes to them). CHECKs that nothing differs but NaN
// payloads.
template <class Encode, class Decode>
void check_block_lanes(const std::vector<float>& xs, const Encode& encode, const Decode& decode,
                       float unit_absmax) {
  const int64_t block = kQuant8Block;
  const auto n = static_cast<int64_t>(xs.size());
  std::vector<uint8_t> want(xs.size()), got(xs.size());
  std::vector<float> want_x(block), got_x(block);
  auto same = [](float a, float b) {
    return float_bits(a) == float_bits(b) || (std::isnan(a) && std::isnan(b));
  };
  int64_t wrong_codes = 0, wrong_absmax = 0, wrong_values = 0;
  for (int64_t at = 0; at < n; at += block) {
    const int64_t len = std::min(block, n - at);
    const float a = encode(xs.data() + at, len, want.data() + at, false);
    const float b = encode(xs.data() + at, len, got.data() + at, true);
    wrong_absmax += float_bits(a) != float_bits(b);
    for (int64_t i = at; i < at + len; ++i) wrong_codes += want[i] != got[i];
    decode(want.data() + at, a, len, want_x.data(), false);
    decode(want.data() + at, a, len, got_x.data(), true);
    for (int64_t i = 0; i < len; ++i) wrong_values += !same(want_x[i], got_x[i]);
  }
  CHECK(wrong_codes == 0);
  CHECK(wrong_absmax == 0);
  CHECK(wrong_values == 0);
  std::vector<uint8_t> codes(256 + 7);  // every code, and a tail shorter than a vector
  for (std::size_t c = 0; c < codes.size(); ++c) codes[c] = static_cast<uint8_t>(c % 256);
  const auto count = static_cast<int64_t>(codes.size());
  for (const float absmax : {unit_absmax, 0.37f, 3e-5f, 1e-40f,
                             std::numeric_limits<float>::infinity(),
                             std::numeric_limits<float>::quiet_NaN()}) {
    std::vector<float> s(codes.size()), v(codes.size());
    decode(codes.data(), absmax, count, s.data(), false);
    decode(codes.data(), absmax, count, v.data(), true);
    int64_t wrong = 0;
    for (std::size_t i = 0; i < codes.size(); ++i) wrong += !same(s[i], v[i]);
    CHECK(wrong == 0);
  }
}

// 8-bit moments' blocks (block_moment.h's q8) by Highway's lanes: the scalar loops' codes,
// absmaxes and values on every target. Blocks of every 251st float bit pattern (every class:
// zeros, subnormals, normals, infinities, NaNs of both signs), and blocks whose absmax is 1
// holding each map value, its neighbours and each midpoint with its neighbours (where a code
// changes); decoding every code at absmaxes of every kind.
TEST_CASE("the SIMD q8 encode and decode give the scalar loops' bits on every Highway target",
          "[cpu_kernel][quant8]") {
  const int64_t block = kQuant8Block;
  std::vector<float> xs = every_251st_float();
  const std::size_t patterns = xs.size();
  for (const bool is_signed : {false, true}) {
    const uint32_t* map = quant8_book(is_signed).map;
    std::vector<float> near;
    for (int c = 0; c < 256; ++c) {
      const float v = bits_float(map[c]);
      for (float x : {v, std::nextafter(v, -2.0f), std::nextafter(v, 2.0f)}) near.push_back(x);
      if (c == 255) continue;
      const float mid = quant8_midpoint(map, c);
      for (float x : {mid, std::nextafter(mid, -2.0f), std::nextafter(mid, 2.0f)}) near.push_back(x);
    }
    for (std::size_t i = 0; i < near.size(); ++i) {
      if (i % (block - 1) == 0) xs.push_back(1.0f);  // each block's absmax: scaled == x
      xs.push_back(near[i]);
    }
  }
  xs.resize((xs.size() + block - 1) / block * block + 77, 0.5f);  // a partial last block
  for (const int64_t target : kernel_targets()) {
    const OnlyTarget only(target);
    for (const bool is_signed : {false, true}) {
      INFO("Highway target " << hwy::TargetName(target) << (is_signed ? ", signed" : ", unsigned"));
      check_block_lanes(
          xs,
          [&](const float* x, int64_t len, uint8_t* codes, bool simd) {
            return encode_q8(is_signed, x, len, codes, simd);
          },
          [&](const uint8_t* codes, float absmax, int64_t len, float* x, bool simd) {
            decode_q8(is_signed, codes, absmax, len, x, simd);
          },
          1.0f);
    }
  }
  // The scalar path is block_moment.h's rule itself.
  std::vector<uint8_t> direct(block);
  const float absmax = encode_block<ElemType::q8>(quant8_book(true), xs.data() + patterns,
                                                  block, direct.data());
  std::vector<uint8_t> ours(block);
  CHECK(float_bits(encode_q8(true, xs.data() + patterns, block, ours.data(), false)) ==
        float_bits(absmax));
  CHECK(ours == direct);
}

// Float8 moments' blocks (block_moment.h's f8e4m3) by Highway's lanes: the scalar loops' bits
// on every target, over blocks of every 251st float bit pattern and blocks whose scale is 1
// (absmax 448) holding each e4m3fn value, its neighbours and each midpoint with its
// neighbours; decoding every code at absmaxes of every kind.
TEST_CASE("the SIMD float8 moment encode and decode give the scalar loops' bits on every target",
          "[cpu_kernel][fp8]") {
  const int64_t block = kQuant8Block;
  std::vector<float> xs = every_251st_float();
  std::vector<float> near;
  for (int c = 0; c < 0x7E; ++c) {  // the positive finite codes; the sign is a flip
    const float v = sa::kernels::e4m3fn_to_float(static_cast<uint8_t>(c));
    const float mid = (v + sa::kernels::e4m3fn_to_float(static_cast<uint8_t>(c + 1))) / 2;
    for (float x : {v, std::nextafter(v, 0.0f), std::nextafter(v, 1e9f), mid, std::nextafter(mid, 0.0f),
                    std::nextafter(mid, 1e9f)}) {
      near.push_back(x);
      near.push_back(-x);
    }
  }
  for (std::size_t i = 0; i < near.size(); ++i) {
    if (i % (block - 1) == 0) xs.push_back(448.0f);  // each block's scale: 1
    xs.push_back(near[i]);
  }
  xs.resize((xs.size() + block - 1) / block * block + 77, 0.5f);  // a partial last block
  for (const int64_t target : kernel_targets()) {
    const OnlyTarget only(target);
    INFO("Highway target " << hwy::TargetName(target));
    check_block_lanes(xs, encode_f8e4m3, decode_f8e4m3, 448.0f);
  }
  // The scalar path is block_moment.h's rule itself.
  std::vector<uint8_t> direct(block), ours(block);
  const float* last = xs.data() + xs.size() - block;
  const float absmax = encode_block<ElemType::f8e4m3>({}, last, block, direct.data());
  CHECK(float_bits(encode_f8e4m3(last, block, ours.data(), false)) == float_bits(absmax));
  CHECK(ours == direct);
}
