"""
    Shardadam

Fused Adam/AdamW over the local shards of globally shaped params, through the C ABI of
libshardadam (`include/shardadam/shardadam.h`) and `ccall`.

The surface is the one the Go and Rust bindings test: an [`Optimizer`](@ref) with groups,
float32 params given as a flat vector plus a row-major (C order) local shape and an optional
layout, grads copied in by [`set_grad!`](@ref) or [`set_grads!`](@ref) and checked by the
library (a param may have no grad: [`clear_grad!`](@ref), `nothing` in `set_grads!`),
[`step!`](@ref), state copies, group and per-param step counts,
[`local_box`](@ref), shard files ([`save`](@ref), [`load!`](@ref)) and errors as
[`ShardadamError`](@ref).

The library is opened when the module loads: from `ENV["SHARDADAM_LIB"]` when set (a path
to libshardadam.so), else by name from the loader's search path (LD_LIBRARY_PATH).

Not tested: Julia cannot be installed on the machines this project is built on (see
README.md beside this package).
"""
module Shardadam

using Libdl

export Optimizer, ShardadamError, Param, Placement, Shard, Replicate, MeshLayout, BoxLayout,
    add_group!, add_param!, set_grad!, set_grads!, clear_grad!, step!, state, param_values,
    step_count, set_lr!, param_steps, set_param_steps!, local_box, build_info, save, load!

# ---- the library --------------------------------------------------------------------------

const _lib = Ref{Ptr{Cvoid}}(C_NULL)
const _shard_deleter = Ref{Ptr{Cvoid}}(C_NULL)

# The C function `name` of the loaded library.
_fn(name::Symbol) = Libdl.dlsym(_lib[], name)

# Frees the C block holding a param's DLManagedTensorVersioned and its shape (the block
# starts with the struct, so `self` is the block). The data is a Julia array, rooted by
# the optimizer until close().
_free_shard(self::Ptr{Cvoid}) = (Libc.free(self); nothing)

function __init__()
    _lib[] = Libdl.dlopen(get(ENV, "SHARDADAM_LIB", "libshardadam"))
    _shard_deleter[] = @cfunction(_free_shard, Cvoid, (Ptr{Cvoid},))
    return nothing
end

"""
    version() -> Int

The loaded library's version, MAJOR * 10000 + MINOR * 100 + PATCH.
"""
version() = Int(ccall(_fn(:sa_version), Cint, ()))

"""
    build_info() -> String

The loaded library's one-line description of its version and backends.
"""
build_info() = unsafe_string(ccall(_fn(:sa_build_info), Cstring, ()))

# ---- C structs (the layouts of shardadam.h and dlpack.h >= 1.0) -----------------------------

struct DLDataType
    code::UInt8
    bits::UInt8
    lanes::UInt16
end

struct DLDevice
    device_type::Int32
    device_id::Int32
end

struct DLTensor
    data::Ptr{Cvoid}
    device::DLDevice
    ndim::Int32
    dtype::DLDataType
    shape::Ptr{Int64}
    strides::Ptr{Int64}
    byte_offset::UInt64
end

struct DLPackVersion
    major::UInt32
    minor::UInt32
end

struct DLManagedTensorVersioned
    version::DLPackVersion
    manager_ctx::Ptr{Cvoid}
    deleter::Ptr{Cvoid}
    flags::UInt64
    dl_tensor::DLTensor
end

const KDL_CPU = Int32(1)
const FLOAT32 = DLDataType(2, 32, 1)   # kDLFloat, 32 bits, 1 lane
const NO_DTYPE = DLDataType(0, 0, 0)   # "the default" in sa_param_options

"""
    Placement(kind, dim)

How one mesh dim places a tensor (`sa_placement`): build it with [`Shard`](@ref) or
[`Replicate`](@ref). Its memory layout is C's `sa_placement`.
"""
struct Placement
    kind::Int32   # SA_PLACEMENT_REPLICATE 0, SA_PLACEMENT_SHARD 1, SA_PLACEMENT_PARTIAL 2
    dim::Int32
end

