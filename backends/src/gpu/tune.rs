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
//! The tuning problem is the kernel itself on synthetic data, so the key holds its exact dims and a checksum of its
//! epilogue code. Not done here: rendering (`kiln_jit::render::cuda`), or a library candidate (cuBLASLt).

use super::Driver;
use crate::BackendError;
use crate::gemm_check::{Reference, env_mode, exact_dims, operand_layouts};
use crate::gpu_gemm::{GpuGemm, GpuTile, best_scored, renderable, score};
use kiln_autotune::{Candidate, DeviceFingerprint, Mode, Store, TuneKey, TuneRecord, checksum_of};
use kiln_jit::HostBuffer;
use kiln_jit::kernel::KernelIr;
use kiln_jit::kernel::gemm::GemmView;
use kiln_jit::render::cuda::GpuKernel;
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

fn key<D: Driver>(ctx: &D, k: &KernelIr, v: &GemmView, cands: &[GpuGemm]) -> TuneKey {
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
        candidates: checksum_of(cands.iter().map(GpuGemm::name)),
    }
}

/// GEMM kernel `k` as the device runs it: the stored or searched winner among the candidates that render, with the
/// record that chose it (none for a kernel compiled ahead of time and taken as it is); `None` when `k` is no GEMM
/// the templates take (the caller renders it as `gpu_cache` says).
pub(crate) fn gemm_kernel<D: Driver>(
    ctx: &Arc<D>,
    k: &KernelIr,
) -> Option<Result<(GpuKernel, Option<TuneRecord>), String>> {
    let v = GemmView::of(k)?;
    let cands = renderable(D::FLAVOR, ctx.arch(), k, &v);
    if cands.is_empty() {
        return None;
    }
    let chosen = choose(ctx, k, &v, &cands, Store::global(), env_mode());
    if let Ok((_, Some(record))) = &chosen {
        RECORDS.lock().push(record.clone());
    }
    Some(chosen)
}

/// A candidate's kernel, its loaded function and its workspace (a split-K GEMM's).
type Built<D> = (GpuKernel, Arc<<D as Driver>::Function>, Option<<D as Driver>::Mem>);

static RECORDS: parking_lot::Mutex<Vec<TuneRecord>> = parking_lot::Mutex::new(Vec::new());

/// Every GEMM tuning record the GPU devices searched or reused in this process, in order: for reports and for the
/// tests that check what the race decided.
pub fn tune_records() -> Vec<TuneRecord> {
    RECORDS.lock().clone()
}

