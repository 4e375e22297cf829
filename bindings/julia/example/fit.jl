# Fits a [6, 4] weight (C order) to a target with AdamW, the weight sharded by rows over a
# mesh of 2 simulated ranks (one optimizer per rank, as each rank of a real job would have),
# and prints the loss as it falls. Then it shows what a failed call throws.
#
#   SHARDADAM_LIB=<build dir>/libshardadam.so julia --project=bindings/julia/Shardadam bindings/julia/example/fit.jl
using Shardadam

println(build_info())
global_shape = [6, 4]
target = Float32[((i * 7 % 11) - 5) / 3 for i in 0:23]   # C order, row-major

ranks = map(0:1) do r
    layout = MeshLayout(global_shape, [2], [r], [Shard(0)])
    local_shape, offset = local_box(layout)
    opt = Optimizer(num_threads = 1)
    add_group!(opt; lr = 0.1, weight_decay = 0.0)
    numel = prod(local_shape)
    w = add_param!(opt, "fit.w", 0, local_shape, zeros(Float32, numel); layout = layout)
    start = offset[1] * global_shape[2]   # rows [offset, offset + local) of the C-order target
    println("rank $r holds rows [$(offset[1]), $(offset[1] + local_shape[1]))")
    (opt = opt, w = w, target = target[start+1:start+numel])
end

first_loss = 0.0
loss = 0.0
for step in 1:60
    global loss = 0.0
    for rank in ranks
        grad = param_values(rank.w) .- rank.target    # loss = 1/2 |w - target|^2
        global loss += sum(abs2, grad) / 2
        set_grad!(rank.opt, rank.w, grad)
        step!(rank.opt)
    end
    step == 1 && (global first_loss = loss)
    (step == 1 || step % 20 == 0) && println("step $step  loss $(round(loss; digits = 5))")
end
loss < 0.01 * first_loss || error("the loss fell only from $first_loss to $loss")

# A failed call (a second param of the same name): the library's status and message.
try
    add_param!(ranks[1].opt, "fit.w", 0, [1], Float32[0])
catch e
    e isa ShardadamError || rethrow()
    println(sprint(showerror, e))
end
foreach(rank -> close(rank.opt), ranks)
