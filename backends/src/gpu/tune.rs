//! Which kernel a GEMM runs as on a GPU device (CUDA, HIP): the tensor-core template (bf16 on CUDA sm_80 and later)
//! or the SIMT tiled template in one of a few tiles (`gpu_gemm::GpuGemm`), chosen per GEMM by a race on the device
//! and remembered, as the wgpu device chooses its tiles.
//!
//! The choice: a record in `kiln_autotune::Store::global()` under this GPU's fingerprint (its architecture, name,
//! multiprocessors, driver and compiler versions), else `kiln_autotune::search` over the candidates in the
//! `KILN_AUTOTUNE` mode: ranked by `gpu_gemm::score`, the best few rendered, compiled (through the device's code
//! store, so a winner is not compiled twice), verified against `kernel::eval::run_at` on sampled positions (a wrong
//! kernel can never win) and timed with the device synchronized; the record is stored. `KILN_AUTOTUNE=off` takes
//! the best score and runs nothing, which is also what an ahead-of-time compile renders (`gpu_cache::render`).
//! Where no record exists but that best-scored kernel is already compiled for this architecture (a bundle compiled
//! without a GPU and imported, or an earlier run with tuning off), it is taken without a race, so a service's first
//! request after a bundle import compiles nothing; `KILN_AUTOTUNE=full` (`kiln tune`) races anyway.
//!
//! A plan compiles every kernel its races will time (`race_kernels`: `kiln_autotune::timed_configs` of each race)
//! with its other kernels in one parallel batch before the races run, so each race finds its contestants compiled.
//!
//! The tuning problem is the kernel itself on synthetic data, so the key holds its exact dims and a checksum of its
//! epilogue code. The vendor library's GEMM (cuBLASLt on CUDA: `gpu_library`) races beside the templates where it takes
//! the problem (its layouts, its epilogues) and the device has it; `KILN_GEMM_LIBRARY=0` leaves it out. Not done
//! here: rendering (`kiln_jit::render::cuda`).

use super::Driver;
use crate::BackendError;
use crate::gemm_check::{Reference, env_mode, exact_dims, operand_layouts};
use crate::gpu_gemm::{GpuGemm, GpuTile, best_scored, renderable, score};
use crate::gpu_library::LibGemm;
use kiln_autotune::{Candidate, DeviceFingerprint, Mode, Store, TuneKey, TuneRecord, checksum_of};
use kiln_jit::kernel::KernelIr;
use kiln_jit::kernel::gemm::GemmView;
use kiln_jit::render::cuda::GpuKernel;
use kiln_jit::{DType, HostBuffer};
use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What tuning records measured on `ctx`'s GPU are valid for.
fn fingerprint<D: Driver>(ctx: &D) -> DeviceFingerprint {
    DeviceFingerprint {
        arch: format!("{}-{}", D::NAME, ctx.arch()),
        model: ctx.model(),
        features: ctx.tuning_features(),
    }
}

fn key<D: Driver>(ctx: &D, k: &KernelIr, v: &GemmView, cands: &[Contestant]) -> TuneKey {
    TuneKey {
        op: format!("{}-gemm", D::NAME),
        dims: exact_dims(v),
        dtypes: format!("{},{}->{}", v.operands, v.operands, v.out),
        layout: {
            let (a, b) = operand_layouts(v);
            format!("{a},{b}")
        },
        epilogue: format!("{:016x}", checksum_of([format!("{:?} -> {}", k.outer, k.result)])),
        device: fingerprint(ctx).id(),
        candidates: checksum_of(cands.iter().map(Contestant::name)),
    }
}

/// How a GEMM runs: a rendered kernel, or the vendor library's GEMM (`gpu_library`), its epilogue fused or (`pass`)
/// applied after it by a kernel of its own that reads the library's f32 product from the plan's scratch.
pub(crate) enum Chosen {
    Kernel(GpuKernel),
    Library { gemm: LibGemm, pass: Option<GpuKernel> },
}