"""
    Shard(dim)

Tensor dim `dim` (0-based, C order; negative counts from the end) is split along the mesh
dim, with `torch.chunk` semantics.
"""
Shard(dim::Integer) = Placement(1, dim)

"""
    Replicate()

Every coordinate along the mesh dim holds the whole tensor.
"""
Replicate() = Placement(0, 0)

struct SaLayout
    struct_size::Csize_t
    ndim::Int32
    global_shape::Ptr{Int64}
    mesh_ndim::Int32
    mesh_shape::Ptr{Int64}
    mesh_coord::Ptr{Int64}
    placements::Ptr{Placement}
    global_offset::Ptr{Int64}
end

struct SaOptimizerConfig
    struct_size::Csize_t
    num_threads::Int32
    cpu_simd::Int32
end

struct SaParamOptions
    struct_size::Csize_t
    grad_dtype::DLDataType
    moment_dtype::DLDataType
    master::Int32
end

struct SaWriter
    struct_size::Csize_t
    ctx::Ptr{Cvoid}
    write::Ptr{Cvoid}
    commit::Ptr{Cvoid}
    release::Ptr{Cvoid}
    write_at::Ptr{Cvoid}
    reserve::Ptr{Cvoid}
end

struct SaReader
    struct_size::Csize_t
    ctx::Ptr{Cvoid}
    size::UInt64
    read_at::Ptr{Cvoid}
    release::Ptr{Cvoid}
    name::Ptr{Cchar}
    concurrent::Int32
end

struct SaImportOptions
    struct_size::Csize_t
    staging_bytes::UInt64
    allow_missing::Int32
    allow_unexpected::Int32
    restore_groups::Int32
    read_once::Int32
end

struct SaStepArgs
    struct_size::Csize_t
    inv_grad_scale::Ptr{Float32}
    found_inf::Ptr{Float32}
    skipped::Ptr{Int32}
    max_grad_norm::Float64
    norm_type::Int32
    grad_norm::Ptr{Float32}
    host_grad_norm::Ptr{Float64}
end

# ---- errors ---------------------------------------------------------------------------------

"""
    ShardadamError(status, message)

A failed call: the `sa_status` code (1 invalid argument ... 10 internal, as in
shardadam.h) and the library's message, which names the function and the param.
"""
struct ShardadamError <: Exception
    status::Int
    message::String
end

"""
    status_name(status) -> String

The library's name of a status code, e.g. "SA_ERR_MISMATCH".
"""
status_name(status::Integer) = unsafe_string(ccall(_fn(:sa_status_string), Cstring, (Cint,), status))

Base.showerror(io::IO, e::ShardadamError) =
    print(io, "ShardadamError(", status_name(e.status), "): ", e.message)

# A handle-less call's error: its thread-local message is read at once. No Julia code that
# could yield runs between the failed ccall and this read, so the task is still on the
# thread that made the call.
function _check_handleless(status::Cint)
    status == 0 && return nothing
    throw(ShardadamError(Int(status), unsafe_string(ccall(_fn(:sa_last_error), Cstring, ()))))
end

# ---- layouts --------------------------------------------------------------------------------

"""
A param's place in its global tensor: a [`MeshLayout`](@ref) or a [`BoxLayout`](@ref).
All shapes and offsets are in C (row-major) order.
"""
abstract type Layout end

"""
    MeshLayout(global_shape, mesh_shape, mesh_coord, placements)

The mesh form of `sa_layout`: the mesh sizes, this rank's 0-based coordinate and one
[`Placement`](@ref) per mesh dim.
"""
struct MeshLayout <: Layout
    global_shape::Vector{Int64}
    mesh_shape::Vector{Int64}
    mesh_coord::Vector{Int64}
    placements::Vector{Placement}
end

"""
    BoxLayout(global_shape, global_offset)

The box form of `sa_layout`: the shard is `[global_offset, global_offset + local shape)`.
"""
struct BoxLayout <: Layout
    global_shape::Vector{Int64}
    global_offset::Vector{Int64}
end

# Calls f with a pointer to an sa_layout borrowing the arrays of `layout` (NULL for nothing).
_with_layout(f, ::Nothing) = f(Ptr{SaLayout}(C_NULL))

