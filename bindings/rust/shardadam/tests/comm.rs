//! Global gradient-norm clipping and the found-inf consensus across ranks, through a host
//! communicator: three ranks run as threads, each with its own optimizer over its shards
//! (uneven row splits, an empty shard, a param replicated on every rank), and all-reduce
//! through closures. The norm and the clipped steps are checked against a float64
//! reference on the full tensors.
mod common;

use common::{assert_close, Hyper, Reference, Rng};
use shardadam::{
    Comm, GroupConfig, Layout, NcclUniqueId, NormType, Optimizer, Param, ParamOptions, Placement,
    ReduceOp, Status, StepArgs, StepReport, RULE_MUON,
};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::thread;

const RANKS: usize = 3;

// ---- an all-reduce among threads ------------------------------------------------------------

/// Each rank deposits its values, then every rank combines all deposits in rank order (so
/// every rank gets the same bits); the second barrier keeps a fast rank from overwriting
/// its deposit before the others have read it.
struct ThreadGroup {
    deposits: Mutex<Vec<Vec<f64>>>,
    barrier: Barrier,
    calls: AtomicUsize,
    ops: Mutex<Vec<ReduceOp>>,
}

impl ThreadGroup {
    fn new() -> Arc<ThreadGroup> {
        Arc::new(ThreadGroup {
            deposits: Mutex::new(vec![Vec::new(); RANKS]),
            barrier: Barrier::new(RANKS),
            calls: AtomicUsize::new(0),
            ops: Mutex::new(Vec::new()),
        })
    }

    fn all_reduce(&self, rank: usize, values: &mut [f64], op: ReduceOp) {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.ops.lock().unwrap().push(op);
        self.deposits.lock().unwrap()[rank] = values.to_vec();
        self.barrier.wait();
        {
            let deposits = self.deposits.lock().unwrap();
            for (i, value) in values.iter_mut().enumerate() {
                *value = deposits[1..]
                    .iter()
                    .fold(deposits[0][i], |acc, d| match op {
                        ReduceOp::Sum => acc + d[i],
                        // NaN wins, as an all-reduce of a NaN partial must report it.
                        ReduceOp::Max if acc.is_nan() || d[i].is_nan() => f64::NAN,
                        ReduceOp::Max => acc.max(d[i]),
                    });
            }
        }
        self.barrier.wait();
    }

    /// Rank `rank`'s communicator.
    fn comm(self: &Arc<Self>, rank: usize) -> Comm {
        let group = Arc::clone(self);
        Comm::host(move |values: &mut [f64], op| {
            group.all_reduce(rank, values, op);
            Ok::<(), String>(())
        })
        .unwrap()
    }
}

// ---- the problem ------------------------------------------------------------------------------

/// A param of the global model and how the 3-rank mesh places it.
struct Spec {
    name: &'static str,
    global_shape: Vec<i64>,
    placement: Placement,
}

fn specs() -> Vec<Spec> {
    vec![
        // 7 rows over 3: 3, 3, 1.
        Spec {
            name: "w",
            global_shape: vec![7, 5],
            placement: Placement::Shard(0),
        },
        // 2 rows over 3: 1, 1, 0 (rank 2 holds an empty shard).
        Spec {
            name: "e",
            global_shape: vec![2, 3],
            placement: Placement::Shard(0),
        },
        // Every rank holds all of it: counted once (by coordinate 0) in the norm.
        Spec {
            name: "bias",
            global_shape: vec![4],
            placement: Placement::Replicate,
        },
    ]
}

fn layout(spec: &Spec, rank: usize) -> Layout {
    Layout::Mesh {
        global_shape: spec.global_shape.clone(),
        mesh_shape: vec![RANKS as i64],
        mesh_coord: vec![rank as i64],
        placements: vec![spec.placement],
    }
}

/// Adam is nearly blind to a grad scale that stays the same every step, so each step's
/// grads are scaled differently: clipping then changes the update for real.
const STEP_SCALES: [f32; 3] = [1.0, 8.0, 0.5];

/// The full tensors: initial values and the grads of each step, per param.
struct Problem {
    init: Vec<Vec<f32>>,
    grads: Vec<Vec<Vec<f32>>>, // [step][param]
}