impl Chosen {
    /// The kernel to compile: the template's, or the library's epilogue pass.
    pub(crate) fn kernel(&self) -> Option<&GpuKernel> {
        match self {
            Chosen::Kernel(k) => Some(k),
            Chosen::Library { pass, .. } => pass.as_ref(),
        }
    }
}

/// What the library runs for one GEMM kernel: its GEMM with the kernel's epilogue (`LibGemm::of`), or, where the
/// library has no such epilogue, its product alone (`LibGemm::product_of`) and then `pass`, the kernel's epilogue as
/// a kernel of its own (`kiln_jit::kernel::gemm::epilogue_pass`).
#[derive(Clone, Debug)]
pub(crate) struct LibraryRun {
    pub gemm: LibGemm,
    pub pass: Option<KernelIr>,
}

impl LibraryRun {
    /// The library's run of GEMM kernel `k` (recognized as `v`), or `None` where it cannot describe the operands.
    pub(crate) fn of(k: &KernelIr, v: &GemmView) -> Option<LibraryRun> {
        if let Some(gemm) = LibGemm::of(k, v) {
            return Some(LibraryRun { gemm, pass: None });
        }
        let gemm = LibGemm::product_of(k, v)?;
        Some(LibraryRun { gemm, pass: Some(kiln_jit::kernel::gemm::epilogue_pass(k)) })
    }

    /// The epilogue pass rendered for the device, checked to take nothing but its buffers.
    fn render<D: Driver>(&self, ctx: &D) -> Result<Option<GpuKernel>, String> {
        let Some(p) = &self.pass else { return Ok(None) };
        let g = crate::gpu_cache::render(D::FLAVOR, ctx.arch(), p)?;
        if g.uses_rng || g.can_fault || g.workspace.is_some() {
            return Err(format!("the epilogue pass {} takes more than its buffers", g.name));
        }
        Ok(Some(g))
    }
}

/// A contestant of the race: a template candidate, or the library (with its epilogue, or followed by a pass).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Contestant {
    Kernel(GpuGemm),
    Library { pass: bool },
}

/// The library contestant's name in tuning records: its GEMM with the epilogue fused.
pub const LIBRARY: &str = "library";
/// The library contestant's name where its product is followed by the epilogue as a kernel of its own.
pub const LIBRARY_THEN_PASS: &str = "library+pass";

impl Contestant {
    fn name(&self) -> String {
        match self {
            Contestant::Kernel(c) => c.name(),
            Contestant::Library { pass: false } => LIBRARY.into(),
            Contestant::Library { pass: true } => LIBRARY_THEN_PASS.into(),
        }
    }
}

/// Whether the vendor library may race (`KILN_GEMM_LIBRARY=0` keeps GEMMs on kiln's own kernels).
fn library_allowed() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("KILN_GEMM_LIBRARY").map_or(true, |v| v != "0" && v != "off"))
}

/// How GEMM kernel `k` will be chosen, worked out before its plan compiles anything ([`prepare`]) and made after
/// ([`decide`]): settled without a race (a stored record's winner, or the untuned kernel compiled ahead of time,
/// looked for before the plan's own compiles could pass for a bundle's), or a race, whose contestants' kernels the
/// plan compiles first with its others in one parallel batch.
pub(crate) struct GemmChoice {
    /// What it is raced among, kept for `decide` (its candidates are not rendered twice).
    contest: Contest,
    settled: Option<Result<(Chosen, Option<TuneRecord>), String>>,
    /// The kernels to compile before deciding: the race's timed contestants (`kiln_autotune::timed_configs`, a
    /// library pass among them), or the settled choice's.
    pub(crate) ahead: Vec<GpuKernel>,
}

