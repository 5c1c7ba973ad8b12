//! A compiled GPU plan (CUDA or HIP): one loaded function (or library GEMM) per launch, launched in order on the
//! device's stream.
//!
//! Parameters follow the C-like dialect's signature (`kiln_jit::render::cuda`): each input's device address, the
//! output's, then the rng keys (4 words per `Rand` slot) when the kernel draws random numbers, the fault record
//! when it can fault, and a split-K GEMM's workspace (two addresses). A plan that can fault zeroes the record
//! before its first launch and reads it back after the last (the one wait for the device such a run costs; other
//! runs return while the GPU works).
//!
//! **Replays as graphs.** Where the driver has graphs (`Driver::graphs`: CUDA graphs), a plan's first run launches
//! its kernels one by one; its second builds them into one graph (a kernel node per launch, each after the one
//! before, as stream order had them) and every later run launches that graph with one call: the host cost of a
//! replay no longer grows with its launches (a few microseconds each through the driver), which is what a small
//! training step is made of. No capture API for the user: the training loop stays plain code.
//!
//! Nodes are built explicitly, not captured from the stream, which sidesteps stream capture's pitfalls (no
//! allocation or synchronizing call may happen inside a capture; cudarc's event tracking must be off while
//! capturing). The graph owns no memory: a run's inputs and outputs are new buffers each time, so before each
//! launch the nodes whose parameters changed are patched in place (`Driver::graph_set`, which leaves queued
//! launches alone), never re-captured. The plan's own scratch (temps, the rng keys' buffer, the fault record, the
//! split-K workspace) is pinned while it replays: allocated once, kept between runs, so the nodes that touch only
//! scratch are never patched. That costs the plan its temps' memory between runs (as PyTorch's graph memory pools
//! do), and serializes runs of one plan (a lock held from the start of a run to its launch), which the device's one
//! stream does anyway. Buffers the pool hands out later never alias the pinned scratch: it is not returned to the pool.
//! A graph the driver cannot build is said once and the plan launches one by one from then on.
//!
//! A GEMM the race gave to the vendor library (`gpu_library`: cuBLASLt on CUDA) is a library launch, not a kernel:
//! its parameters are A's, B's, the bias's and the output's addresses, and its graph node is the library call
//! captured from the stream into a child graph (`Driver::graph_build`), captured again when its addresses change.
//! Where the library has not the kernel's epilogue, the launch is two nodes: the library's product into the plan's
//! product scratch (f32, sized for the largest such GEMM, shared as the split-K workspace is, pinned with it), then
//! the epilogue pass, a kernel reading the kernel's inputs and that product.
//!
//! A split-K GEMM (`kiln_jit::render::cuda::gemm`) also takes a workspace: one per plan, sized for the largest and
//! shared by all (they run in stream order, each leaving its counters zero), part of the plan's scratch (so
//! pinned while the plan replays, and zeroed only when allocated).
//!
//! No donations: the kernels' parameters are `__restrict__`, so an output may not alias an input.

use super::tune::Chosen;
use super::{Driver, Node};
use crate::gpu_library::LibGemm;
use crate::plan_run::{DevicePlan, Place, PlanShape, Planned, Run};
use crate::{BackendError, Buffer, Executable};
use kiln_jit::kernel::{FAULT_WORDS, Fault, KernelPlan, Slot};
use kiln_jit::render::cuda::{GpuKernel, Workspace};
use kiln_jit::{DType, Graph, RngKey};
use parking_lot::{Mutex, MutexGuard};
use smallvec::SmallVec;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// A launch before its plan compiles: a GEMM whose choice is prepared (`tune::prepare`), or any other kernel rendered
/// as `gpu_cache` renders it (rendered once: for the batch compile, then for the launch).
enum Prepared {
    Gemm(Box<super::tune::GemmChoice>),
    Rendered(Result<GpuKernel, String>),
}

