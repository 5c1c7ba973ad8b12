//! `realize`: from lazy nodes to values, through the plan cache.
//!
//! 1. Walk the unrealized part of the DAG reachable from the targets (iteratively, post-order). Realized nodes
//!    become `Input` slots, `Rand` nodes take their run-time keys from a list, everything else is copied as is.
//! 2. While walking, write the graph's *signature*: each node's op and parameters, dtype, shape and operand
//!    positions, then the outputs; never buffer addresses, seeds or offsets. Two steps of a training loop produce
//!    the same signature, so the second one is a cache hit.
//! 3. The plan cache maps (device, signature) to a compiled `Plan`. The key is the whole signature, not a hash of
//!    it, so a collision can never return the wrong plan. Only on a miss is the walked graph copied into the
//!    petgraph `StableGraph` that passes and backends read: the hit path builds no graph.
//! 4. Run the plan, then give each target its buffer and drop its history. An output may be written over an input
//!    that nothing can read after this realize (buffer donation: `donate.rs`), as a training step's parameters.
//!
//! A CPU plan's signature is also persisted (`plan_store`): a bundle carries the plans its model ran, and an import
//! compiles them, so a deployed process's first step is a cache hit. The encoding lives in `signature.rs`.
//!
//! The cache holds at most [`plan_cache_limit`] plans (`KILN_PLAN_CACHE`, default [`DEFAULT_PLAN_CACHE`]): a
//! process that meets an unbounded stream of shapes (a service with varying batch sizes or sequence lengths) would
//! otherwise keep every plan it ever compiled, each with its arena of intermediates. Past the limit the plan a
//! realize used least recently is dropped (a later realize of its graph compiles it again, from the kernel caches).
//!
//! Deliberately not done yet: constant values are part of the signature (a changing learning rate recompiles;
//! pass it as a tensor to avoid that).

mod donate;

use crate::device::Device;
use crate::error::Result;
use crate::tensor::{Node, State, Tensor, live};
use dashmap::DashMap;
use kiln_backends::{Buffer, Executable};
use kiln_jit::{Graph, NodeData, Op, RngKey};
use petgraph::stable_graph::NodeIndex;
use rustc_hash::FxHashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, Once};

/// A compiled graph for one device.
pub(crate) struct Plan {
    exec: Box<dyn Executable>,
    /// [`CLOCK`] when a realize last took this plan: the least recently used goes first past the limit.
    last_used: AtomicU64,
}

impl Plan {
    fn new(exec: Box<dyn Executable>) -> Plan {
        Plan { exec, last_used: AtomicU64::new(CLOCK.fetch_add(1, Ordering::Relaxed)) }
    }

    /// Marks the plan used now.
    fn touch(&self) {
        self.last_used.store(CLOCK.fetch_add(1, Ordering::Relaxed), Ordering::Relaxed);
    }
}

/// The plans the cache holds unless `KILN_PLAN_CACHE` or [`set_plan_cache_limit`] says otherwise: far more than a
/// program of fixed shapes compiles (a training loop and its evaluation, a few plans each), so only a process that
/// keeps meeting new shapes reaches it.
pub const DEFAULT_PLAN_CACHE: usize = 1024;
/// Ticks once per plan lookup: the cache's notion of "recently".
static CLOCK: AtomicU64 = AtomicU64::new(0);
static EVICTIONS: AtomicU64 = AtomicU64::new(0);
/// The most plans cached; 0: no limit.
static LIMIT: LazyLock<AtomicUsize> = LazyLock::new(|| AtomicUsize::new(env_limit()));

/// `KILN_PLAN_CACHE`: a count of plans, or `unlimited`; unset means [`DEFAULT_PLAN_CACHE`]. Anything else warns
/// once (naming the valid values) and keeps the default: a typo must not stop a program, nor go unnoticed.
fn env_limit() -> usize {
    let text = std::env::var("KILN_PLAN_CACHE").ok();
    parse_limit(text.as_deref()).unwrap_or_else(|| {
        static WARNED: Once = Once::new();
        WARNED.call_once(|| {
            eprintln!(
                "kiln: KILN_PLAN_CACHE={:?} is not a number of plans (at least 1) or `unlimited`; using \
                 {DEFAULT_PLAN_CACHE}",
                text.unwrap_or_default()
            );
        });
        DEFAULT_PLAN_CACHE
    })
}