/// [`GemmChoice`] for GEMM kernel `k`; `None` when `k` is no GEMM the templates take (the caller renders it as
/// `gpu_cache` says).
pub(crate) fn prepare<D: Driver>(ctx: &Arc<D>, k: &KernelIr) -> Option<GemmChoice> {
    let contest = contest(ctx, k)?;
    let race = Race::new(ctx, k, &contest);
    let mode = env_mode();
    let kernel = |c: &Chosen| c.kernel().cloned();
    let (settled, ahead) = match race.settled(Store::global(), mode) {
        Some(settled) => {
            let ahead = settled.as_ref().ok().and_then(|(c, _)| kernel(c)).into_iter().collect();
            (Some(settled), ahead)
        }
        None => {
            let scored = race.scored();
            let timed = kiln_autotune::timed_configs(&scored, mode);
            (None, timed.into_iter().filter_map(|c| race.chosen(*c).ok().as_ref().and_then(kernel)).collect())
        }
    };
    Some(GemmChoice { contest, settled, ahead })
}

/// GEMM kernel `k` as the device runs it (`choice` from [`prepare`] of the same kernel): the settled choice, or the
/// race's winner among the candidates that render and the library's GEMM where it takes the problem (a library that
/// then declines the problem fails its verification and cannot win), with the record that chose it (none for a
/// kernel compiled ahead of time and taken as it is).
pub(crate) fn decide<D: Driver>(
    ctx: &Arc<D>,
    k: &KernelIr,
    choice: GemmChoice,
) -> Result<(Chosen, Option<TuneRecord>), String> {
    let GemmChoice { contest, settled, .. } = choice;
    let chosen = match settled {
        Some(settled) => settled,
        None => {
            let r = Race::new(ctx, k, &contest);
            // A race of this plan for the same problem (a repeated layer) may have stored its record since.
            let (store, mode) = (Store::global(), env_mode());
            r.stored(store, mode).unwrap_or_else(|| race(&r, store, mode))
        }
    };
    if let Ok((_, Some(record))) = &chosen {
        RECORDS.lock().push(record.clone());
    }
    chosen
}

/// What GEMM kernel `k` is raced among: its view, the template candidates that render it, and the library's run
/// where it may race (the device has a library, `KILN_GEMM_LIBRARY` allows it, and it can describe the operands);
/// `None` when no template takes `k`.
fn contest<D: Driver>(ctx: &Arc<D>, k: &KernelIr) -> Option<Contest> {
    let v = GemmView::of(k)?;
    let cands = renderable(D::FLAVOR, ctx.arch(), k, &v);
    if cands.is_empty() {
        return None;
    }
    let lib = LibraryRun::of(k, &v).filter(|_| library_allowed() && ctx.has_library());
    Some(Contest { v, cands, lib })
}

/// A GEMM kernel's view, the template candidates that render it, and the library's run where it may race.
struct Contest {
    v: GemmView,
    cands: Vec<GpuGemm>,
    lib: Option<LibraryRun>,
}

/// A contestant made ready to run: a kernel with its loaded function and workspace (a split-K GEMM's), or the
/// library's prepared GEMM, with its epilogue pass (loaded) and the f32 product it reads.
enum Built<D: Driver> {
    Kernel(GpuKernel, Arc<D::Function>, Option<D::Mem>),
    Library(D::Library, Option<BuiltPass<D>>),
}

/// The library's epilogue pass made ready to run: the kernel, its loaded function, and the f32 product it reads.
struct BuiltPass<D: Driver> {
    kernel: GpuKernel,
    function: D::Function,
    product: D::Mem,
}

static RECORDS: parking_lot::Mutex<Vec<TuneRecord>> = parking_lot::Mutex::new(Vec::new());

/// Every GEMM tuning record the GPU devices searched or reused in this process, in order: for reports and for the
/// tests that check what the race decided.
pub fn tune_records() -> Vec<TuneRecord> {
    RECORDS.lock().clone()
}

/// One GEMM kernel's race before anything runs: its contestants (the templates' candidates that render, and the
/// library's where it takes the problem) and its tuning key.
struct Race<'a, D: Driver> {
    ctx: &'a Arc<D>,
    k: &'a KernelIr,
    v: &'a GemmView,
    cands: &'a [GpuGemm],
    lib: Option<&'a LibraryRun>,
    all: Vec<Contestant>,
    key: TuneKey,
}