/// The kernel for `k` among `cands`: a stored record's winner (never re-raced by its own mode or a lighter one), else
/// a search recorded in `store`.
fn choose<D: Driver>(
    ctx: &Arc<D>,
    k: &KernelIr,
    v: &GemmView,
    cands: &[GpuGemm],
    store: &Store,
    mode: Mode,
) -> Result<(GpuKernel, Option<TuneRecord>), String> {
    let key = key(&**ctx, k, v, cands);
    let by_name = |name: &str| cands.iter().find(|c| c.name() == name).copied();
    if let Some(rec) = store.get_record(&key).filter(|r| r.serves(mode))
        && let Some(c) = by_name(&rec.winner)
    {
        return Ok((c.render(k, v, D::FLAVOR)?, Some(rec)));
    }
    // The untuned kernel compiled ahead of time for this architecture (an imported bundle, an earlier run with
    // tuning off) is the deployer's choice: taken without a race, so a bundle's first request compiles nothing.
    // `KILN_AUTOTUNE=full` (`kiln tune`) races anyway.
    if mode != Mode::Full
        && let Some(best) = best_scored(v, cands)
        && let Ok(g) = best.render(k, v, D::FLAVOR)
        && ctx.precompiled(&g.source)
    {
        return Ok((g, None));
    }
    let scored: Vec<Candidate<'_, GpuGemm>> = cands
        .iter()
        .map(|c| Candidate {
            config: c,
            name: c.name(),
            score: score(v, c),
            group: String::new(),
            family: match c.tile {
                GpuTile::Simt(_) => "simt".into(),
                GpuTile::Mma(_) => "tensor cores".into(),
            },
            shape: String::new(),
        })
        .collect();
    let exec = |e: BackendError| e.to_string();
    let host: Vec<HostBuffer> = crate::gemm_check::synthetic_inputs(k);
    // `Mode::Off` never runs a candidate: nothing to upload.
    let inputs = if mode == Mode::Off {
        Vec::new()
    } else {
        host.iter().map(|h| super::upload_mem(ctx, h)).collect::<Result<Vec<_>, _>>().map_err(exec)?
    };
    let out = ctx.alloc(k.output.dtype, k.output.len).map_err(exec)?;
    let mut params: Vec<u64> = inputs.iter().map(D::addr).collect();
    params.push(D::addr(&out));
    // Each candidate rendered, compiled and loaded once, for its verification and its timed runs.
    let built: RefCell<HashMap<GpuGemm, Built<D>>> = RefCell::default();
    let launch = |c: &GpuGemm| -> Result<Duration, String> {
        if !built.borrow().contains_key(c) {
            let g = c.render(k, v, D::FLAVOR)?;
            let code = ctx.compile(&[(g.source.as_str(), g.name.as_str())])?;
            let f = Arc::new(ctx.load(&g, code.first().ok_or("no code compiled")?)?);
            let ws = g.workspace.map(|w| super::workspace(ctx, w)).transpose().map_err(exec)?;
            built.borrow_mut().insert(*c, (g, f, ws));
        }
        let built = built.borrow();
        let (g, f, ws) = built.get(c).ok_or("a candidate built just above")?;
        let mut params = params.clone();
        if let (Some(w), Some(m)) = (g.workspace, ws) {
            params.extend(super::workspace_params::<D>(m, w));
        }
        let t0 = Instant::now();
        // SAFETY: the kernel was rendered from `k`, whose parameters are its inputs and its output (a GEMM template
        // neither draws random numbers nor gathers), each uploaded or allocated here with the kernel's lengths,
        // then a split-K kernel's workspace, allocated for it with its counters zeroed (each launch leaves them so).
        unsafe { ctx.launch(f, g.grid, g.block, &params) }?;
        ctx.read(&out, 0).map_err(exec)?; // waits for the device
        Ok(t0.elapsed())
    };
    // The evaluator's values, computed at the first verification and shared by every candidate.
    let reference = std::cell::OnceCell::new();
    let verify = |c: &GpuGemm| -> Result<(), String> {
        launch(c)?;
        let bytes = ctx.read(&out, k.output.len * k.output.dtype.size_of()).map_err(exec)?;
        let reference = reference.get_or_init(|| {
            let refs: Vec<&HostBuffer> = host.iter().collect();
            Reference::of(k, v.k, &refs)
        });
        reference.check_output(&super::from_bytes(k.output.dtype, &bytes, k.output.len))
    };
    let record = kiln_autotune::search(&key, exact_dims(v), scored, mode, verify, launch)?;
    if let Err(e) = store.put_record(&record) {
        static SAID: std::sync::Once = std::sync::Once::new();
        SAID.call_once(|| eprintln!("kiln: could not write a {} GEMM tuning record: {e}", D::NAME));
    }
    let c = by_name(&record.winner).ok_or_else(|| format!("unknown winner {}", record.winner))?;
    if let Some((g, _, _)) = built.borrow_mut().remove(&c) {
        return Ok((g, Some(record)));
    }
    Ok((c.render(k, v, D::FLAVOR)?, Some(record)))
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
    if inputs.len() != k.inputs.len() {
        return Err(format!("{} inputs given, the kernel reads {}", inputs.len(), k.inputs.len()));
    }
    for (h, p) in inputs.iter().zip(&k.inputs) {
        if h.dtype() != p.dtype || h.len() < p.len {
            return Err(format!("an input is {}[{}], the kernel wants {}[{}]", h.dtype(), h.len(), p.dtype, p.len));
        }
    }
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