fn problem() -> Problem {
    let mut rng = Rng(2024);
    let numel = |s: &Spec| s.global_shape.iter().product::<i64>() as usize;
    let init = specs().iter().map(|s| rng.values(numel(s))).collect();
    let grads = STEP_SCALES
        .iter()
        .map(|&scale| {
            specs()
                .iter()
                .map(|s| rng.values(numel(s)).iter().map(|g| g * scale).collect())
                .collect()
        })
        .collect();
    Problem { init, grads }
}

/// The box [offset, offset + local) of a row-major global tensor.
fn box_of(global: &[f32], global_shape: &[i64], local: &[i64], offset: &[i64]) -> Vec<f32> {
    let numel: i64 = local.iter().product();
    (0..numel)
        .map(|mut flat| {
            // Unravel the local index, shift it by the offset, ravel it globally.
            let mut at = 0i64;
            let mut stride = 1i64;
            for d in (0..local.len()).rev() {
                let i = flat % local[d];
                flat /= local[d];
                at += (i + offset[d]) * stride;
                stride *= global_shape[d];
            }
            global[at as usize]
        })
        .collect()
}

/// The L2 or inf norm of the full grads of one step, every element once, in float64.
fn reference_norm(grads: &[Vec<f32>], norm_type: NormType) -> f64 {
    let all = grads.iter().flatten().map(|&g| g as f64);
    match norm_type {
        NormType::L2 => all.map(|g| g * g).sum::<f64>().sqrt(),
        NormType::Inf => all.fold(0.0, |acc: f64, g| acc.max(g.abs())),
    }
}

/// torch.nn.utils.clip_grad_norm_'s coefficient.
fn clip_coefficient(norm: f64, max_norm: f64) -> f64 {
    (max_norm / (norm + 1e-6)).min(1.0)
}

/// Every rank's one group: AdamW at lr 1e-2.
fn hp() -> Hyper {
    Hyper {
        lr: 1e-2,
        ..Hyper::ADAMW
    }
}

/// One rank: its optimizer and, per param, its box in the global tensor.
struct Rank {
    rank: usize,
    opt: Optimizer,
    params: Vec<Param>,
    boxes: Vec<(Vec<i64>, Vec<i64>)>, // (local shape, global offset)
}

impl Rank {
    fn new(rank: usize, comm: &Comm, problem: &Problem) -> Rank {
        let mut opt = Optimizer::new(Some(&shardadam::Config {
            num_threads: 1,
            ..shardadam::Config::default()
        }))
        .unwrap();
        opt.add_group(&hp().config()).unwrap();
        let (mut params, mut boxes) = (Vec::new(), Vec::new());
        for (spec, init) in specs().iter().zip(&problem.init) {
            let layout = layout(spec, rank);
            let (local, offset) = layout.local_box().unwrap();
            let data = box_of(init, &spec.global_shape, &local, &offset);
            let options = ParamOptions {
                layout: Some(layout),
                ..ParamOptions::default()
            };
            params.push(
                opt.add_param(spec.name, 0, &local, data, Some(&options))
                    .unwrap(),
            );
            boxes.push((local, offset));
        }
        opt.set_comm(comm).unwrap();
        Rank {
            rank,
            opt,
            params,
            boxes,
        }
    }

    /// Binds this rank's boxes of the step's global grads; `poison` sets one element of
    /// one param first: (param, element, value).
    fn load_grads(&mut self, grads: &[Vec<f32>], poison: Option<(usize, usize, f32)>) {
        for (k, spec) in specs().iter().enumerate() {
            let (local, offset) = &self.boxes[k];
            let mut grad = box_of(&grads[k], &spec.global_shape, local, offset);
            if let Some((param, element, value)) = poison {
                if param == k {
                    grad[element] = value;
                }
            }
            self.opt.set_grad(self.params[k], &grad).unwrap();
        }
    }

    fn params(&self) -> Vec<Vec<f32>> {
        self.params
            .iter()
            .map(|&p| self.opt.param_f32(p).unwrap().to_vec())
            .collect()
    }
}

/// The ranks of one job with their communicators (dropped at once: each optimizer keeps
/// its own alive).
fn world(problem: &Problem) -> (Arc<ThreadGroup>, Vec<Rank>) {
    let group = ThreadGroup::new();
    let ranks = (0..RANKS)
        .map(|r| Rank::new(r, &group.comm(r), problem))
        .collect();
    (group, ranks)
}