impl<'a, D: Driver> Race<'a, D> {
    fn new(ctx: &'a Arc<D>, k: &'a KernelIr, contest: &'a Contest) -> Race<'a, D> {
        let (v, lib) = (&contest.v, contest.lib.as_ref());
        let cands = if lib.is_some() && ctx.library_alone() { &[] } else { &contest.cands[..] };
        let mut all: Vec<Contestant> = cands.iter().map(|&c| Contestant::Kernel(c)).collect();
        all.extend(lib.map(|l| Contestant::Library { pass: l.pass.is_some() }));
        let key = key(&**ctx, k, v, &all);
        Race { ctx, k, v, cands, lib, all, key }
    }

    /// Contestant `c` as the plan runs it.
    fn chosen(&self, c: Contestant) -> Result<Chosen, String> {
        match (c, self.lib) {
            (Contestant::Kernel(c), _) => Ok(Chosen::Kernel(c.render(self.k, self.v, D::FLAVOR)?)),
            (Contestant::Library { .. }, Some(l)) => {
                Ok(Chosen::Library { gemm: l.gemm.clone(), pass: l.render(&**self.ctx)? })
            }
            (Contestant::Library { .. }, None) => Err("the library won a race it was not in".into()),
        }
    }

    /// The choice made without racing, if there is one: a stored record's winner (never re-raced by its own mode or
    /// a lighter one), or the untuned kernel compiled ahead of time for this architecture (an imported bundle, an
    /// earlier run with tuning off: the deployer's choice, so a bundle's first request compiles nothing;
    /// `KILN_AUTOTUNE=full`, `kiln tune`, races anyway).
    fn settled(&self, store: &Store, mode: Mode) -> Option<Result<(Chosen, Option<TuneRecord>), String>> {
        if let Some(stored) = self.stored(store, mode) {
            return Some(stored);
        }
        if mode != Mode::Full
            && let Some(best) = best_scored(self.v, self.cands)
            && let Ok(g) = best.render(self.k, self.v, D::FLAVOR)
            && self.ctx.precompiled(&g.source)
        {
            return Some(Ok((Chosen::Kernel(g), None)));
        }
        None
    }

    /// A stored record's winner, where a record serves `mode`.
    fn stored(&self, store: &Store, mode: Mode) -> Option<Result<(Chosen, Option<TuneRecord>), String>> {
        let rec = store.get_record(&self.key).filter(|r| r.serves(mode))?;
        let c = self.all.iter().find(|c| c.name() == rec.winner)?;
        Some(self.chosen(*c).map(|c| (c, Some(rec))))
    }

    /// The contestants as the search ranks them. The library has no analytic model: it scores just under the best
    /// template, so it is always timed (a family of its own) but wins only when measurably faster, and
    /// `KILN_AUTOTUNE=off` keeps the template an ahead-of-time compile renders.
    fn scored(&self) -> Vec<Candidate<'_, Contestant>> {
        let best = self.cands.iter().map(|c| score(self.v, c)).fold(0.0, f64::max);
        self.all
            .iter()
            .map(|c| Candidate {
                config: c,
                name: c.name(),
                score: match c {
                    Contestant::Kernel(g) => score(self.v, g),
                    Contestant::Library { .. } => best * 0.99,
                },
                group: String::new(),
                family: match c {
                    Contestant::Kernel(GpuGemm { tile: GpuTile::Simt(_), .. }) => "simt".into(),
                    Contestant::Kernel(GpuGemm { tile: GpuTile::Mma(_), .. }) => "tensor cores".into(),
                    Contestant::Library { .. } => LIBRARY.into(),
                },
                shape: String::new(),
            })
            .collect()
    }
}