/// One launch of a plan: a kernel, or the vendor library's GEMM where the race chose it (`tune`).
enum CompiledLaunch<D: Driver> {
    Kernel {
        function: D::Function,
        block: u32,
        /// (0, 0) for an empty output: nothing to launch.
        grid: (u32, u32),
        uses_rng: bool,
        can_fault: bool,
        /// A split-K GEMM's: the plan's shared workspace is passed after its buffers.
        workspace: bool,
    },
    Library {
        gemm: D::Library,
        spec: LibGemm,
        /// The epilogue pass after the library's product (`tune::LibraryRun`): its function, block and grid.
        pass: Option<(D::Function, u32, (u32, u32))>,
    },
}

impl<D: Driver> CompiledLaunch<D> {
    /// Whether it launches anything (a kernel with an empty output does not).
    fn runs(&self) -> bool {
        match self {
            CompiledLaunch::Kernel { grid, .. } => grid.0 != 0,
            CompiledLaunch::Library { spec, .. } => spec.m * spec.n * spec.batch != 0,
        }
    }

    fn uses_rng(&self) -> bool {
        matches!(self, CompiledLaunch::Kernel { uses_rng: true, .. })
    }

    fn can_fault(&self) -> bool {
        matches!(self, CompiledLaunch::Kernel { can_fault: true, .. })
    }

    /// The graph nodes this launch queues: one, or two for a library GEMM followed by its epilogue pass.
    fn parts(&self) -> usize {
        match self {
            CompiledLaunch::Library { pass: Some(_), .. } => 2,
            _ => 1,
        }
    }

    /// Graph node `part` of this launch with a run's parameters `params` for it.
    fn node<'a>(&'a self, part: usize, params: &'a [u64]) -> Node<'a, D> {
        match (self, part) {
            (CompiledLaunch::Library { pass: Some((function, block, grid)), .. }, 1) => {
                Node::Kernel { function, grid: *grid, block: *block, params }
            }
            (CompiledLaunch::Kernel { function, grid, block, .. }, _) => {
                Node::Kernel { function, grid: *grid, block: *block, params }
            }
            (CompiledLaunch::Library { gemm, .. }, _) => {
                let p = |i: usize| params.get(i).copied().unwrap_or(0);
                Node::Library { gemm, params: [p(0), p(1), p(2), p(3)] }
            }
        }
    }

    /// Bytes of the f32 product a library GEMM followed by a pass writes (0 for any other launch).
    fn product_bytes(&self) -> usize {
        match self {
            CompiledLaunch::Library { spec, pass: Some(_), .. } => spec.batch * spec.m * spec.n * 4,
            _ => 0,
        }
    }
}

struct GpuPlan<D: Driver> {
    ctx: Arc<D>,
    shape: PlanShape,
    launches: Vec<CompiledLaunch<D>>,
    /// Bytes of each temp slot (the largest kernel output placed there).
    temps: Vec<usize>,
    /// The graph's nodes in order, as (launch, part): one per launch with threads to run (an empty output launches
    /// nothing), two for a library GEMM followed by its epilogue pass (`CompiledLaunch::parts`).
    nodes: Vec<(usize, usize)>,
    uses_rng: bool,
    can_fault: bool,
    /// The workspace every split-K GEMM of the plan shares (`gpu::shared_workspace`).
    workspace: Option<Workspace>,
    /// Bytes of the product scratch every library GEMM followed by a pass shares (0: none).
    product: usize,
    /// Replays as a graph (see the module doc), when the driver has graphs and the plan has launches to save.
    replay: Option<Mutex<Replay<D>>>,
}

/// A plan's replay state: whether a run began, its pinned scratch and its graph, once built.
struct Replay<D: Driver> {
    /// A run has begun: the next ones replay.
    ran: bool,
    scratch: Option<Scratch<D::Mem>>,
    /// A replaying run's parameters, one per node, in order: kept between runs so a replay allocates nothing.
    recorded: Vec<Params>,
    /// The graph and the parameters each node holds now.
    graph: Option<(D::Graph, Vec<Params>)>,
    /// The driver could not build the graph (said once): launches one by one from then on.
    failed: bool,
}