function _with_layout(f, l::MeshLayout)
    length(l.mesh_coord) == length(l.mesh_shape) == length(l.placements) || throw(ShardadamError(1,
        "MeshLayout: mesh_shape, mesh_coord and placements need one entry per mesh dim"))
    GC.@preserve l begin
        raw = Ref(SaLayout(sizeof(SaLayout), length(l.global_shape), pointer(l.global_shape),
            length(l.mesh_shape), pointer(l.mesh_shape), pointer(l.mesh_coord),
            pointer(l.placements), Ptr{Int64}(C_NULL)))
        f(raw)
    end
end

function _with_layout(f, l::BoxLayout)
    length(l.global_offset) == length(l.global_shape) || throw(ShardadamError(1,
        "BoxLayout: global_offset needs one entry per global_shape dim"))
    GC.@preserve l begin
        raw = Ref(SaLayout(sizeof(SaLayout), length(l.global_shape), pointer(l.global_shape), 0,
            Ptr{Int64}(C_NULL), Ptr{Int64}(C_NULL), Ptr{Placement}(C_NULL),
            pointer(l.global_offset)))
        f(raw)
    end
end

"""
    local_box(layout::MeshLayout) -> (local_shape, global_offset)

This rank's box in the global tensor (`sa_layout_local_box`), in C order.
"""
function local_box(l::MeshLayout)
    n = length(l.global_shape)
    local_shape, offset = zeros(Int64, n), zeros(Int64, n)
    _with_layout(l) do raw
        _check_handleless(ccall(_fn(:sa_layout_local_box), Cint,
            (Ptr{SaLayout}, Ptr{Int64}, Ptr{Int64}), raw, local_shape, offset))
    end
    return local_shape, offset
end

# ---- optimizer ------------------------------------------------------------------------------

"""
    Param

A registered float32 param: its 0-based `index`, `name`, C-order local `shape`, its values
`data` (updated in place by every [`step!`](@ref); do not resize it) and its grad buffer.
"""
struct Param
    index::Int64
    name::String
    shape::Vector{Int64}
    data::Vector{Float32}
    grad::Vector{Float32}
end

"""
    Optimizer(; num_threads = 0, scalar_only = false)

An empty shardadam optimizer on the CPU backend. `num_threads` 0 uses one worker per
hardware thread. Release it with `close(opt)` (a finalizer does it too). One optimizer must
not be used by two tasks at once.
"""
mutable struct Optimizer
    handle::Ptr{Cvoid}
    params::Vector{Param}   # roots the Julia arrays the library points into

    function Optimizer(; num_threads::Integer = 0, scalar_only::Bool = false)
        config = Ref(SaOptimizerConfig(sizeof(SaOptimizerConfig), num_threads, scalar_only ? 0 : 1))
        out = Ref{Ptr{Cvoid}}(C_NULL)
        _check_handleless(ccall(_fn(:sa_optimizer_create), Cint,
            (Ptr{SaOptimizerConfig}, Ptr{Ptr{Cvoid}}), config, out))
        opt = new(out[], Param[])
        finalizer(close, opt)
        return opt
    end
end

function _handle(opt::Optimizer)
    opt.handle == C_NULL && throw(ShardadamError(9, "the optimizer is closed"))
    return opt.handle
end

# The error of a failed call on `opt`, its message read at once from the handle.
function _error(opt::Optimizer, status::Cint)
    message = unsafe_string(ccall(_fn(:sa_optimizer_last_error), Cstring, (Ptr{Cvoid},), opt.handle))
    return ShardadamError(Int(status), message)
end

_check(opt::Optimizer, status::Cint) = status == 0 ? nothing : throw(_error(opt, status))

"""
    close(opt::Optimizer)

Destroys the optimizer and its state and releases its params. Closing twice is a no-op.
"""
function Base.close(opt::Optimizer)
    if opt.handle != C_NULL
        ccall(_fn(:sa_optimizer_destroy), Cvoid, (Ptr{Cvoid},), opt.handle)
        opt.handle = C_NULL
        empty!(opt.params)
    end
    return nothing