/// The race for a GEMM kernel (`decide`, where no choice was settled without one): its contestants ranked, the
/// best few compiled (or found compiled), verified and timed by `kiln_autotune::search` in `mode`, the record stored
/// in `store`.
fn race<D: Driver>(race: &Race<'_, D>, store: &Store, mode: Mode) -> Result<(Chosen, Option<TuneRecord>), String> {
    let (ctx, k, v, lib) = (race.ctx, race.k, race.v, race.lib);
    let (all, key) = (race.all.as_slice(), &race.key);
    let by_name = |name: &str| all.iter().find(|c| c.name() == name).copied();
    let chosen = |c: Contestant| race.chosen(c);
    let scored = race.scored();
    let exec = |e: BackendError| e.to_string();
    let mut host: Vec<HostBuffer> = crate::gemm_check::synthetic_inputs(k);
    // TF32 contestants multiply operands rounded to 10 mantissa bits: race on inputs that already are, so every
    // contestant (exact f32 or TF32) is checked against the evaluator at f32's tolerance (only the summation order
    // differs), and a wrong index still fails by orders of magnitude.
    if v.operands == DType::F32
        && all.iter().any(|c| matches!(c, Contestant::Kernel(GpuGemm { tile: GpuTile::Mma(_), .. })))
    {
        for h in &mut host {
            if let HostBuffer::F32(x) = h {
                *h = HostBuffer::F32(x.iter().map(|&x| crate::gemm_check::round_tf32(x)).collect());
            }
        }
    }
    // `Mode::Off` never runs a candidate: nothing to upload.
    let inputs = if mode == Mode::Off {
        Vec::new()
    } else {
        host.iter().map(|h| super::upload_mem(ctx, h)).collect::<Result<Vec<_>, _>>().map_err(exec)?
    };
    let out = ctx.alloc(k.output.dtype, k.output.len).map_err(exec)?;
    let mut params: Vec<u64> = inputs.iter().map(D::addr).collect();
    params.push(D::addr(&out));
    // Each contestant rendered, compiled and loaded (or prepared) once, for its verification and its timed runs.
    let built: RefCell<HashMap<Contestant, Built<D>>> = RefCell::default();
    let launch = |c: &Contestant| -> Result<Duration, String> {
        if !built.borrow().contains_key(c) {
            let b = match (c, lib) {
                (Contestant::Kernel(c), _) => {
                    let g = c.render(k, v, D::FLAVOR)?;
                    let code = ctx.compile(&[(g.source.as_str(), g.name.as_str())])?;
                    let f = Arc::new(ctx.load(&g, code.first().ok_or("no code compiled")?)?);
                    let ws = g.workspace.map(|w| super::workspace(ctx, w)).transpose().map_err(exec)?;
                    Built::Kernel(g, f, ws)
                }
                (Contestant::Library { .. }, Some(l)) => Built::Library(ctx.library(&l.gemm)?, built_pass(ctx, l)?),
                (Contestant::Library { .. }, None) => return Err("no library GEMM for this problem".into()),
            };
            built.borrow_mut().insert(*c, b);
        }
        let built = built.borrow();
        let t0 = Instant::now();
        match (built.get(c).ok_or("a contestant built just above")?, lib) {
            (Built::Kernel(g, f, ws), _) => {
                let mut params = params.clone();
                if let (Some(w), Some(m)) = (g.workspace, ws) {
                    params.extend(super::workspace_params::<D>(m, w));
                }
                // SAFETY: the kernel was rendered from `k`, whose parameters are its inputs and its output (a GEMM
                // template neither draws random numbers nor gathers), each uploaded or allocated here with the
                // kernel's lengths, then a split-K kernel's workspace, allocated for it with its counters zeroed
                // (each launch leaves them so).
                unsafe { ctx.launch(f, g.grid, g.block, &params) }?;
            }
            (Built::Library(l, pass), Some(run)) => {
                // SAFETY: the library's buffers are the kernel's inputs `LibGemm::of` (or `product_of`) named,
                // uploaded with the kernel's lengths, and the output (or the pass's product) allocated with its
                // length; the pass was rendered from `epilogue_pass` of this kernel (checked to take nothing but
                // its buffers): the kernel's inputs, the product, the output.
                unsafe { library_launch(&**ctx, &run.gemm, l, pass.as_ref(), &params) }?;
            }
            (Built::Library(..), None) => return Err("no library GEMM for this problem".into()),
        }
        ctx.read(&out, 0).map_err(exec)?; // waits for the device
        Ok(t0.elapsed())
    };
    // The evaluator's values, computed at the first verification and shared by every candidate.
    let reference = std::cell::OnceCell::new();
    let verify = |c: &Contestant| -> Result<(), String> {
        launch(c)?;
        let bytes = ctx.read(&out, k.output.len * k.output.dtype.size_of()).map_err(exec)?;
        let reference = reference.get_or_init(|| {
            let refs: Vec<&HostBuffer> = host.iter().collect();
            Reference::of(k, v.k, &refs)
        });
        reference.check_output(&super::from_bytes(k.output.dtype, &bytes, k.output.len))
    };
    let record = kiln_autotune::search(key, exact_dims(v), scored, mode, verify, launch)?;
    if let Err(e) = store.put_record(&record) {
        static SAID: std::sync::Once = std::sync::Once::new();
        SAID.call_once(|| eprintln!("kiln: could not write a {} GEMM tuning record: {e}", D::NAME));
    }
    let c = by_name(&record.winner).ok_or_else(|| format!("unknown winner {}", record.winner))?;
    if let Some(Built::Kernel(g, _, _)) = built.borrow_mut().remove(&c) {
        return Ok((Chosen::Kernel(g), Some(record)));
    }
    Ok((chosen(c)?, Some(record)))
}