/// The limit a `KILN_PLAN_CACHE` value names (0: none), or `None` for a value that names none.
fn parse_limit(text: Option<&str>) -> Option<usize> {
    match text.map(str::trim) {
        None | Some("") => Some(DEFAULT_PLAN_CACHE),
        Some(t) if t.eq_ignore_ascii_case("unlimited") => Some(0),
        Some(t) => t.parse::<usize>().ok().filter(|&n| n > 0),
    }
}

/// The most compiled plans the process keeps (`None`: no limit). See [`set_plan_cache_limit`].
pub fn plan_cache_limit() -> Option<usize> {
    Some(LIMIT.load(Ordering::Relaxed)).filter(|&n| n > 0)
}

/// Keeps at most `limit` compiled plans (`None`: no limit), dropping the least recently used at once if more are
/// cached. A dropped plan's memory (its arena of intermediates, its device buffers) is freed when no realize is
/// running it; a later realize of its graph compiles it again, from the kernel caches (no Cranelift compile, no
/// tuning). Overrides `KILN_PLAN_CACHE`. A limit of 0 is taken as 1.
pub fn set_plan_cache_limit(limit: Option<usize>) {
    LIMIT.store(limit.map_or(0, |n| n.max(1)), Ordering::Relaxed);
    evict_over_limit(None);
}

/// Drops every compiled plan (`torch._dynamo.reset()`'s counterpart for kiln's plans); kernel caches, tuning records
/// and realized tensors stay. Plans a realize is running stay alive until it ends.
pub fn clear_plan_cache() {
    let before = PLANS.len();
    PLANS.clear();
    EVICTIONS.fetch_add(before as u64, Ordering::Relaxed);
}