end

"""
    add_group!(opt; hyperparameters...) -> Int

Appends a param group and returns its 0-based index. Keywords are the library's field
names (`lr`, `beta1`, `beta2`, `eps`, `weight_decay`, `decoupled_weight_decay`,
`bias_correction`, `maximize`, `amsgrad`: whatever `sa_group_config_field` lists), a flag
as a `Bool`; fields not given keep the library's defaults (`SA_GROUP_CONFIG_INIT`,
torch.optim.AdamW's). The library checks the names and values
(`sa_optimizer_add_group_fields`), so this module spells none of them.
"""
function add_group!(opt::Optimizer; hyperparameters...)
    names = [String(k) for k in keys(hyperparameters)]
    vals = Float64[Float64(v) for v in values(hyperparameters)]
    group = Ref{Int32}(-1)
    _check(opt, ccall(_fn(:sa_optimizer_add_group_fields), Cint,
        (Ptr{Cvoid}, Int32, Ptr{Cstring}, Ptr{Float64}, Ptr{Int32}),
        _handle(opt), length(names), names, vals, group))
    return Int(group[])
end

"""
    set_lr!(opt, group, lr)

Sets the learning rate of a group (0-based).
"""
function set_lr!(opt::Optimizer, group::Integer, lr::Real)
    _check(opt, ccall(_fn(:sa_optimizer_set_lr), Cint, (Ptr{Cvoid}, Int32, Float64),
        _handle(opt), group, lr))
    return nothing
end

"""
    step_count(opt, group) -> Int

The group's step count: the steps taken and not skipped.
"""
function step_count(opt::Optimizer, group::Integer)
    step = Ref{Int64}(0)
    _check(opt, ccall(_fn(:sa_optimizer_get_step), Cint, (Ptr{Cvoid}, Int32, Ptr{Int64}),
        _handle(opt), group, step))
    return Int(step[])
end

"""
    add_param!(opt, name, group, shape, values; layout = nothing) -> Param

Registers a float32 local shard named `name` in `group`. `shape` is its local shape in C
(row-major) order and `values` (copied) its `prod(shape)` elements in that order; for a
Julia matrix `A` that is `vec(permutedims(A))`. `layout` is a [`MeshLayout`](@ref), a
[`BoxLayout`](@ref) or `nothing` (not sharded).
"""
function add_param!(opt::Optimizer, name::AbstractString, group::Integer,
                    shape::AbstractVector{<:Integer}, values::AbstractVector{<:Real};
                    layout::Union{Nothing,Layout} = nothing)
    shape64 = Vector{Int64}(shape)
    numel = prod(shape64; init = 1)
    numel == length(values) || throw(ShardadamError(1,
        "add_param!: param '$name': $(length(values)) values, shape $shape64 needs $numel"))
    data = Vector{Float32}(values)
    handle = _handle(opt)

    # The DLPack struct and its shape live in one C block that the deleter frees.
    block = Libc.malloc(sizeof(DLManagedTensorVersioned) + 8 * max(length(shape64), 1))
    block == C_NULL && throw(OutOfMemoryError())
    shape_ptr = Ptr{Int64}(block + sizeof(DLManagedTensorVersioned))
    for (i, d) in enumerate(shape64)
        unsafe_store!(shape_ptr, d, i)
    end
    tensor = DLTensor(pointer(data), DLDevice(KDL_CPU, 0), length(shape64), FLOAT32, shape_ptr,
        Ptr{Int64}(C_NULL), 0)
    unsafe_store!(Ptr{DLManagedTensorVersioned}(block),
        DLManagedTensorVersioned(DLPackVersion(1, 0), block, _shard_deleter[], 0, tensor))

    options = Ref(SaParamOptions(sizeof(SaParamOptions), NO_DTYPE, NO_DTYPE, 0))
    index = Ref{Int64}(-1)
    status = GC.@preserve data _with_layout(layout) do raw
        ccall(_fn(:sa_optimizer_add_param), Cint,
            (Ptr{Cvoid}, Cstring, Int32, Ptr{Cvoid}, Ptr{SaLayout}, Ptr{SaParamOptions}, Ptr{Int64}),
            handle, name, group, block, raw, options, index)
    end
    if status != 0
        err = _error(opt, status)
        Libc.free(block)   # on failure the caller keeps ownership
        throw(err)
    end
    param = Param(index[], String(name), shape64, data, zeros(Float32, numel))
    push!(opt.params, param)
    return param