/// The library's epilogue pass of `run` compiled and loaded, with the f32 product it reads allocated; `None` where
/// the library applies the epilogue itself.
fn built_pass<D: Driver>(ctx: &Arc<D>, run: &LibraryRun) -> Result<Option<BuiltPass<D>>, String> {
    let Some(kernel) = run.render(&**ctx)? else { return Ok(None) };
    let code = ctx.compile(&[(kernel.source.as_str(), kernel.name.as_str())])?;
    let function = ctx.load(&kernel, code.first().ok_or("no code compiled")?)?;
    let g = &run.gemm;
    let product = ctx.alloc(DType::F32, g.batch * g.m * g.n).map_err(|e| e.to_string())?;
    Ok(Some(BuiltPass { kernel, function, product }))
}

/// Queues the library's run of a GEMM kernel: `params` are the kernel's (its inputs' addresses, then its output's);
/// with a pass, the library writes its product to the pass's scratch and the pass reads it with the kernel's inputs.
///
/// # Safety
/// `params` are live memory holding the kernel's buffers at its lengths; `lib` was prepared for `gemm`, and `pass`'s
/// function loaded from the kernel's `epilogue_pass` with a product buffer of `gemm`'s `batch * m * n` f32.
unsafe fn library_launch<D: Driver>(
    ctx: &D,
    gemm: &LibGemm,
    lib: &D::Library,
    pass: Option<&BuiltPass<D>>,
    params: &[u64],
) -> Result<(), String> {
    let (&out, inputs) = params.split_last().ok_or("a library GEMM without an output")?;
    let input = |i: usize| inputs.get(i).copied().ok_or("a library GEMM's input is missing");
    let Some(BuiltPass { kernel, function, product }) = pass else {
        // SAFETY: the caller's contract: A, B, the bias and the output are the kernel's buffers.
        return unsafe { ctx.library_launch(lib, gemm.ptrs(input, out)?) };
    };
    let product = D::addr(product);
    // SAFETY: the caller's contract; the product holds the library's f32 output.
    unsafe { ctx.library_launch(lib, gemm.ptrs(input, product)?) }?;
    let p = crate::gpu_library::pass_params(params, product).ok_or("a library GEMM without an output")?;
    // SAFETY: the pass's parameters are the kernel's inputs, then the product (its last input), then the output.
    unsafe { ctx.launch(function, kernel.grid, kernel.block, &p) }
}

