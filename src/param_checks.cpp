// src/param_checks.cpp — add_param's validation (see param_checks.hpp).
#include "param_checks.hpp"

#include <algorithm>
#include <cfloat>
#include <iterator>

#include "../kernels/variants.h"
#include "blas.hpp"
#include "dtype.hpp"
#include "errors.hpp"
#include "fields.hpp"
#include "options.hpp"

namespace sa {
namespace {

// "float32, bfloat16 or float16": the distinct dtypes of `types`, in table order.
template <class Range, class Get>
std::string dtype_list(const Range& rows, Get get) {
  std::vector<ElemType> types;
  std::vector<const char*> names;
  for (const auto& row : rows)
    if (std::find(types.begin(), types.end(), get(row)) == types.end()) {
      types.push_back(get(row));
      names.push_back(elem_name(get(row)));
    }
  return words_list(names);
}

const char* master_name(int32_t requested) {
  switch (requested) {
    case SA_MASTER_NONE:
      return "SA_MASTER_NONE";
    case SA_MASTER_FP32:
      return "SA_MASTER_FP32";
    case SA_MASTER_REMAINDER:
      return "SA_MASTER_REMAINDER";
  }
  return "SA_MASTER_AUTO";
}

static_assert(static_cast<int>(StatePlacement::device) == SA_STATE_ON_DEVICE &&
                  static_cast<int>(StatePlacement::host) == SA_STATE_ON_HOST &&
                  static_cast<int>(StatePlacement::host_cpu_step) == SA_STATE_ON_HOST_CPU_STEP,
              "StatePlacement mirrors sa_state_placement");

// The placement of a param's state on `device`: a CPU param's state is host memory whatever
// it asks for, so it resolves to device (one bucket for all of them).
// `requested` is an sa_state_placement (check_fields).
StatePlacement resolve_placement(int32_t requested, DLDevice device) {
  if (device.device_type == kDLCPU) return StatePlacement::device;
  return static_cast<StatePlacement>(requested);
}

// A param's form from kernels::kParamForms: AUTO picks the dtype's first row.
MasterKind resolve_master(int32_t requested, ElemType param_type, const std::string& context) {
  MasterKind kind{};
  switch (requested) {
    case SA_MASTER_AUTO:
      for (const kernels::ParamForm& form : kernels::kParamForms)
        if (form.param == param_type) return form.master;
      fail(SA_ERR_INTERNAL, context, ": no param form for ", elem_name(param_type));
    case SA_MASTER_NONE:
      kind = MasterKind::none;
      break;
    case SA_MASTER_FP32:
      kind = MasterKind::fp32;
      break;
    case SA_MASTER_REMAINDER:
      kind = MasterKind::remainder;
      break;
    default:  // check_fields lets no other value through
      fail(SA_ERR_INTERNAL, context, ": master is ", requested, ", not an sa_master_kind");
  }
  std::vector<kernels::ParamForm> with_kind;
  for (const kernels::ParamForm& form : kernels::kParamForms) {
    if (form.master != kind) continue;
    if (form.param == param_type) return kind;
    with_kind.push_back(form);
  }
  fail(SA_ERR_UNSUPPORTED, context, ": master ", master_name(requested), " needs a ",
       dtype_list(with_kind, [](const kernels::ParamForm& f) { return f.param; }), " param, not ",
       elem_name(param_type));
}

// An optional dtype option that check_fields let through: unset (all zero) is `fallback`,
// else a dtype of the library's with the field's role.
ElemType resolve_optional_dtype(DLDataType requested, ElemType fallback) {
  if (is_unset(requested)) return fallback;
  return *elem_type_of(requested);
}

// A param's scaling (an sa_param_scaling: check_fields): one of kernels::kParamForms' for
// its dtype and master (fp8 params name one; others take none).
kernels::ParamScaling resolve_scaling(int32_t requested, ElemType param_type, MasterKind master,
                                      const std::string& context) {
  const auto scaling = static_cast<kernels::ParamScaling>(requested);
  std::vector<std::string> fits;  // the scalings of this dtype's forms
  for (const kernels::ParamForm& form : kernels::kParamForms) {
    if (form.param != param_type || form.master != master) continue;
    if (form.scaling == scaling) return scaling;
    fits.push_back(scaling_c_name(form.scaling));
  }
  if (scaling == kernels::ParamScaling::none)
    fail(SA_ERR_INVALID_ARGUMENT, context, ": a ", elem_name(param_type),
         " param needs a scaling (sa_param_options.scaling): ", words_list(fits));
  std::vector<kernels::ParamForm> scaled;
  for (const kernels::ParamForm& form : kernels::kParamForms)
    if (form.scaling == scaling) scaled.push_back(form);
  fail(SA_ERR_INVALID_ARGUMENT, context, ": scaling ", scaling_c_name(scaling), " is for ",
       dtype_list(scaled, [](const kernels::ParamForm& f) { return f.param; }), " params, not ",
       elem_name(param_type));
}

// One of the scale tensors of sa_param_options: a DLPack 1.x tensor on the param's device,
// C-contiguous, of `dtype` and `shape`, writable when the step writes it.
void* checked_scale_tensor(const DLManagedTensorVersioned& t, const char* field, ElemType dtype,
                           const Dims& shape, bool written, DLDevice device,
                           const std::string& context) {
  const std::string what = concat(context, ": ", field);
  if (t.version.major != DLPACK_MAJOR_VERSION)
    fail(SA_ERR_UNSUPPORTED, what, " is a DLPack ", t.version.major, ".", t.version.minor,
         " tensor; this library reads DLPack ", DLPACK_MAJOR_VERSION, ".x");
  if (written && (t.flags & DLPACK_FLAG_BITMASK_READ_ONLY))
    fail(SA_ERR_INVALID_ARGUMENT, what,
         " is read-only (DLPACK_FLAG_BITMASK_READ_ONLY); the step writes it");
  const TensorRef ref = read_tensor(t.dl_tensor, what);
  if (!same_device(ref.device, device))
    fail(SA_ERR_MISMATCH, what, " is on ", device_name(ref.device), " but the param is on ",
         device_name(device));
  if (!same_dtype(ref.dtype, dl_dtype_of(dtype)))
    fail(SA_ERR_INVALID_ARGUMENT, what, " is ", dtype_name(ref.dtype), "; it must be ",
         elem_name(dtype));
  const bool one = shape.empty();  // a scalar: any shape of one element
  if (one ? ref.numel != 1 : ref.shape != shape)
    fail(SA_ERR_INVALID_ARGUMENT, what, " has shape ", format_dims(ref.shape), "; it must ",
         one ? std::string("hold one element") : concat("be ", format_dims(shape)));
  return ref.data;
}

// Checks the scale tensors of an fp8 param against its scaling and layout, and returns
// their data. Blocks run along the last dim: every rank's box must hold whole blocks.
kernels::ParamScale checked_scales(const sa_param_options& options, kernels::ParamScaling scaling,
                                   const Layout& layout, DLDevice device,
                                   const std::string& context) {
  kernels::ParamScale scale{};
  if (options.margin != 0 && !kernels::is_current(scaling))
    fail(SA_ERR_INVALID_ARGUMENT, context, ": options.margin is ", options.margin,
         ", but only SA_SCALING_CURRENT and SA_SCALING_CURRENT_POW2 take a margin",
         scaling == kernels::ParamScaling::delayed
             ? " (a delayed scaling casts with the engine's scale: apply the margin there)"
             : "");
  scale.margin = options.margin;
  if (scaling == kernels::ParamScaling::none) {
    if (options.scale != nullptr || options.amax != nullptr)
      fail(SA_ERR_INVALID_ARGUMENT, context, ": options.", options.scale ? "scale" : "amax",
           " is set but the param is not scaled (scaling SA_SCALING_NONE)");
    return scale;
  }
  const ScalingDescription d = describe_scaling(static_cast<int32_t>(scaling));
  const std::string name = scaling_c_name(scaling);
  if (options.scale == nullptr)
    fail(SA_ERR_INVALID_ARGUMENT, context, ": options.scale is NULL; ", name, " needs one");
  if (d.block == 0) {
    // delayed: one element the step reads; current: [scale, scale_inv], which it writes.
    scale.scale =
        checked_scale_tensor(*options.scale, "options.scale", d.scale_type,
                             d.step_writes ? Dims{2} : Dims{}, d.step_writes, device, context);
    if (options.amax != nullptr) {
      // The optimizer would own one tensor twice, and the step's amax would overwrite the
      // scale it reads.
      if (options.amax == options.scale)
        fail(SA_ERR_INVALID_ARGUMENT, context,
             ": options.scale and options.amax are the same tensor; pass two");
      scale.amax = static_cast<float*>(checked_scale_tensor(
          *options.amax, "options.amax", ElemType::f32, {}, true, device, context));
      if (static_cast<void*>(scale.amax) == scale.scale)
        fail(SA_ERR_INVALID_ARGUMENT, context,
             ": options.scale and options.amax share their element; the step writes the amax "
             "and reads the scale, so pass two tensors");
    }
    return scale;
  }
  if (options.amax != nullptr)
    fail(SA_ERR_INVALID_ARGUMENT, context, ": options.amax is set, but ", name,
         " writes block scales, not an amax; pass NULL");
  const std::size_t ndim = layout.global_shape.size();
  if (ndim == 0)
    fail(SA_ERR_INVALID_ARGUMENT, context, ": ", name, " scales blocks of ", d.block,
         " elements along the last dim, and a 0-d param has none");
  const std::size_t last = ndim - 1;
  if (layout.global_shape[last] % d.block != 0)
    fail(SA_ERR_INVALID_ARGUMENT, context, ": ", name, " scales blocks of ", d.block,
         " elements along the last dim, but dim ", last, " has ", layout.global_shape[last],
         " elements, not a multiple of ", d.block);
  const int64_t begin = layout.global_offset[last], extent = layout.local_shape[last];
  if (begin % d.block != 0 || extent % d.block != 0)
    fail(SA_ERR_INVALID_ARGUMENT, context, ": this rank holds elements [", begin, ", ",
         begin + extent, ") of dim ", last, ", which cuts a block of ", d.block, " (", name,
         " blocks run along the last dim); shard the last dim only at multiples of ", d.block,
         ", or shard another dim");
  Dims shape = layout.local_shape;
  shape[last] /= d.block;
  scale.scale = checked_scale_tensor(*options.scale, "options.scale", d.scale_type, shape, true,
                                     device, context);
  return scale;
}

// What a Muon group's param must be: a 2-D matrix of a Muon Variant (kernels/variants.h's
// Muon tables), its state on its own device, a communicator set when the layout splits it;
// and on the CPU a CBLAS must load (src/blas.hpp).
void check_muon_param(const Param& p, bool has_comm, const std::string& context) {
  const Dims& shape = p.layout.global_shape;
  if (shape.size() != 2)
    fail(SA_ERR_INVALID_ARGUMENT, context,
         ": the group's update_rule is SA_RULE_MUON, which orthogonalizes 2-D matrices, and "
         "this param has shape ",
         format_dims(shape),
         "; put it in an AdamW group (embeddings, norms, biases and heads "
         "are, in Muon's recipe)");
  const kernels::Variant v = variant_of(p);
  if (!kernels::variant_supported(v)) {
    const auto master_words = [](MasterKind m) {
      return m == MasterKind::fp32        ? " with a float32 master"
             : m == MasterKind::remainder ? " with a remainder master"
                                          : "";
    };
    std::vector<std::string> forms;
    for (const kernels::ParamForm& form : kernels::kMuonParamForms)
      forms.push_back(std::string(elem_name(form.param)) + master_words(form.master));
    const auto same = [](ElemType t) { return t; };
    fail(SA_ERR_UNSUPPORTED, context, ": Muon steps ", words_list(forms), " params, with ",
         dtype_list(kernels::kMuonGradTypes, same), " grads and a ",
         dtype_list(kernels::kMuonMomentTypes, same),
         " momentum_buffer (moment_dtype); this param is ", elem_name(v.param),
         master_words(v.master), ", with ", elem_name(v.grad), " grads and ", elem_name(v.moment),
         " moments");
  }
  if (p.placement != StatePlacement::device)
    fail(SA_ERR_UNSUPPORTED, context,
         ": a Muon param's state must be on its device (state_placement SA_STATE_ON_DEVICE)");
  if (is_sharded(p.layout) && !has_comm)
    fail(SA_ERR_INVALID_ARGUMENT, context, ": this layout splits the ", shape[0], " x ", shape[1],
         " matrix across ranks, and Muon steps it whole: its ranks gather their boxes' directions "
         "at every step, so set a communicator over them (sa_optimizer_set_comm) before adding "
         "the param");
  if (p.device.device_type != kDLCPU) return;
  try {
    cpu_sgemm();  // loads it now, so that a machine without one fails here, not at a step
  } catch (const Error& e) {
    fail(e.status(), context, ": ", e.what());
  }
}

}  // namespace

std::string param_context(const std::string& name) { return concat("param '", name, "'"); }

// "SA_SCALING_MXFP8": a scaling as the C ABI names it.
std::string scaling_c_name(kernels::ParamScaling scaling) {
  std::string name = describe_scaling(static_cast<int32_t>(scaling)).name;
  for (char& c : name) c = static_cast<char>(c >= 'a' && c <= 'z' ? c - 'a' + 'A' : c);
  return "SA_SCALING_" + name;
}

CheckedParam checked_param(const ParamRequest& request, const sa_group_config& group,
                           bool has_comm) {
  CheckedParam out{std::make_unique<Param>(), SA_PARAM_OPTIONS_INIT};
  Param& param = *out.param;
  param.name = request.name;
  const std::string context = param_context(param.name);
  if (request.versioned == nullptr && request.legacy == nullptr)
    fail(SA_ERR_INVALID_ARGUMENT, context, ": local_shard is NULL");
  if (request.versioned) {
    const DLPackVersion version = request.versioned->version;
    if (version.major != DLPACK_MAJOR_VERSION)
      fail(SA_ERR_UNSUPPORTED, context, ": the local shard is a DLPack ", version.major, ".",
           version.minor, " tensor; this library reads DLPack ", DLPACK_MAJOR_VERSION, ".x");
    if (request.versioned->flags & DLPACK_FLAG_BITMASK_READ_ONLY)
      fail(SA_ERR_INVALID_ARGUMENT, context,
           ": the local shard is read-only (DLPACK_FLAG_BITMASK_READ_ONLY); the step writes it");
  }
  const DLTensor& tensor =
      request.versioned ? request.versioned->dl_tensor : request.legacy->dl_tensor;
  const TensorRef shard = read_tensor(tensor, context + ": local shard");
  const auto param_type = elem_type_of(shard.dtype);
  const auto param_dtype = [](const kernels::ParamForm& f) { return f.param; };
  if (!param_type ||
      !std::any_of(std::begin(kernels::kParamForms), std::end(kernels::kParamForms),
                   [&](const kernels::ParamForm& f) { return f.param == *param_type; }))
    fail(SA_ERR_UNSUPPORTED, context, ": param dtype ", dtype_name(shard.dtype),
         " is not supported; use ", dtype_list(kernels::kParamForms, param_dtype));
  const sa_param_options defaults = SA_PARAM_OPTIONS_INIT;
  out.options = read_options(request.options, defaults, (context + ": options").c_str());
  const sa_param_options& options = out.options;
  check_fields(SA_STRUCT_PARAM_OPTIONS, &options, context, "options.");

  param.group = request.group;
  param.layout = resolve_layout(request.layout, shard.shape, context);
  param.numel = shard.numel;
  param.device = shard.device;
  param.data = shard.data;
  param.param_type = *param_type;
  // The default grad dtype is the param's, or float32 (the master's) for an fp8 param.
  const ElemType default_grad =
      kernels::in_table(kernels::kGradTypes, *param_type) ? *param_type : ElemType::f32;
  param.grad_type = resolve_optional_dtype(options.grad_dtype, default_grad);
  param.moment_type = resolve_optional_dtype(options.moment_dtype, kernels::kMomentTypes[0]);
  param.master = resolve_master(options.master, *param_type, context);
  param.scaling = resolve_scaling(options.scaling, *param_type, param.master, context);
  param.amsgrad = group.amsgrad != 0;
  param.placement = resolve_placement(options.state_placement, shard.device);
  param.scale = checked_scales(options, param.scaling, param.layout, shard.device, context);
  param.rule =
      group.update_rule == SA_RULE_MUON ? kernels::UpdateRule::muon : kernels::UpdateRule::adam;
  if (param.rule == kernels::UpdateRule::muon) check_muon_param(param, has_comm, context);
  if (kernels::is_current(param.scaling) && is_sharded(param.layout) && !has_comm)
    fail(SA_ERR_INVALID_ARGUMENT, context, ": ", scaling_c_name(param.scaling),
         " scales the whole tensor by its amax, and this layout splits the tensor across "
         "ranks, so the amax must be reduced across them: set a communicator "
         "(sa_optimizer_set_comm) before adding the param");
  return out;
}

void check_start_scale(Backend& backend, const Param& param, const std::string& context) {
  const bool current = kernels::is_current(param.scaling);
  if (param.scaling != kernels::ParamScaling::delayed && !current) return;
  // The scale the codes were cast with: delayed: the scale; current: [1], scale_inv.
  float s = 0.0f;  // on the param's device, perhaps just written on another stream
  backend.synchronize();
  backend.copy_to_host(&s, static_cast<const float*>(param.scale.scale) + (current ? 1 : 0),
                       sizeof s);
  if (!(s > 0.0f && s <= FLT_MAX))
    fail(SA_ERR_INVALID_ARGUMENT, context,
         current ? ": the scale_inv (scale[1]) is " : ": the scale is ", s,
         "; it must be > 0 and finite (the master starts as the fp8 value ",
         current ? "* scale_inv)" : "/ scale)");
}

}  // namespace sa