/// Drops the least recently used plans until the cache holds at most the limit, never `keep` (the plan just
/// cached). A plan that a realize is running lives on in that realize's `Arc` until it ends. Kernels' machine code
/// stays in the backends' code caches: small, and other plans may run the same kernels.
fn evict_over_limit(keep: Option<&[u64]>) {
    let limit = LIMIT.load(Ordering::Relaxed);
    while limit > 0 && PLANS.len() > limit {
        let victim = PLANS
            .iter()
            .filter(|e| Some(e.key().as_slice()) != keep)
            .min_by_key(|e| e.value().last_used.load(Ordering::Relaxed))
            .map(|e| e.key().clone());
        let Some(key) = victim else { break };
        if PLANS.remove(&key).is_some() {
            EVICTIONS.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Plans by (device, signature). FxHash rather than SipHash: the key is not attacker-chosen, and hashing a
/// few hundred words per realize is on the replay path.
type PlanCache = DashMap<Vec<u64>, Arc<Plan>, rustc_hash::FxBuildHasher>;
static PLANS: LazyLock<PlanCache> = LazyLock::new(PlanCache::default);
static HITS: AtomicU64 = AtomicU64::new(0);
static MISSES: AtomicU64 = AtomicU64::new(0);
static COMPILES: AtomicU64 = AtomicU64::new(0);
static REALIZES: AtomicU64 = AtomicU64::new(0);
static DONATIONS: AtomicU64 = AtomicU64::new(0);

/// Counters of the runtime, process-wide.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Realizations that found their plan in the cache.
    pub plan_hits: u64,
    /// Realizations that did not (each compiles a plan).
    pub plan_misses: u64,
    /// Plans compiled.
    pub compiles: u64,
    /// Realizations that ran a plan (realizing an already realized tensor does not count).
    pub realizes: u64,
    /// Plans held in the cache now.
    pub cached_plans: usize,
    /// Plans dropped from the cache: the least recently used past [`plan_cache_limit`], and by
    /// [`clear_plan_cache`].
    pub plan_evictions: u64,
    /// Outputs written into the buffer of an input nothing else could read any more (buffer donation: an
    /// optimizer step's parameters and state, see `Optimizer::step`), instead of into a new buffer.
    pub donated_buffers: u64,
    /// Tensor nodes alive now (lazy or realized).
    pub live_nodes: usize,
    /// GEMM autotuning searches run (a tuning-cache miss with `KILN_AUTOTUNE` fast or full).
    pub tunings: u64,
    /// GEMM tuning records reused (from memory, the disk cache or an imported bundle).
    pub tune_hits: u64,
    /// Tuned GEMM kernels generated (code generation ran).
    pub tuned_kernel_compiles: u64,
    /// Tuned GEMM kernels mapped from cached machine code (no code generation).
    pub tuned_kernel_loads: u64,
    /// Kernels compiled by Cranelift.
    pub kernel_compiles: u64,
    /// Cranelift kernels mapped from the kernel cache (disk or an imported bundle) instead of compiled.
    pub kernel_loads: u64,
    /// Elementwise f32 kernels run as generated full-width code (8 or 16 lanes) instead of compiled by Cranelift (on
    /// hosts with AVX2, unless `KILN_ELEMENTWISE=clif`), counted per kernel a compiled plan runs so: generated, or
    /// reused from the process's earlier kernel of the same IR. Not cached on disk: generating one costs about what
    /// mapping a cached one would.
    pub wide_kernel_builds: u64,
    /// Of `wide_kernel_builds`, the kernels whose code was generated: the others ran code generated for an earlier
    /// kernel of the same IR (a model's layers repeat their kernels).
    pub wide_kernels_generated: u64,
    /// Executable mappings made for compiled code: one per kernel compiled or loaded on its own, one per batch of
    /// cached kernels mapped together at a bundle import. A first step after an import makes none.
    pub code_mappings: u64,
    /// Host buffers of 64 KiB or more allocated fresh (page faults to come) because the buffer pool had none of
    /// their size; a replayed step allocates none, and neither does a first step after a bundle import.
    pub fresh_host_buffers: u64,
}

/// The runtime's counters now.
pub fn stats() -> Stats {
    let g = kiln_backends::runtime::stats();
    Stats {
        plan_hits: HITS.load(Ordering::Relaxed),
        plan_misses: MISSES.load(Ordering::Relaxed),
        compiles: COMPILES.load(Ordering::Relaxed),
        realizes: REALIZES.load(Ordering::Relaxed),
        cached_plans: PLANS.len(),
        plan_evictions: EVICTIONS.load(Ordering::Relaxed),
        donated_buffers: DONATIONS.load(Ordering::Relaxed),
        live_nodes: live::count(),
        tunings: g.tunings,
        tune_hits: g.tune_hits,
        tuned_kernel_compiles: g.kernel_compiles,
        tuned_kernel_loads: g.kernel_loads,
        kernel_compiles: g.clif_compiles,
        kernel_loads: g.clif_loads,
        wide_kernel_builds: g.wide_builds,
        wide_kernels_generated: g.wide_generations,
        code_mappings: g.code_mappings,
        fresh_host_buffers: kiln_backends::host_pool::fresh_allocations(),
    }
}

/// What one walked node becomes in the graph.
enum Kind {
    Input { slot: usize },
    Rand { slot: usize },
    Op,
}

struct Walked {
    tensor: Tensor,
    /// This node's operand ids are `Walk::src_ids[srcs]`.
    srcs: std::ops::Range<usize>,
    kind: Kind,
}

/// An open node of the DFS in `Walk::visit`.
struct Frame {
    tensor: Tensor,
    /// Position of this frame's operands on `kids`, once read.
    kids: Option<usize>,
    count: usize,
    next: usize,
    /// Reachable through one edge only, so it needs no entry in the dedup index (see `visit`).
    unique: bool,
}

#[derive(Default)]
struct Walk {
    index: FxHashMap<*const Node, u32>,
    nodes: Vec<Walked>,
    inputs: Vec<Arc<Buffer>>,
    rng: Vec<RngKey>,
    signature: Vec<u64>,
    /// Operand ids of every walked node, back to back (see `Walked::srcs`).
    src_ids: Vec<u32>,
    /// Operands of the open DFS frames (cloned under the node's lock; moved out when the walk descends into one).
    kids: Vec<Option<Tensor>>,
    /// Ids of finished operands whose consumer has not finished yet.
    pending: Vec<u32>,
    /// The DFS stack (empty between visits; kept for its allocation).
    frames: Vec<Frame>,
    /// Ids of the nodes to realize, in the order of the plan's outputs.
    outputs: Vec<u32>,
    /// Scratch of `usable_donations`: uses of each node by the walked graph, and which donation candidates it
    /// reaches.
    uses: Vec<u32>,
    reach: Vec<u64>,
}

thread_local! {
    /// A walk's buffers, kept between realizations on this thread so the replay path allocates nothing for them.
    static SCRATCH: std::cell::RefCell<Option<Walk>> = const { std::cell::RefCell::new(None) };
}

impl Walk {
    /// This thread's scratch walk (or a new one), empty.
    fn take() -> Walk {
        SCRATCH.with(|s| s.borrow_mut().take()).unwrap_or_default()
    }

    /// Empties the walk (dropping its tensor references) and keeps its buffers for the next one.
    fn recycle(mut self) {
        self.index.clear();
        self.nodes.clear();
        self.inputs.clear();
        self.rng.clear();
        self.signature.clear();
        self.src_ids.clear();
        self.kids.clear();
        self.pending.clear();
        self.frames.clear();
        self.outputs.clear();
        SCRATCH.with(|s| *s.borrow_mut() = Some(self));
    }
}

impl Walk {
    /// Visits `root` and everything it needs; returns its local index. Iterative post-order DFS; the operands of
    /// every open frame live on one shared stack, so visiting a node allocates nothing of its own.
    fn visit(&mut self, root: &Tensor) -> u32 {
        if let Some(&i) = self.index.get(&Arc::as_ptr(&root.node)) {
            return i;
        }
        let mut kids = std::mem::take(&mut self.kids);
        // Ids of finished operands, waiting for their consumer to finish.
        let mut pending = std::mem::take(&mut self.pending);
        let mut stack = std::mem::take(&mut self.frames);
        stack.push(Frame { tensor: root.clone(), kids: None, count: 0, next: 0, unique: false });
        while let Some(top) = stack.last_mut() {
            if top.kids.is_none() {
                let buffer = match &*top.tensor.node.state.lock() {
                    State::Realized(b) => Some(b.clone()),
                    State::Lazy(srcs) => {
                        top.kids = Some(kids.len());
                        top.count = srcs.len();
                        kids.extend(srcs.iter().map(|t| Some(t.clone())));
                        None
                    }
                    State::Spare => unreachable!("a node a tensor refers to is never spare"),
                };
                if let Some(b) = buffer {
                    let slot = self.inputs.len();
                    self.inputs.push(b);
                    let frame = stack.pop().expect("frame");
                    let id = self.emit(frame.tensor, 0, Kind::Input { slot }, !frame.unique);
                    pending.push(id);
                    continue;
                }
            }
            let first = top.kids.expect("operands read");
            if top.next < top.count {
                let slot = &mut kids[first + top.next];
                top.next += 1;
                let child = slot.as_ref().expect("each operand is visited once");
                // Two references, the consumer's operand list and our copy on `kids`, mean no other path in this
                // graph reaches the node (nodes are immutable, so none can appear while we walk): skip the index.
                // A racing clone elsewhere only makes it look shared, which is merely slower.
                let unique = Arc::strong_count(&child.node) == 2;
                if !unique && let Some(&id) = self.index.get(&Arc::as_ptr(&child.node)) {
                    pending.push(id);
                    continue;
                }
                // Moved, not cloned: the copy on `kids` is not needed once the walk descends into it.
                let tensor = slot.take().expect("checked above");
                stack.push(Frame { tensor, kids: None, count: 0, next: 0, unique });
                continue;
            }
            let frame = stack.pop().expect("frame");
            self.src_ids.extend(pending.drain(pending.len() - frame.count..));
            kids.truncate(first);
            let kind = match frame.tensor.node.rng {
                Some(key) => {
                    self.rng.push(key);
                    Kind::Rand { slot: self.rng.len() - 1 }
                }
                None => Kind::Op,
            };
            let id = self.emit(frame.tensor, frame.count, kind, !frame.unique);
            pending.push(id);
        }
        self.kids = kids;
        self.frames = stack;
        let root_id = pending.pop().expect("the root's id");
        self.pending = pending;
        root_id
    }

    /// Records a node whose `nsrcs` operand ids are the last ones pushed on `src_ids`; returns its id. `register`
    /// adds it to the dedup index (nodes reachable by one edge only need not be).
    fn emit(&mut self, tensor: Tensor, nsrcs: usize, kind: Kind, register: bool) -> u32 {
        let node = &tensor.node;
        let srcs_at = self.src_ids.len() - nsrcs;
        let srcs = &self.src_ids[srcs_at..];
        let sig = &mut self.signature;
        match &kind {
            Kind::Input { slot } => Op::Input { slot: *slot }.encode(sig),
            Kind::Rand { slot } => match node.op {
                Op::Rand { dist, .. } => Op::Rand { dist, slot: *slot }.encode(sig),
                _ => unreachable!("only Rand nodes carry an rng key"),
            },
            Kind::Op => node.op.encode(sig),
        }
        crate::signature::push_node(sig, node.dtype, node.shape.dims(), srcs);
        let id = self.nodes.len() as u32;
        if register {
            self.index.insert(Arc::as_ptr(node), id);
        }
        self.nodes.push(Walked { tensor, srcs: srcs_at..srcs_at + nsrcs, kind });
        id
    }

    /// Walks `targets` for `device` and writes the whole signature; `outputs` gets the ids of the targets that are
    /// not realized yet (empty: nothing to do).
    fn sign(&mut self, device: Device, targets: &[&Tensor], outputs: &mut Vec<u32>) {
        self.signature.push(device.code());
        for t in targets {
            let id = self.visit(t);
            if !outputs.contains(&id) && matches!(self.nodes[id as usize].kind, Kind::Op | Kind::Rand { .. }) {
                outputs.push(id);
            }
        }
        self.signature.push(crate::signature::END_OF_NODES);
        self.signature.extend(outputs.iter().map(|&o| o as u64));
    }

    /// The petgraph copy of the walked graph (built on a cache miss only).
    fn to_graph(&self, outputs: &[u32]) -> Graph {
        let mut g = Graph::new();
        let mut ids: Vec<NodeIndex> = Vec::with_capacity(self.nodes.len());
        for w in &self.nodes {
            let n = &w.tensor.node;
            let op = match (&w.kind, &n.op) {
                (Kind::Input { slot }, _) => Op::Input { slot: *slot },
                (Kind::Rand { slot }, Op::Rand { dist, .. }) => Op::Rand { dist: *dist, slot: *slot },
                (_, op) => op.clone(),
            };
            let srcs: Vec<NodeIndex> = self.src_ids[w.srcs.clone()].iter().map(|&s| ids[s as usize]).collect();
            ids.push(g.add(NodeData { op, shape: n.shape.clone(), dtype: n.dtype }, &srcs));
        }
        g.outputs = outputs.iter().map(|&o| ids[o as usize]).collect();
        g
    }
}

/// Computes the values of `tensors` as one graph per device (already realized tensors are skipped).
pub fn realize(tensors: &[&Tensor]) -> Result<()> {
    realize_replacing(tensors, &[])
}

thread_local! {
    /// Tensors a module computed as a side effect of a forward pass (a batch norm's running statistics), realized
    /// with whatever this thread realizes next: in the same plan as the step's loss, so the batch's statistics are
    /// computed once, and not held lazily from step to step (each update reads the last: the chain would grow).
    static DEFERRED: std::cell::RefCell<Vec<Tensor>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Realizes `t` with the next realize on this thread (see `DEFERRED`).
pub(crate) fn defer(t: Tensor) {
    DEFERRED.with(|d| d.borrow_mut().push(t));
}

/// [`realize`], told that each node in `replaced` has one handle outside the graph that the caller overwrites
/// right after (an optimizer's parameter slot): that handle does not keep the node's buffer from being donated to
/// an output (`donate.rs`). Deferred side effects (`defer`) join the targets.
pub(crate) fn realize_replacing(tensors: &[&Tensor], replaced: &[*const Node]) -> Result<()> {
    let deferred = DEFERRED.with(|d| std::mem::take(&mut *d.borrow_mut()));
    if deferred.is_empty() {
        return realize_targets(tensors, replaced);
    }
    let mut all: Vec<&Tensor> = tensors.to_vec();
    all.extend(deferred.iter().filter(|t| !t.is_realized()));
    realize_targets(&all, replaced)
}

fn realize_targets(tensors: &[&Tensor], replaced: &[*const Node]) -> Result<()> {
    // The common case, one device: the walk itself skips tensors that are already realized.
    if let Some(first) = tensors.first()
        && tensors.iter().all(|t| t.device() == first.device())
    {
        return realize_on(first.device(), tensors, replaced);
    }
    let mut devices: Vec<Device> = tensors.iter().map(|t| t.device()).collect();
    devices.dedup();
    for device in devices {
        let targets: Vec<&Tensor> =
            tensors.iter().copied().filter(|t| t.device() == device && !t.is_realized()).collect();
        if !targets.is_empty() {
            realize_on(device, &targets, replaced)?;
        }
    }
    Ok(())
}

fn realize_on(device: Device, targets: &[&Tensor], replaced: &[*const Node]) -> Result<()> {
    let mut walk = Walk::take();
    let result = realize_walk(&mut walk, device, targets, replaced);
    walk.recycle();
    result
}

fn realize_walk(walk: &mut Walk, device: Device, targets: &[&Tensor], replaced: &[*const Node]) -> Result<()> {
    let mut outputs = std::mem::take(&mut walk.outputs);
    walk.sign(device, targets, &mut outputs);
    let result = if outputs.is_empty() {
        Ok(()) // realized by another thread meanwhile
    } else {
        run_walk(walk, device, &outputs, replaced)
    };
    walk.outputs = outputs;
    result
}

/// Compiles `graph` (the graph `signature` encodes) for `device` and caches the plan; a plan compiled for the CPU
/// is also persisted (`plan_store`). When two threads race, the first plan cached is the one both use.
fn compile_plan(signature: &[u64], graph: &Graph, device: Device) -> Result<Arc<Plan>> {
    let exec = device.backend()?.compile(graph)?;
    COMPILES.fetch_add(1, Ordering::Relaxed);
    #[cfg(feature = "cpu")]
    if device == Device::Cpu {
        crate::plan_store::remember(signature);
    }
    let plan = PLANS.entry(signature.to_vec()).or_insert_with(|| Arc::new(Plan::new(exec))).clone();
    evict_over_limit(Some(signature));
    Ok(plan)
}

/// Compiles and caches the plan of a persisted signature ahead of its first use; `false` when it is cached already.
/// Persisted plans are CPU plans (`plan_store`).
#[cfg(feature = "cpu")]
pub(crate) fn prebuild(signature: &[u64], graph: &Graph, device: Device) -> Result<bool> {
    if PLANS.contains_key(signature) {
        return Ok(false);
    }
    compile_plan(signature, graph, device).map(|_| true)
}

/// Finds (or compiles) the plan of a finished walk, runs it (donating the inputs it may, `donate.rs`), and gives
/// each output node its buffer.
fn run_walk(walk: &mut Walk, device: Device, outputs: &[u32], replaced: &[*const Node]) -> Result<()> {
    let cached = PLANS.get(walk.signature.as_slice()).map(|p| p.clone());
    let plan = match cached {
        Some(p) => {
            HITS.fetch_add(1, Ordering::Relaxed);
            p.touch();
            p
        }
        None => {
            MISSES.fetch_add(1, Ordering::Relaxed);
            compile_plan(&walk.signature, &walk.to_graph(outputs), device)?
        }
    };

    let mut donated: smallvec::SmallVec<[Option<Buffer>; 8]> = smallvec::SmallVec::new();
    let donations = plan.exec.donations();
    let usable = if donations.is_empty() {
        smallvec::SmallVec::new()
    } else {
        walk.usable_donations(donations, outputs, replaced)
    };
    let taken = donate::take(&walk.nodes, &mut walk.inputs, &usable, &mut donated);
    // Inline for the common input counts: no allocation of its own on the replay path.
    let inputs: smallvec::SmallVec<[&Buffer; 16]> = walk.inputs.iter().map(|b| &**b).collect();
    let results = match plan.exec.run_donating(&inputs, &mut donated, &walk.rng) {
        Ok(r) => r,
        Err(e) => {
            donate::restore(taken, &mut donated);
            return Err(e.into());
        }
    };
    REALIZES.fetch_add(1, Ordering::Relaxed);
    if !taken.is_empty() {
        DONATIONS.fetch_add(taken.len() as u64, Ordering::Relaxed);
    }
    let results: smallvec::SmallVec<[Arc<Buffer>; 8]> = results.into_iter().map(Arc::new).collect();
    donate::finish(taken, &results);
    for (&o, buffer) in outputs.iter().zip(results) {
        let node = &walk.nodes[o as usize].tensor.node;
        let history = std::mem::replace(&mut *node.state.lock(), State::Realized(buffer));
        drop(history); // outside the lock: dropping history may free a long chain
    }
    Ok(())
}

/// The signature `realize` would look `targets` up by, and the graph it would compile on a miss (nothing runs).
#[cfg(all(test, feature = "cpu"))]
pub(crate) fn signature_and_graph(device: Device, targets: &[&Tensor]) -> (Vec<u64>, Graph) {
    let mut walk = Walk::default();
    let mut outputs = Vec::new();
    walk.sign(device, targets, &mut outputs);
    (walk.signature.clone(), walk.to_graph(&outputs))
}

/// The graph IR of some tensors together with the data it reads: what a backend would be given to compute them.
/// Capturing does not realize anything. Tests use it to hold every backend to the reference interpreter.
#[derive(Clone, Debug)]
pub struct Captured {
    pub graph: Graph,
    pub inputs: Vec<kiln_jit::HostBuffer>,
    pub rng: Vec<RngKey>,
}

impl Captured {
    /// The outputs as the reference interpreter computes them.
    pub fn reference(&self) -> std::result::Result<Vec<kiln_jit::HostBuffer>, String> {
        let inputs: Vec<&kiln_jit::HostBuffer> = self.inputs.iter().collect();
        kiln_jit::interp::run(&self.graph, &inputs, &self.rng)
    }
}

/// Captures the graph that computes `tensors` (see `Captured`).
pub fn capture(tensors: &[&Tensor]) -> Result<Captured> {
    let mut walk = Walk::default();
    let outputs: Vec<u32> = tensors.iter().map(|t| walk.visit(t)).collect();
    let graph = walk.to_graph(&outputs);
    let mut inputs = Vec::with_capacity(walk.inputs.len());
    for (buffer, w) in walk.inputs.iter().zip(walk.nodes.iter().filter(|w| matches!(w.kind, Kind::Input { .. }))) {
        inputs.push(w.tensor.device().backend()?.download(buffer)?);
    }
    Ok(Captured { graph, inputs, rng: walk.rng })
}

#[cfg(test)]
mod tests {
    use super::{DEFAULT_PLAN_CACHE, parse_limit};

    #[test]
    fn plan_cache_limits_parse_as_documented() {
        assert_eq!(parse_limit(None), Some(DEFAULT_PLAN_CACHE));
        assert_eq!(parse_limit(Some(" ")), Some(DEFAULT_PLAN_CACHE));
        assert_eq!(parse_limit(Some("64")), Some(64));
        assert_eq!(parse_limit(Some("Unlimited")), Some(0));
        assert_eq!(parse_limit(Some("0")), None);
        assert_eq!(parse_limit(Some("-3")), None);
        assert_eq!(parse_limit(Some("lots")), None);
    }
}