end

"""
    param_values(p::Param) -> Vector{Float32}

The param's values, updated in place by every [`step!`](@ref) (C order). Do not resize.
"""
param_values(p::Param) = p.data

"""
    set_grad!(opt, p, grad)

Copies `grad` (`prod(p.shape)` values, C order) into the param's grad buffer, which stays
bound for every later step until the next binding. The library checks dtype and shape
(`sa_optimizer_set_grad`); on error the bound grad is unchanged. This binding never hands
raw pointers to `sa_optimizer_set_grad_ptrs`, the C fast path that trusts its caller.
"""
function set_grad!(opt::Optimizer, p::Param, grad::AbstractVector{<:Real})
    length(grad) == length(p.grad) || throw(ShardadamError(1,
        "set_grad!: param '$(p.name)': $(length(grad)) values, local shape $(p.shape) needs $(length(p.grad))"))
    handle = _handle(opt)
    status = GC.@preserve p begin
        tensor = Ref(DLTensor(pointer(p.grad), DLDevice(KDL_CPU, 0), length(p.shape), FLOAT32,
            pointer(p.shape), Ptr{Int64}(C_NULL), 0))
        ccall(_fn(:sa_optimizer_set_grad), Cint, (Ptr{Cvoid}, Int64, Ptr{DLTensor}),
            handle, p.index, tensor)
    end
    _check(opt, status)
    copyto!(p.grad, grad)   # bound first (validated), copied after
    return nothing
end

"""
    set_grads!(opt, grads)

Binds the grads of every param in one call (`sa_optimizer_set_grads`): `grads[i]` for the
param of index `i - 1`, one entry per param; each is `prod(p.shape)` values (C order) or
`nothing`, which means "this param has no grad" (steps skip it, leaving its values, state
and step count, until a grad is bound again). Each grad is copied into its param's buffer
and checked by the library as in [`set_grad!`](@ref). All or nothing: on error no binding
and no buffer changes, and the message names the first param that failed.
"""
function set_grads!(opt::Optimizer, grads::AbstractVector)
    handle = _handle(opt)
    params = opt.params
    tensors = Vector{DLTensor}(undef, length(grads))
    present = falses(length(grads))
    # A list of the wrong length goes to the library with NULL entries: it refuses the
    # count before it reads any entry, and says what it expected.
    if length(grads) == length(params)
        for (i, (g, p)) in enumerate(zip(grads, params))
            g === nothing && continue
            length(g) == length(p.grad) || throw(ShardadamError(1,
                "set_grads!: param '$(p.name)': $(length(g)) values, local shape $(p.shape) needs $(length(p.grad))"))
            tensors[i] = DLTensor(pointer(p.grad), DLDevice(KDL_CPU, 0), length(p.shape), FLOAT32,
                pointer(p.shape), Ptr{Int64}(C_NULL), 0)
            present[i] = true
        end
    end
    status = GC.@preserve params tensors begin
        pointers = [present[i] ? pointer(tensors, i) : Ptr{DLTensor}(C_NULL) for i in eachindex(tensors)]
        ccall(_fn(:sa_optimizer_set_grads), Cint, (Ptr{Cvoid}, Int64, Ptr{Ptr{DLTensor}}),
            handle, length(pointers), pointers)
    end
    _check(opt, status)
    for (i, g) in enumerate(grads)   # bound first (validated), copied after
        present[i] && copyto!(params[i].grad, g)
    end
    return nothing
end

"""
    clear_grad!(opt, p)

Marks a param as having no grad (`sa_optimizer_clear_grad`): later steps skip it, leaving
its values, state and step count as they are, until a grad is bound again.
"""
function clear_grad!(opt::Optimizer, p::Param)
    _check(opt, ccall(_fn(:sa_optimizer_clear_grad), Cint, (Ptr{Cvoid}, Int64), _handle(opt), p.index))
    return nothing