/// Runs `f` on every rank at once, each on its own thread (the all-reduce needs them all),
/// and returns the ranks with what `f` returned.
fn on_all_ranks<T: Send + 'static>(
    ranks: Vec<Rank>,
    f: impl Fn(&mut Rank) -> T + Send + Sync + Clone + 'static,
) -> (Vec<Rank>, Vec<T>) {
    let handles: Vec<_> = ranks
        .into_iter()
        .map(|mut rank| {
            let f = f.clone();
            thread::spawn(move || {
                let out = f(&mut rank);
                (rank, out)
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).unzip()
}

fn clipped(bound: f64, norm_type: NormType) -> StepArgs {
    StepArgs {
        max_grad_norm: Some(bound),
        norm_type,
        ..StepArgs::default()
    }
}

/// The full tensors of every rank's params, checked to agree where ranks overlap (the
/// replicated param), against a reference's values.
fn assert_ranks_match(what: &str, ranks: &[Rank], refs: &[Reference]) {
    for rank in ranks {
        for (k, spec) in specs().iter().enumerate() {
            let (local, offset) = &rank.boxes[k];
            let want_f32: Vec<f32> = refs[k].p.iter().map(|&x| x as f32).collect();
            let want: Vec<f64> = box_of(&want_f32, &spec.global_shape, local, offset)
                .iter()
                .map(|&x| x as f64)
                .collect();
            let got = rank.opt.param_f32(rank.params[k]).unwrap();
            // The f32 rounding of the reference adds at most half an ulp: within the tolerance.
            assert_close(
                &format!("{}: rank {} param '{}'", what, rank.rank, spec.name),
                got,
                &want,
            );
        }
    }
}

// ---- tests -------------------------------------------------------------------------------------

#[test]
fn the_problem_clips_its_norms_are_well_above_the_bounds() {
    // Otherwise the clipping tests would pass with clipping switched off.
    let problem = problem();
    for grads in &problem.grads {
        assert!(reference_norm(grads, NormType::L2) > 1.5);
        assert!(reference_norm(grads, NormType::Inf) > 0.4);
    }
}

#[test]
fn three_ranks_agree_on_the_global_l2_norm_and_clip_like_a_float64_reference() {
    let problem = Arc::new(problem());
    let (group, ranks) = world(&problem);
    let bound = 1.0;
    let mut clipped_ref: Vec<Reference> = problem.init.iter().map(|p| Reference::new(p)).collect();
    let mut unclipped_ref: Vec<Reference> =
        problem.init.iter().map(|p| Reference::new(p)).collect();
    let mut ranks = ranks;
    for (s, grads) in problem.grads.iter().enumerate() {
        let step_problem = Arc::clone(&problem);
        let (back, reports) = on_all_ranks(ranks, move |rank| {
            rank.load_grads(&step_problem.grads[s], None);
            rank.opt.step_with(&clipped(bound, NormType::L2)).unwrap()
        });
        ranks = back;
        let want = reference_norm(grads, NormType::L2);
        for (r, report) in reports.iter().enumerate() {
            assert!(!report.skipped, "step {} rank {} skipped", s, r);
            let norm = report.grad_norm.expect("a norm was asked for");
            // Each element once: counting the 3 copies of 'bias' would be off by far more.
            assert!(
                (norm - want).abs() <= 1e-12 * want,
                "step {} rank {}: norm {} want {}",
                s,
                r,
                norm,
                want
            );
            assert_eq!(norm.to_bits(), reports[0].grad_norm.unwrap().to_bits());
        }
        let t = s as i32 + 1;
        let coefficient = clip_coefficient(want, bound);
        assert!(coefficient < 0.7, "step {} does not clip", s);
        for (k, reference) in clipped_ref.iter_mut().enumerate() {
            reference.step(&grads[k], &hp(), t, coefficient);
            unclipped_ref[k].step(&grads[k], &hp(), t, 1.0);
        }
    }
    assert_eq!(
        group.calls.load(Ordering::SeqCst),
        RANKS * STEP_SCALES.len()
    );
    assert!(group
        .ops
        .lock()
        .unwrap()
        .iter()
        .all(|&op| op == ReduceOp::Sum));
    for rank in &ranks {
        assert_eq!(rank.opt.step_count(0).unwrap(), STEP_SCALES.len() as i64);
    }
    assert_ranks_match("clipped", &ranks, &clipped_ref);

    // Clipping changed the result: the unclipped reference is far outside the tolerance.
    let got = ranks[0].params();
    let farthest = unclipped_ref
        .iter()
        .zip(&got)
        .flat_map(|(r, g)| r.p.iter().zip(g).map(|(&w, &g)| (w - g as f64).abs()))
        .fold(0.0f64, f64::max);
    assert!(
        farthest > 1e-3,
        "the clipped run ends within {} of the unclipped reference",
        farthest
    );
}

#[test]
fn the_inf_norm_reduces_with_max_and_clips_like_the_reference() {
    let problem = Arc::new(problem());
    let (group, mut ranks) = world(&problem);
    let bound = 0.25;
    let mut refs: Vec<Reference> = problem.init.iter().map(|p| Reference::new(p)).collect();
    for (s, grads) in problem.grads.iter().enumerate() {
        let step_problem = Arc::clone(&problem);
        let (back, reports) = on_all_ranks(ranks, move |rank| {
            rank.load_grads(&step_problem.grads[s], None);
            rank.opt.step_with(&clipped(bound, NormType::Inf)).unwrap()
        });
        ranks = back;
        let want = reference_norm(grads, NormType::Inf);
        for report in &reports {
            assert_eq!(report.grad_norm, Some(want), "a max is exact");
        }
        for (k, reference) in refs.iter_mut().enumerate() {
            reference.step(
                &grads[k],
                &hp(),
                s as i32 + 1,
                clip_coefficient(want, bound),
            );
        }
    }
    assert!(group
        .ops
        .lock()
        .unwrap()
        .iter()
        .all(|&op| op == ReduceOp::Max));
    assert_ranks_match("inf-clipped", &ranks, &refs);
}

#[test]
fn a_nan_grad_or_found_inf_on_one_rank_skips_the_step_on_all_ranks() {
    let problem = Arc::new(problem());
    let (group, ranks) = world(&problem);
    let step_problem = Arc::clone(&problem);
    let (ranks, _) = on_all_ranks(ranks, move |rank| {
        rank.load_grads(&step_problem.grads[0], None);
        rank.opt.step_with(&clipped(1.0, NormType::L2)).unwrap()
    });
    let before: Vec<_> = ranks.iter().map(|r| r.params()).collect();

    // A NaN in rank 1's shard of 'w'.
    let step_problem = Arc::clone(&problem);
    let (ranks, reports) = on_all_ranks(ranks, move |rank| {
        let poison = if rank.rank == 1 {
            Some((0, 4, f32::NAN))
        } else {
            None
        };
        rank.load_grads(&step_problem.grads[1], poison);
        rank.opt.step_with(&clipped(1.0, NormType::L2)).unwrap()
    });
    for (r, report) in reports.iter().enumerate() {
        assert!(report.skipped, "rank {} did not skip", r);
        assert!(
            report.grad_norm.unwrap().is_nan(),
            "rank {}: {:?}",
            r,
            report
        );
    }

    // found_inf on rank 2 alone, no norm: a found-inf consensus only.
    let (ranks, reports) = on_all_ranks(ranks, |rank| {
        rank.opt
            .step_with(&StepArgs {
                found_inf: Some(rank.rank == 2),
                ..StepArgs::default()
            })
            .unwrap()
    });
    for report in &reports {
        assert_eq!(
            *report,
            StepReport {
                skipped: true,
                grad_norm: None
            }
        );
    }

    let after: Vec<_> = ranks.iter().map(|r| r.params()).collect();
    assert_eq!(after, before, "a skipped step changed a param");
    for rank in &ranks {
        assert_eq!(rank.opt.step_count(0).unwrap(), 1);
    }
    assert_eq!(group.calls.load(Ordering::SeqCst), 3 * RANKS);
}

/// One float32 param of 8 elements with a grad bound, and a communicator.
fn one_param(comm: &Comm) -> (Optimizer, Param) {
    let mut opt = Optimizer::new(None).unwrap();
    opt.add_group(&hp().config()).unwrap();
    let p = opt
        .add_param("p", 0, &[8], (0..8).map(|i| i as f32 * 0.5).collect(), None)
        .unwrap();
    opt.set_grad(p, &[3.0; 8]).unwrap();
    opt.set_comm(comm).unwrap();
    (opt, p)
}

#[test]
fn a_failing_callback_fails_the_step_with_status_comm_and_changes_nothing() {
    let calls = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&calls);
    let comm = Comm::host(move |_: &mut [f64], _| {
        counter.fetch_add(1, Ordering::SeqCst);
        Err("the transport is down")
    })
    .unwrap();
    let (mut opt, p) = one_param(&comm);
    let before = opt.param_f32(p).unwrap().to_vec();
    let e = opt.step_with(&clipped(1.0, NormType::L2)).unwrap_err();
    assert_eq!(e.status, Status::Comm, "{}", e);
    assert!(e.message.contains("all_reduce"), "{}", e.message);
    assert!(e.message.contains("the transport is down"), "{}", e.message);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert_eq!(opt.param_f32(p).unwrap(), &before[..]);
    assert_eq!(opt.step_count(0).unwrap(), 0);

    // A step with neither a norm nor a found-inf flag does not communicate.
    opt.step().unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert_eq!(opt.step_count(0).unwrap(), 1);
}

#[test]
fn a_panicking_callback_fails_the_step_instead_of_unwinding_into_c() {
    let comm =
        Comm::host(|_: &mut [f64], _| -> Result<(), String> { panic!("the closure gave up") })
            .unwrap();
    let (mut opt, p) = one_param(&comm);
    let before = opt.param_f32(p).unwrap().to_vec();
    for _ in 0..2 {
        // Twice: the first panic left the communicator usable.
        let e = opt.step_with(&clipped(1.0, NormType::L2)).unwrap_err();
        assert_eq!(e.status, Status::Comm, "{}", e);
        assert!(e.message.contains("panicked"), "{}", e.message);
        assert!(e.message.contains("the closure gave up"), "{}", e.message);
    }
    assert_eq!(opt.param_f32(p).unwrap(), &before[..]);
    assert_eq!(opt.step_count(0).unwrap(), 0);
}

/// Counts its drops: what a closure captures is dropped when the library releases it.
struct DropCounter(Arc<AtomicUsize>);

impl Drop for DropCounter {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

#[test]
fn the_optimizer_keeps_the_closure_alive_until_it_lets_go_of_the_communicator() {
    let drops = Arc::new(AtomicUsize::new(0));
    let guard = DropCounter(Arc::clone(&drops));
    let comm = Comm::host(move |values: &mut [f64], op| {
        let _ = &guard;
        // A single rank: the reduction over all ranks is the values themselves.
        assert_eq!((values.len(), op), (2, ReduceOp::Sum));
        Ok::<(), String>(())
    })
    .unwrap();
    assert_eq!(comm.rank_and_size().unwrap(), None, "a host communicator");
    let (mut opt, _) = one_param(&comm);
    drop(comm);
    assert_eq!(drops.load(Ordering::SeqCst), 0, "the optimizer holds it");
    let report = opt
        .step_with(&clipped(f64::INFINITY, NormType::L2))
        .unwrap();
    // Measured, not clipped: 8 grads of 3.
    assert_eq!(report.grad_norm, Some(72f64.sqrt()));
    opt.clear_comm().unwrap();
    assert_eq!(drops.load(Ordering::SeqCst), 1, "released once");
    drop(opt);
    assert_eq!(drops.load(Ordering::SeqCst), 1);
}

#[test]
fn bad_bounds_are_refused_by_the_library_before_anything_changes() {
    let comm = Comm::host(|_: &mut [f64], _| Ok::<(), String>(())).unwrap();
    let (mut opt, p) = one_param(&comm);
    let before = opt.param_f32(p).unwrap().to_vec();
    for bound in [-1.0, f64::NAN] {
        let e = opt.step_with(&clipped(bound, NormType::L2)).unwrap_err();
        assert_eq!(e.status, Status::InvalidArgument, "{}", e);
        assert!(e.message.contains("max_grad_norm"), "{}", e.message);
    }
    assert_eq!(opt.param_f32(p).unwrap(), &before[..]);
}

#[test]
fn nccl_communicators_check_their_arguments_or_need_a_library_built_with_nccl() {
    if !shardadam::build_info().contains("nccl: built") {
        let e = Comm::nccl_unique_id().unwrap_err();
        assert_eq!(e.status, Status::Unsupported, "{}", e);
        let id = NcclUniqueId::from_bytes([0; 128]);
        let e = Comm::nccl(&id, 1, 0, 0).unwrap_err();
        assert_eq!(e.status, Status::Unsupported, "{}", e);
        return;
    }
    // With NCCL, creating a communicator needs a GPU per rank (tested in C++); bad
    // arguments are refused before NCCL is called.
    let id = NcclUniqueId::from_bytes([0; 128]);
    for (nranks, rank, needle) in [(0, 0, "nranks is 0"), (2, 2, "rank is 2")] {
        let e = Comm::nccl(&id, nranks, rank, 0).unwrap_err();
        assert_eq!(e.status, Status::InvalidArgument, "{}", e);
        assert!(e.message.contains(needle), "{}", e.message);
    }
    let e = unsafe { Comm::wrap_nccl(std::ptr::null_mut()) }.unwrap_err();
    assert_eq!(e.status, Status::InvalidArgument, "{}", e);
}

#[test]
fn a_ranked_host_communicator_says_its_rank_and_refuses_one_out_of_range() {
    let comm = Comm::host_ranked(1, 3, |_: &mut [f64], _| Ok::<(), String>(())).unwrap();
    assert_eq!(comm.rank_and_size().unwrap(), Some((1, 3)));
    let unsaid = Comm::host(|_: &mut [f64], _| Ok::<(), String>(())).unwrap();
    assert_eq!(unsaid.rank_and_size().unwrap(), None);
    for (rank, nranks) in [(3, 3), (-1, 2), (1, 0)] {
        let e = Comm::host_ranked(rank, nranks, |_: &mut [f64], _| Ok::<(), String>(()))
            .err()
            .expect("refused");
        assert_eq!(e.status, Status::InvalidArgument, "{}", e);
        assert!(e.message.contains("0 <= rank < nranks"), "{}", e.message);
    }
}

// ---- split Muon matrices through an all-to-all ------------------------------------------------

/// An all-to-all among the thread ranks: each deposits its blocks and their sizes, then
/// takes its own from every rank's; the second barrier keeps a fast rank from depositing
/// again before the others have read.
struct Exchange {
    deposits: Mutex<Vec<(Vec<u8>, Vec<i64>)>>,
    barrier: Barrier,
    calls: AtomicUsize,
}

impl Exchange {
    fn all_to_all(
        &self,
        rank: usize,
        send: &[u8],
        sent: &[i64],
        recv: &mut [u8],
        received: &[i64],
    ) -> Result<(), String> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.deposits.lock().unwrap()[rank] = (send.to_vec(), sent.to_vec());
        self.barrier.wait();
        let mut at = 0usize;
        let mut outcome = Ok(());
        {
            let deposits = self.deposits.lock().unwrap();
            for (sender, (data, sizes)) in deposits.iter().enumerate() {
                if sizes[rank] != received[sender] {
                    outcome = Err(format!(
                        "rank {} sends {} bytes to rank {}, which expects {}",
                        sender, sizes[rank], rank, received[sender]
                    ));
                    break;
                }
                let start = sizes[..rank].iter().sum::<i64>() as usize;
                let n = sizes[rank] as usize;
                recv[at..at + n].copy_from_slice(&data[start..start + n]);
                at += n;
            }
        }
        self.barrier.wait();
        outcome
    }
}

#[test]
fn split_muon_matrices_step_through_an_all_to_all_as_one_rank_does() {
    // A 7 x 5 matrix in rows (3, 3, 1) and a 4 x 6 one in columns (2, 2, 2) over the thread
    // ranks, whose all_to_all carries each part to its matrix's owner and back: each rank's
    // boxes equal one rank's whole matrices after 3 steps, bit for bit.
    let shapes: [(i64, i64, Placement); 2] =
        [(7, 5, Placement::Shard(0)), (4, 6, Placement::Shard(1))];
    let muon = GroupConfig::new()
        .set("update_rule", RULE_MUON as f64)
        .set("lr", 0.02);
    let mut rng = Rng(5);
    let start: Vec<Vec<f32>> = shapes
        .iter()
        .map(|&(r, c, _)| rng.values((r * c) as usize))
        .collect();
    let grads: Vec<Vec<Vec<f32>>> = (0..3)
        .map(|_| {
            shapes
                .iter()
                .map(|&(r, c, _)| {
                    rng.values((r * c) as usize)
                        .iter()
                        .map(|v| 0.01 * v)
                        .collect()
                })
                .collect()
        })
        .collect();
    let mut whole = Optimizer::new(None).unwrap();
    let g = whole.add_group(&muon).unwrap();
    let params: Vec<Param> = shapes
        .iter()
        .enumerate()
        .map(|(i, &(r, c, _))| {
            whole
                .add_param(&format!("m{}", i), g, &[r, c], start[i].clone(), None)
                .unwrap()
        })
        .collect();
    for step in &grads {
        for (p, grad) in params.iter().zip(step) {
            whole.set_grad(*p, grad).unwrap();
        }
        whole.step().unwrap();
    }
    let wholes: Vec<Vec<f32>> = params
        .iter()
        .map(|&p| whole.param_f32(p).unwrap().to_vec())
        .collect();

    let group = ThreadGroup::new();
    let exchange = Arc::new(Exchange {
        deposits: Mutex::new(vec![(Vec::new(), Vec::new()); RANKS]),
        barrier: Barrier::new(RANKS),
        calls: AtomicUsize::new(0),
    });
    let (start, grads) = (Arc::new(start), Arc::new(grads));
    let handles: Vec<_> = (0..RANKS)
        .map(|rank| {
            let (group, exchange) = (Arc::clone(&group), Arc::clone(&exchange));
            let (start, grads, muon) = (Arc::clone(&start), Arc::clone(&grads), muon.clone());
            thread::spawn(move || {
                let comm = Comm::host_exchanging(
                    rank as i32,
                    RANKS as i32,
                    move |values: &mut [f64], op| {
                        group.all_reduce(rank, values, op);
                        Ok::<(), String>(())
                    },
                    move |send: &[u8], sent: &[i64], recv: &mut [u8], received: &[i64]| {
                        exchange.all_to_all(rank, send, sent, recv, received)
                    },
                )
                .unwrap();
                let mut opt = Optimizer::new(None).unwrap();
                opt.set_comm(&comm).unwrap();
                let grp = opt.add_group(&muon).unwrap();
                let mut mine = Vec::new();
                for (i, &(rows, cols, placement)) in shapes.iter().enumerate() {
                    let spec = Spec {
                        name: "m",
                        global_shape: vec![rows, cols],
                        placement,
                    };
                    let (local, offset) = match placement {
                        Placement::Shard(0) => {
                            let r0 = 3 * rank as i64;
                            (vec![(rows - r0).min(3), cols], vec![r0, 0])
                        }
                        _ => (vec![rows, 2], vec![0, 2 * rank as i64]),
                    };
                    let init = box_of(&start[i], &[rows, cols], &local, &offset);
                    let options = ParamOptions {
                        layout: Some(layout(&spec, rank)),
                        ..ParamOptions::default()
                    };
                    let p = opt
                        .add_param(&format!("m{}", i), grp, &local, init, Some(&options))
                        .unwrap();
                    mine.push((p, local, offset));
                }
                for step in grads.iter() {
                    for (i, (p, local, offset)) in mine.iter().enumerate() {
                        let (rows, cols, _) = shapes[i];
                        opt.set_grad(*p, &box_of(&step[i], &[rows, cols], local, offset))
                            .unwrap();
                    }
                    opt.step().unwrap();
                }
                mine.iter()
                    .map(|(p, local, offset)| {
                        (
                            opt.param_f32(*p).unwrap().to_vec(),
                            local.clone(),
                            offset.clone(),
                        )
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    for (rank, handle) in handles.into_iter().enumerate() {
        for (i, (got, local, offset)) in handle.join().unwrap().into_iter().enumerate() {
            let (rows, cols, _) = shapes[i];
            assert_eq!(
                got,
                box_of(&wholes[i], &[rows, cols], &local, &offset),
                "rank {}, matrix {}",
                rank,
                i
            );
        }
    }
    assert!(
        exchange.calls.load(Ordering::SeqCst) > 0,
        "all_to_all was called"
    );
}