/// Runs GEMM kernel `k` once as the library's contestant of the race would (its GEMM with the epilogue, or its
/// product then the epilogue pass: `LibraryRun`) on `inputs` and returns its output and whether it ran a pass: for
/// the tests that force every contestant. Errors when the library cannot describe `k`'s operands, or there is no
/// library.
pub(crate) fn run_library<D: Driver>(
    ctx: &Arc<D>,
    k: &KernelIr,
    inputs: &[&HostBuffer],
) -> Result<(HostBuffer, bool), String> {
    let v = GemmView::of(k).ok_or("not a GEMM")?;
    let run = LibraryRun::of(k, &v).ok_or("not a GEMM a library takes")?;
    check_inputs(k, inputs)?;
    let l = ctx.library(&run.gemm)?;
    let pass = built_pass(ctx, &run)?;
    let exec = |e: BackendError| e.to_string();
    let dev = inputs.iter().map(|h| super::upload_mem(ctx, h)).collect::<Result<Vec<_>, _>>().map_err(exec)?;
    let out = ctx.alloc(k.output.dtype, k.output.len).map_err(exec)?;
    let mut params: Vec<u64> = dev.iter().map(D::addr).collect();
    params.push(D::addr(&out));
    // SAFETY: the kernel's inputs uploaded above (each at least the kernel's length, checked), its output allocated
    // with its length; the library prepared and the pass built for this run.
    unsafe { library_launch(&**ctx, &run.gemm, &l, pass.as_ref(), &params) }?;
    let bytes = ctx.read(&out, k.output.len * k.output.dtype.size_of()).map_err(exec)?;
    Ok((super::from_bytes(k.output.dtype, &bytes, k.output.len), pass.is_some()))
}

/// That `inputs` are `k`'s: as many, each of its dtype and at least its length.
fn check_inputs(k: &KernelIr, inputs: &[&HostBuffer]) -> Result<(), String> {
    if inputs.len() != k.inputs.len() {
        return Err(format!("{} inputs given, the kernel reads {}", inputs.len(), k.inputs.len()));
    }
    for (h, p) in inputs.iter().zip(&k.inputs) {
        if h.dtype() != p.dtype || h.len() < p.len {
            return Err(format!("an input is {}[{}], the kernel wants {}[{}]", h.dtype(), h.len(), p.dtype, p.len));
        }
    }
    Ok(())
}

/// Renders GEMM kernel `k` as candidate `c`, runs it once on `inputs` (checked against the kernel's buffers) and
/// returns its output: for the tests that force every candidate. Errors when `k` is not a GEMM or `c` declines it.
pub(crate) fn run_with<D: Driver>(
    ctx: &Arc<D>,
    k: &KernelIr,
    c: GpuGemm,
    inputs: &[&HostBuffer],
) -> Result<HostBuffer, String> {
    let v = GemmView::of(k).ok_or("not a GEMM")?;
    check_inputs(k, inputs)?;
    let g = c.render(k, &v, D::FLAVOR)?;
    let code = ctx.compile(&[(g.source.as_str(), g.name.as_str())])?;
    let f = ctx.load(&g, code.first().ok_or("no code compiled")?)?;
    let exec = |e: BackendError| e.to_string();
    let dev = inputs.iter().map(|h| super::upload_mem(ctx, h)).collect::<Result<Vec<_>, _>>().map_err(exec)?;
    let out = ctx.alloc(k.output.dtype, k.output.len).map_err(exec)?;
    let mut params: Vec<u64> = dev.iter().map(D::addr).collect();
    params.push(D::addr(&out));
    let ws = g.workspace.map(|w| super::workspace(ctx, w)).transpose().map_err(exec)?;
    if let (Some(w), Some(m)) = (g.workspace, &ws) {
        params.extend(super::workspace_params::<D>(m, w));
    }
    // SAFETY: the kernel was rendered from `k`, whose parameters are its inputs (uploaded above, each at least the
    // kernel's length, checked), its output (allocated with its length) and, split K, its workspace (allocated for
    // it, counters zeroed); a GEMM template neither draws random numbers nor gathers.
    unsafe { ctx.launch(&f, g.grid, g.block, &params) }?;
    let bytes = ctx.read(&out, k.output.len * k.output.dtype.size_of()).map_err(exec)?;
    Ok(super::from_bytes(k.output.dtype, &bytes, k.output.len))
}