end

"""
    param_steps(opt, first = 0, n = <the params from first on>) -> Vector{Int}

The step counts of the params of 0-based indices `first` to `first + n - 1`
(`sa_optimizer_get_param_steps`): the steps in which each had a grad and the step was not
skipped, the count its bias correction uses (torch's `state[p]["step"]`).
"""
function param_steps(opt::Optimizer, first::Integer = 0,
                     n::Integer = ccall(_fn(:sa_optimizer_num_params), Int64, (Ptr{Cvoid},), _handle(opt)) - first)
    steps = zeros(Int64, max(n, 1))   # never empty: a bad n reaches the library's range check
    _check(opt, ccall(_fn(:sa_optimizer_get_param_steps), Cint, (Ptr{Cvoid}, Int64, Int64, Ptr{Int64}),
        _handle(opt), first, n, steps))
    return Vector{Int}(steps[1:n])
end

"""
    set_param_steps!(opt, first, steps)

Replaces the step counts of the params of 0-based indices `first` to
`first + length(steps) - 1` (`sa_optimizer_set_param_steps`; all checked first, nothing
changes on error). Group step counts stay as they are.
"""
function set_param_steps!(opt::Optimizer, first::Integer, steps::AbstractVector{<:Integer})
    values = Vector{Int64}(steps)
    _check(opt, ccall(_fn(:sa_optimizer_set_param_steps), Cint, (Ptr{Cvoid}, Int64, Int64, Ptr{Int64}),
        _handle(opt), first, length(values), values))
    return nothing
end

"""
    step!(opt; inv_grad_scale = nothing, found_inf = false, max_grad_norm = 0.0,
          norm_type = :l2, norm = nothing) -> Bool

Runs one optimizer step over every param; returns whether it was skipped (`found_inf`, or
a non-finite gradient norm). `inv_grad_scale` multiplies every grad (the inverse loss
scale). `max_grad_norm > 0` clips the grads to that norm inside the update (`Inf`: only
measure it), as `clip_grad_norm_` would; `norm_type` is `:l2` or `:inf`; a `Ref{Float64}`
given as `norm` receives the norm. Params without a grad ([`clear_grad!`](@ref),
`nothing` in [`set_grads!`](@ref)) are skipped; every other non-empty param needs a grad
bound first. (Communicators are not bound in Julia: the norm is this
process's.)
"""
function step!(opt::Optimizer; inv_grad_scale::Union{Nothing,Real} = nothing, found_inf::Bool = false,
               max_grad_norm::Real = 0.0, norm_type::Symbol = :l2,
               norm::Union{Nothing,Base.RefValue{Float64}} = nothing)
    norm_type in (:l2, :inf) || throw(ArgumentError("norm_type must be :l2 or :inf, not :$norm_type"))
    handle = _handle(opt)
    scale = Ref{Float32}(inv_grad_scale === nothing ? 1 : inv_grad_scale)
    inf = Ref{Float32}(found_inf ? 1 : 0)
    skipped = Ref{Int32}(0)
    host_norm = norm === nothing ? Ref{Float64}(0) : norm
    status = GC.@preserve scale inf skipped host_norm begin
        args = Ref(SaStepArgs(sizeof(SaStepArgs),
            inv_grad_scale === nothing ? Ptr{Float32}(C_NULL) : Base.unsafe_convert(Ptr{Float32}, scale),
            Base.unsafe_convert(Ptr{Float32}, inf), Base.unsafe_convert(Ptr{Int32}, skipped),
            Float64(max_grad_norm), norm_type === :l2 ? Int32(0) : Int32(1), Ptr{Float32}(C_NULL),
            norm === nothing ? Ptr{Float64}(C_NULL) : Base.unsafe_convert(Ptr{Float64}, host_norm)))
        ccall(_fn(:sa_optimizer_step), Cint, (Ptr{Cvoid}, Ptr{SaStepArgs}, Ptr{Cvoid}),
            handle, args, C_NULL)
    end
    _check(opt, status)
    return skipped[] != 0