type Params = SmallVec<[u64; 8]>;

/// The buffers a run owns besides its inputs and outputs.
struct Scratch<M> {
    temps: Vec<M>,
    /// The rng keys' buffer and its bytes.
    rng: Option<(M, usize)>,
    fault: Option<M>,
    /// The split-K GEMMs' workspace: its counters zeroed when allocated, and left zero by every launch.
    workspace: Option<M>,
    /// The library GEMMs' f32 products their epilogue passes read.
    product: Option<M>,
}

/// Graph replays since the process started: (graphs built, graph launches, nodes patched). For tests and reports.
pub fn graph_counts() -> (u64, u64, u64) {
    (BUILT.load(Ordering::Relaxed), LAUNCHED.load(Ordering::Relaxed), PATCHED.load(Ordering::Relaxed))
}

static BUILT: AtomicU64 = AtomicU64::new(0);
static LAUNCHED: AtomicU64 = AtomicU64::new(0);
static PATCHED: AtomicU64 = AtomicU64::new(0);

/// Compiles `graph` for the device `ctx`: scheduled and rendered as `gpu_cache` says, every kernel's code from the
/// store or compiled (those missing in parallel), then loaded.
pub(crate) fn compile<D: Driver>(ctx: &Arc<D>, graph: &Graph) -> Result<Box<dyn Executable>, BackendError> {
    let err = |reason: String| BackendError::Compile { device: D::NAME, reason };
    graph.verify().map_err(err)?;
    let plan: KernelPlan = crate::gpu_cache::schedule(graph);
    crate::gpu_check::note(&plan).map_err(err)?;
    let dump = crate::dump::Dump::start(graph, &plan);
    // Each GEMM's choice, worked out before anything is compiled (`tune::prepare`: a choice settled by a kernel
    // compiled ahead of time must be one compiled before this plan). Then everything the races will time and every
    // other kernel, compiled in one parallel batch (into the device's code store), so the races find their
    // contestants compiled: a cold plan waits for its slowest kernels per core, not for each race's compiles in
    // turn. Best effort: what failed to compile here is compiled again, and its error reported, where it is used.
    let prepared: Vec<Prepared> = plan
        .launches
        .iter()
        .map(|l| match ctx.races_gemms().then(|| super::tune::prepare(ctx, &l.kernel)).flatten() {
            Some(choice) => Prepared::Gemm(Box::new(choice)),
            None => Prepared::Rendered(crate::gpu_cache::render(D::FLAVOR, ctx.arch(), &l.kernel)),
        })
        .collect();
    let sources: Vec<(&str, &str)> = prepared
        .iter()
        .flat_map(|p| match p {
            Prepared::Gemm(choice) => choice.ahead.as_slice(),
            Prepared::Rendered(Ok(k)) => std::slice::from_ref(k),
            Prepared::Rendered(Err(_)) => &[],
        })
        .map(|k| (k.source.as_str(), k.name.as_str()))
        .collect();
    let _ = ctx.compile(&sources);
    // A GEMM as the race on this device chose it (`tune`), anything else as `gpu_cache` renders it.
    let rendered = plan
        .launches
        .iter()
        .zip(prepared)
        .map(|(l, p)| {
            let untuned = match p {
                Prepared::Rendered(r) => r,
                Prepared::Gemm(choice) => match super::tune::decide(ctx, &l.kernel, *choice) {
                    Ok((chosen, record)) => return Ok((chosen, record)),
                    Err(e) => {
                        // No candidate verified (or the search could not run): the untuned kernel is correct and
                        // maybe slower. Said once, so the cause is not lost.
                        static SAID: std::sync::Once = std::sync::Once::new();
                        SAID.call_once(|| eprintln!("kiln: {} GEMM {} runs untuned: {e}", D::NAME, l.kernel.name));
                        crate::gpu_cache::render(D::FLAVOR, ctx.arch(), &l.kernel)
                    }
                },
            };
            untuned.map(|g| (Chosen::Kernel(g), None)).map_err(|e| {
                err(format!(
                    "{e}; run this graph on Device::cpu() ({} does not run everything kiln has yet)",
                    D::FLAVOR.name()
                ))
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let kernels: Vec<&GpuKernel> = rendered.iter().filter_map(|(c, _)| c.kernel()).collect();
    let sources: Vec<(&str, &str)> = kernels.iter().map(|k| (k.source.as_str(), k.name.as_str())).collect();
    let mut codes = ctx.compile(&sources).map_err(err)?.into_iter();
    let mut launches = Vec::with_capacity(plan.launches.len());
    let mut temps = vec![0usize; plan.temps.len()];
    let ext = D::FLAVOR.extension();
    for (l, (chosen, record)) in plan.launches.iter().zip(&rendered) {
        if let Some(d) = &dump {
            let text = match chosen {
                Chosen::Kernel(k) => k.source.clone(),
                Chosen::Library { gemm, pass: None } => {
                    format!("// {} runs this GEMM through its library: {}\n", D::NAME, gemm.describe())
                }
                Chosen::Library { gemm, pass: Some(p) } => format!(
                    "// {} runs this GEMM's product through its library ({}), then its epilogue:\n{}",
                    D::NAME,
                    gemm.describe(),
                    p.source
                ),
            };
            match record {
                Some(r) => d.tuned_kernel_files(&l.kernel, ext, &text, &r.winner, &r.table()),
                None => d.kernel_files(&l.kernel, ext, &text, ""),
            }
        }
        if let Slot::Temp(t) = l.output {
            temps[t] = temps[t].max(l.kernel.output.len * l.kernel.output.dtype.size_of());
        }
        launches.push(match chosen {
            Chosen::Kernel(k) => {
                let code = codes.next().ok_or_else(|| err("fewer compiled kernels than rendered".into()))?;
                CompiledLaunch::Kernel {
                    function: ctx.load(k, &code).map_err(err)?,
                    block: k.block,
                    grid: k.grid,
                    uses_rng: k.uses_rng,
                    can_fault: k.can_fault,
                    workspace: k.workspace.is_some(),
                }
            }
            Chosen::Library { gemm, pass } => CompiledLaunch::Library {
                gemm: ctx.library(gemm).map_err(err)?,
                spec: gemm.clone(),
                pass: match pass {
                    Some(p) => {
                        let code = codes.next().ok_or_else(|| err("fewer compiled kernels than rendered".into()))?;
                        Some((ctx.load(p, &code).map_err(err)?, p.block, p.grid))
                    }
                    None => None,
                },
            },
        });
    }
    let nodes: Vec<(usize, usize)> = (0..launches.len())
        .filter(|&i| launches[i].runs())
        .flat_map(|i| (0..launches[i].parts()).map(move |part| (i, part)))
        .collect();
    // One launch gains nothing from a graph.
    let replay = (ctx.graphs() && nodes.len() >= 2)
        .then(|| Mutex::new(Replay { ran: false, scratch: None, recorded: Vec::new(), graph: None, failed: false }));
    Ok(Box::new(Planned(GpuPlan {
        ctx: ctx.clone(),
        replay,
        nodes,
        uses_rng: launches.iter().any(CompiledLaunch::uses_rng),
        can_fault: launches.iter().any(CompiledLaunch::can_fault),
        workspace: super::shared_workspace(kernels.iter().filter_map(|k| k.workspace)),
        product: launches.iter().map(CompiledLaunch::product_bytes).max().unwrap_or(0),
        shape: PlanShape::of(&plan, Vec::new()),
        launches,
        temps,
    })))
}

/// One run: every buffer's device address, and the buffers the run owns (temps, rng keys, fault record) or, when
/// it replays the plan's graph, the plan's pinned ones.
struct GpuRun<'a, D: Driver> {
    inputs: SmallVec<[u64; 16]>,
    outputs: SmallVec<[u64; 8]>,
    scratch: Scratch<D::Mem>,
    /// Replaying: the plan's replay state, held until the graph is queued; `scratch` is its pinned scratch, taken
    /// out for the run and put back at its end, and each launched kernel's parameters go to its `recorded` (empty
    /// launches have no node).
    replay: Option<MutexGuard<'a, Replay<D>>>,
}

/// The device memory of a buffer the executor checked to be ours.
fn mem<D: Driver>(b: &Buffer) -> &D::Mem {
    D::unwrap(b).expect("the executor checked every buffer")
}

impl<D: Driver> GpuPlan<D> {
    /// A run's scratch: the plan's pinned one when it replays (reallocated where missing or the wrong size), else
    /// fresh; the rng keys written and the fault record zeroed, in stream order before the run's launches.
    fn scratch(&self, pinned: Option<Scratch<D::Mem>>, rng: &[RngKey]) -> Result<Scratch<D::Mem>, BackendError> {
        let ctx = &self.ctx;
        let (temps, old_rng, old_fault, old_workspace, old_product) = match pinned {
            Some(s) => (Some(s.temps), s.rng, s.fault, s.workspace, s.product),
            None => (None, None, None, None, None),
        };
        let temps = match temps {
            Some(t) => t,
            None => self.temps.iter().map(|&n| ctx.alloc(DType::U8, n)).collect::<Result<_, _>>()?,
        };
        let rng = if self.uses_rng && !rng.is_empty() {
            let words = RngKey::gpu_bytes(rng);
            let mut b = match old_rng.filter(|(_, n)| *n == words.len()) {
                Some((b, _)) => b,
                None => ctx.alloc(DType::U32, words.len() / 4)?,
            };
            ctx.write(&mut b, &words)?;
            Some((b, words.len()))
        } else {
            None
        };
        let fault = if self.can_fault {
            let mut b = match old_fault {
                Some(b) => b,
                None => ctx.alloc(DType::I32, FAULT_WORDS)?,
            };
            ctx.write(&mut b, &[0u8; FAULT_WORDS * 4])?;
            Some(b)
        } else {
            None
        };
        let workspace = match (old_workspace, self.workspace) {
            (Some(m), _) => Some(m),
            (None, Some(w)) => Some(super::workspace(ctx, w)?),
            (None, None) => None,
        };
        let product = match old_product {
            Some(m) => Some(m),
            None if self.product > 0 => Some(ctx.alloc(DType::U8, self.product)?),
            None => None,
        };
        Ok(Scratch { temps, rng, fault, workspace, product })
    }

    /// Queues a replay's launches (`recorded`, one per node) as the plan's graph: built at the first replay,
    /// patched where a node's parameters changed since. A graph the driver cannot build is said once; the launches
    /// then go one by one, now and in later runs.
    fn replay_graph(&self, r: &mut Replay<D>, recorded: &[Params]) -> Result<(), BackendError> {
        let exec = |reason: String| BackendError::Execute { device: D::NAME, reason };
        if recorded.len() != self.nodes.len() {
            return Err(exec(format!("{} launches recorded for a graph of {}", recorded.len(), self.nodes.len())));
        }
        let node = |i: usize| {
            let (l, part) = self.nodes[i];
            self.launches[l].node(part, &recorded[i])
        };
        match &mut r.graph {
            Some((g, held)) => {
                for (i, (held, now)) in held.iter_mut().zip(recorded).enumerate() {
                    if held != now {
                        // SAFETY: node `i` of this graph was built from launch `nodes[i]`'s function, grid and
                        // block; `now` are that kernel's parameters for this run, live device memory as for a
                        // plain launch (`launch`'s comment).
                        unsafe { self.ctx.graph_set(g, i, &node(i)) }
                            .map_err(|e| exec(format!("patching graph node {i}: {e}")))?;
                        held.clone_from(now);
                        PATCHED.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
            None => {
                let nodes: Vec<_> = (0..recorded.len()).map(node).collect();
                // SAFETY: each node is a launch of this plan with this run's parameters (see `launch`).
                match unsafe { self.ctx.graph_build(&nodes) } {
                    Ok(g) => {
                        r.graph = Some((g, recorded.to_vec()));
                        BUILT.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => {
                        static SAID: std::sync::Once = std::sync::Once::new();
                        SAID.call_once(|| {
                            eprintln!("kiln: {} plans launch one by one: building a graph: {e}", D::NAME)
                        });
                        r.failed = true;
                        for n in &nodes {
                            // SAFETY: as a plain launch (`launch`).
                            unsafe { n.launch(&*self.ctx) }.map_err(exec)?;
                        }
                        return Ok(());
                    }
                }
            }
        }
        let (g, _) = r.graph.as_ref().ok_or_else(|| exec("no graph after building it".into()))?;
        // SAFETY: every node's parameters were set from this run's buffers just above (or are unchanged since a run
        // whose buffers are these same ones: pinned scratch, or inputs and outputs at the same addresses now).
        unsafe { self.ctx.graph_launch(g) }.map_err(|e| exec(format!("launching the plan's graph: {e}")))?;
        LAUNCHED.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// The error the run's fault record holds, if it has one (waits for the device).
    fn read_fault(&self, s: &Scratch<D::Mem>) -> Result<(), BackendError> {
        if let Some(f) = &s.fault {
            let bytes = self.ctx.read(f, FAULT_WORDS * 4)?;
            if let Some(fault) = Fault::decode_i32_bytes(&bytes) {
                return Err(BackendError::Fault { device: D::NAME, fault });
            }
        }
        Ok(())
    }
}

impl<D: Driver> DevicePlan for GpuPlan<D> {
    const DEVICE: &'static str = D::NAME;
    type State<'a> = GpuRun<'a, D>;

    fn shape(&self) -> &PlanShape {
        &self.shape
    }

    fn ours(b: &Buffer) -> bool {
        D::unwrap(b).is_some()
    }

    fn alloc(&self, dtype: DType, len: usize) -> Result<Buffer, BackendError> {
        Ok(D::wrap(self.ctx.alloc(dtype, len)?))
    }

    fn begin<'a>(
        &'a self,
        _run: &Run,
        inputs: &'a [&'a Buffer],
        outputs: &mut [Buffer],
        rng: &[RngKey],
    ) -> Result<GpuRun<'a, D>, BackendError> {
        let ctx = &self.ctx;
        // Another GPU's memory is not this one's to read (the outputs were allocated here: this plan donates nothing).
        if inputs.iter().any(|b| !ctx.owns(mem::<D>(b))) {
            return Err(BackendError::ForeignBuffer { device: D::NAME });
        }
        for &(o, i) in &self.shape.passthrough {
            let bytes = self.shape.outputs[o].1 * self.shape.outputs[o].0.size_of();
            let out = D::unwrap_mut(&mut outputs[o]).expect("outputs are allocated here");
            ctx.copy(mem::<D>(inputs[i]), out, bytes)?;
        }
        // The first run launches one by one; later ones replay the graph (see the module doc).
        let mut replay = None;
        if let Some(r) = &self.replay {
            let mut r = r.lock();
            if std::mem::replace(&mut r.ran, true) && !r.failed {
                r.recorded.clear();
                replay = Some(r);
            }
        }
        let pinned = replay.as_mut().and_then(|r| r.scratch.take());
        let scratch = self.scratch(pinned, rng)?;
        Ok(GpuRun {
            inputs: inputs.iter().map(|b| D::addr(mem::<D>(b))).collect(),
            outputs: outputs.iter().map(|b| D::addr(mem::<D>(b))).collect(),
            scratch,
            replay,
        })
    }

    fn launch(&self, st: &mut GpuRun<'_, D>, _run: &Run, index: usize, places: &[Place]) -> Result<(), BackendError> {
        let l = &self.launches[index];
        if !l.runs() {
            return Ok(()); // an empty output: nothing to compute
        }
        let addr = |p: Place| match p {
            Place::Input(i) => st.inputs[i],
            Place::Output(o) => st.outputs[o],
            Place::Temp(t) => D::addr(&st.scratch.temps[t]),
        };
        let exec = |reason: &str| BackendError::Execute { device: D::NAME, reason: reason.into() };
        let mut params: Params = places.iter().map(|&p| addr(p)).collect();
        // A library GEMM followed by its epilogue pass: the pass's parameters, queued after the library's.
        let mut pass_params = None;
        let (uses_rng, can_fault, workspace) = match l {
            CompiledLaunch::Kernel { uses_rng, can_fault, workspace, .. } => (*uses_rng, *can_fault, *workspace),
            CompiledLaunch::Library { spec, pass, .. } => {
                // The kernel's buffers (inputs, then the output) as the library takes them: A, B, bias, output
                // (with a pass, the product scratch instead of the output; the pass then reads the kernel's inputs
                // and the product, and writes the output).
                let out = *params.last().ok_or_else(|| exec("a launch without an output"))?;
                let input = |i: usize| params.get(i).copied().ok_or_else(|| exec("a library GEMM's input is missing"));
                let lib_out = match pass {
                    Some(_) => {
                        let p =
                            st.scratch.product.as_ref().ok_or_else(|| exec("an epilogue pass without a product"))?;
                        let pp = crate::gpu_library::pass_params(&params, D::addr(p));
                        pass_params = Some(pp.ok_or_else(|| exec("a launch without an output"))?);
                        D::addr(p)
                    }
                    None => out,
                };
                params = spec.ptrs(input, lib_out)?.into_iter().collect();
                (false, false, false)
            }
        };
        if uses_rng {
            let (r, _) = st.scratch.rng.as_ref().ok_or_else(|| exec("random kernel without rng keys"))?;
            params.push(D::addr(r));
        }
        if can_fault {
            let f = st.scratch.fault.as_ref().ok_or_else(|| exec("gathering kernel without a fault record"))?;
            params.push(D::addr(f));
        }
        if workspace {
            let w = self.workspace.ok_or_else(|| exec("split-K GEMM without a workspace"))?;
            let m = st.scratch.workspace.as_ref().ok_or_else(|| exec("split-K GEMM without a workspace"))?;
            params.extend(super::workspace_params::<D>(m, w));
        }
        if let Some(r) = st.replay.as_mut() {
            r.recorded.push(params);
            r.recorded.extend(pass_params);
            return Ok(());
        }
        // SAFETY: a kernel's function was compiled from the dialect's rendering of this launch's kernel, whose
        // parameters are exactly these device addresses in this order (inputs, output, rng keys, fault record,
        // workspace), each a live allocation of this device holding at least the elements the kernel indexes (the
        // plan's buffer lengths); the grid covers the kernel's threads and surplus threads return at once. A library
        // GEMM's are its A, B, bias and output, the kernel's buffers it was recognized from (`LibGemm::of`), or
        // the product scratch (sized for the largest such product) in the output's place; its epilogue pass was
        // compiled from `epilogue_pass` of the kernel, whose parameters are the kernel's inputs, the product, the
        // output.
        unsafe { l.node(0, &params).launch(&*self.ctx) }.map_err(|e| exec(&format!("launching {index}: {e}")))?;
        if let Some(pp) = &pass_params {
            // SAFETY: as above, for the pass.
            unsafe { l.node(1, pp).launch(&*self.ctx) }
                .map_err(|e| exec(&format!("launching {index}'s epilogue: {e}")))?;
        }
        Ok(())
    }

    fn finish(&self, st: GpuRun<'_, D>, _outputs: &mut [Buffer]) -> Result<(), BackendError> {
        let GpuRun { scratch, replay, .. } = st;
        let Some(mut replay) = replay else { return self.read_fault(&scratch) };
        let recorded = std::mem::take(&mut replay.recorded);
        let queued = self.replay_graph(&mut replay, &recorded);
        replay.recorded = recorded;
        let faulted = queued.and_then(|()| self.read_fault(&scratch));
        // Pinned for the next run (after an error too: nothing of it is left in an unknown state).
        replay.scratch = Some(scratch);
        faulted
    }
}