end

"""
    state(opt, p, key) -> Vector{Float32}

A copy of one float32 state of a param, in C order: "exp_avg", "exp_avg_sq" or
"max_exp_avg_sq" (amsgrad).
"""
function state(opt::Optimizer, p::Param, key::AbstractString)
    out = Ref{Ptr{DLManagedTensorVersioned}}(C_NULL)
    _check(opt, ccall(_fn(:sa_optimizer_state_view), Cint,
        (Ptr{Cvoid}, Int64, Cstring, Ptr{Ptr{DLManagedTensorVersioned}}),
        _handle(opt), p.index, key, out))
    view = unsafe_load(out[])
    try
        t = view.dl_tensor
        t.dtype == FLOAT32 || throw(ShardadamError(2,
            "state: '$key' of param '$(p.name)' is not float32; this binding copies float32 states only"))
        n = prod((unsafe_load(t.shape, i) for i in 1:t.ndim); init = Int64(1))
        return copy(unsafe_wrap(Array, Ptr{Float32}(t.data + t.byte_offset), Int(n)))
    finally
        ccall(view.deleter, Cvoid, (Ptr{DLManagedTensorVersioned},), out[])
    end
end

"""
    save(opt, path)

Writes this rank's state as one shard file (a safetensors file) at `path`
(`sa_optimizer_export` through `sa_file_writer`: temporary file, fsync, rename).
"""
function save(opt::Optimizer, path::AbstractString)
    handle = _handle(opt)
    writer = Ref(SaWriter(sizeof(SaWriter), C_NULL, C_NULL, C_NULL, C_NULL, C_NULL, C_NULL))
    _check_handleless(ccall(_fn(:sa_file_writer), Cint, (Cstring, Ptr{SaWriter}), path, writer))
    status = ccall(_fn(:sa_optimizer_export), Cint, (Ptr{Cvoid}, Ptr{SaWriter}), handle, writer)
    err = status == 0 ? nothing : _error(opt, status)   # read before the release
    ccall(_fn(:sa_writer_release), Cvoid, (Ptr{SaWriter},), writer)
    err === nothing || throw(err)
    return nothing
end

"""
    load!(opt, paths; allow_missing = false, allow_unexpected = false, restore_groups = true,
          read_once = false)

Loads the state saved in the shard files at `paths` (written by any number of ranks with
any layout) into this optimizer's state, resharding as needed (`sa_optimizer_import`).
Everything is validated before anything changes; with `read_once` the data are read once
even when they exceed the staging buffer, so a damaged block found while copying leaves the
optimizer unusable (until a load succeeds) instead of unchanged.
"""
function load!(opt::Optimizer, paths::AbstractVector{<:AbstractString}; allow_missing::Bool = false,
               allow_unexpected::Bool = false, restore_groups::Bool = true, read_once::Bool = false)
    handle = _handle(opt)
    readers = [Ref(SaReader(sizeof(SaReader), C_NULL, 0, C_NULL, C_NULL, C_NULL, 0)) for _ in paths]
    opened = 0
    try
        for (reader, path) in zip(readers, paths)
            _check_handleless(ccall(_fn(:sa_file_reader), Cint, (Cstring, Ptr{SaReader}), path, reader))
            opened += 1
        end
        options = Ref(SaImportOptions(sizeof(SaImportOptions), 0, allow_missing, allow_unexpected,
            restore_groups, read_once))
        status = GC.@preserve readers begin
            pointers = [Base.unsafe_convert(Ptr{SaReader}, r) for r in readers]
            ccall(_fn(:sa_optimizer_import), Cint,
                (Ptr{Cvoid}, Int32, Ptr{Ptr{SaReader}}, Ptr{SaImportOptions}),
                handle, length(pointers), pointers, options)
        end
        _check(opt, status)
    finally
        for reader in readers[1:opened]
            ccall(_fn(:sa_reader_release), Cvoid, (Ptr{SaReader},), reader)
        end
    end
    return nothing
end

end # module
