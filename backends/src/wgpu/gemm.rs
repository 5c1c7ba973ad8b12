//! GEMM kernels on wgpu: which kernels run as the tiled WGSL template (`kiln_jit::render::wgsl::render_gemm`), in
//! which tile, and how that choice is made and remembered. Also the entry point that forces a tile
//! ([`run_gemm_with`], for the tests that check every candidate).
//!
//! The choice: a record in `kiln_autotune::Store::global()` under this adapter's key, else
//! `kiln_autotune::search` over the legal tiles (`tiles.rs`) in the `KILN_AUTOTUNE` mode: the
//! best-scored few are verified against `kernel::eval::run_at` on sampled positions (a wrong tile can never win),
//! then timed with device synchronization, and the record is stored. The tuning problem is the kernel itself, on
//! synthetic data, so the key holds its exact dims (not buckets) and a checksum of its epilogue code.
//!
//! Not done here: rendering (kiln_jit), scheduling, or the generic kernels GEMMs fall back to when the template
//! cannot take them (a grid past the dispatch limits) or they are too small to gain from tiling.

use super::tiles::{self, GemmTile, TileLimits};
use super::{Ctx, Pipeline};
use kiln_autotune::{DeviceFingerprint, Mode, Store, TuneKey, TuneRecord, checksum_of};
use kiln_jit::kernel::KernelIr;
use kiln_jit::kernel::gemm::GemmView;
use kiln_jit::render::wgsl::{self, WgslKernel};
use kiln_jit::{DType, HostBuffer};
use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant};

/// GEMMs smaller than this (M*N*K) stay generic kernels: a workgroup tile would be mostly padding.
const MIN_VOLUME: usize = 4096;

/// Whether GEMMs run as the tiled template: `KILN_WGSL_GEMM=generic` (read once) keeps them generic kernels, to
/// bisect and to measure the template against the generic path.
pub(crate) fn tiled_enabled() -> bool {
    static ON: LazyLock<bool> = LazyLock::new(|| std::env::var("KILN_WGSL_GEMM").map_or(true, |v| v != "generic"));
    *ON
}

impl Ctx {
    pub(crate) fn tile_limits(&self) -> TileLimits {
        let l = &self.limits;
        TileLimits {
            max_invocations: l.max_compute_invocations_per_workgroup,
            max_size_x: l.max_compute_workgroup_size_x,
            max_shared_bytes: l.max_compute_workgroup_storage_size,
        }
    }

    /// What tuning results measured on this adapter are valid for: its backend, name and driver.
    pub(crate) fn fingerprint(&self) -> DeviceFingerprint {
        let i = &self.info;
        DeviceFingerprint {
            arch: format!("wgpu-{:?}", i.backend).to_lowercase(),
            model: i.name.clone(),
            features: vec![format!("driver={}", i.driver), format!("driver-info={}", i.driver_info)],
        }
    }
}

/// The tiled form of `k` when it is a GEMM worth tiling, in the tile the store or a search picks, with the tuning
/// record that picked it (for `KILN_DUMP`); `None` to render it as a generic kernel.
pub(crate) fn gemm_kernel(ctx: &Arc<Ctx>, k: &KernelIr) -> Option<(WgslKernel, TuneRecord)> {
    // A kernel that gathers is the generic renderer's, which checks its indices.
    if !tiled_enabled() || k.can_fault() {
        return None;
    }
    // The WGSL template reads and writes f32 (a wgpu plan keeps bf16 casts out of its GEMMs: no `bf16_gemm`).
    let view = GemmView::of(k).filter(|v| v.operands == kiln_jit::DType::F32 && v.out == kiln_jit::DType::F32)?;
    if view.batch_count().max(1) * view.m * view.n * view.k < MIN_VOLUME || wgsl::check(k).is_err() {
        return None;
    }
    // Tiles whose grid passes the dispatch limits (the template's only refusal) are not candidates; with none
    // left, the generic kernel takes the GEMM.
    let lim = ctx.tile_limits();
    let cands: Vec<GemmTile> =
        tiles::candidates(&lim).into_iter().filter(|t| wgsl::render_gemm(k, &view, *t).is_ok()).collect();
    if cands.is_empty() {
        return None;
    }
    let (tile, record) = match choose(ctx, k, &view, &cands, Store::global(), crate::gemm_check::env_mode()) {
        Ok(x) => x,
        Err(e) => {
            // No tile verified (or the search could not run): the generic kernel is correct and slower; a graph
            // that ran before the template existed must still run. Said once, so the cause is not lost.
            static SAID: std::sync::Once = std::sync::Once::new();
            SAID.call_once(|| eprintln!("kiln: wgpu GEMM {} stays a generic kernel: {e}", k.name));
            return None;
        }
    };
    wgsl::render_gemm(k, &view, tile).ok().map(|w| (w, record))
}

fn key(ctx: &Ctx, k: &KernelIr, v: &GemmView, cands: &[GemmTile]) -> TuneKey {
    let dims = crate::gemm_check::exact_dims(v);
    TuneKey {
        op: "wgsl-gemm".into(),
        dims,
        dtypes: "f32,f32->f32".into(),
        layout: {
            let (a, b) = crate::gemm_check::operand_layouts(v);
            format!("{a},{b}")
        },
        epilogue: format!("{:016x}", checksum_of([format!("{:?} -> {}", k.outer, k.result)])),
        device: ctx.fingerprint().id(),
        candidates: checksum_of(cands.iter().map(GemmTile::name)),
    }
}

/// The tile for `k` among `cands`: a stored record's winner (never re-raced by its own mode or a lighter one), else
/// a search recorded in `store`.
fn choose(
    ctx: &Arc<Ctx>,
    k: &KernelIr,
    v: &GemmView,
    cands: &[GemmTile],
    store: &Store,
    mode: Mode,
) -> Result<(GemmTile, TuneRecord), String> {
    let key = key(ctx, k, v, cands);
    if let Some(rec) = store.get_record(&key).filter(|r| r.serves(mode))
        && let Some(t) = GemmTile::parse(&rec.winner).filter(|t| cands.contains(t))
    {
        *LAST_RECORD.lock() = Some(rec.clone());
        return Ok((t, rec));
    }
    let scored: Vec<kiln_autotune::Candidate<'_, GemmTile>> = cands
        .iter()
        .map(|t| kiln_autotune::Candidate {
            config: t,
            name: t.name(),
            score: tiles::score(v, t),
            group: String::new(),
            family: format!("{}x{} workgroup tile", t.tm, t.tn),
            shape: String::new(),
        })
        .collect();
    let host: Vec<HostBuffer> = crate::gemm_check::synthetic_inputs(k);
    let exec = |e: crate::BackendError| e.to_string();
    // `Mode::Off` never runs a candidate: nothing to upload.
    let dev = if mode == Mode::Off { Vec::new() } else { upload_all(ctx, &host.iter().collect::<Vec<_>>())? };
    let out = ctx.alloc(DType::F32, k.output.len).map_err(exec)?;
    // Each candidate's pipeline and grid, built once for its verification and timed runs.
    let built: RefCell<HashMap<GemmTile, Built>> = RefCell::default();
    let launch = |t: &GemmTile| -> Result<Duration, String> {
        let existing = built.borrow().get(t).cloned();
        let (p, groups) = match existing {
            Some(x) => x,
            None => {
                let w = wgsl::render_gemm(k, v, *t)?;
                let x = (ctx.pipeline(&w)?, w.groups);
                built.borrow_mut().insert(*t, x.clone());
                x
            }
        };
        let mut bufs: Vec<&wgpu::Buffer> = dev.iter().map(|b| b.raw()).collect();
        bufs.push(out.raw());
        let t0 = Instant::now();
        dispatch_and_wait(ctx, &p, &bufs, groups)?;
        Ok(t0.elapsed())
    };
    // The evaluator's values, computed at the first verification and shared by every candidate.
    let reference = std::cell::OnceCell::new();
    let verify = |t: &GemmTile| -> Result<(), String> {
        launch(t)?;
        let bytes = ctx.read_words(out.raw(), k.output.len).map_err(exec)?;
        let got: Vec<f32> = bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
        let reference = reference.get_or_init(|| {
            let refs: Vec<&HostBuffer> = host.iter().collect();
            crate::gemm_check::Reference::of(k, v.k, &refs)
        });
        reference.check(&got, 0.0)
    };
    let record = kiln_autotune::search(&key, crate::gemm_check::exact_dims(v), scored, mode, verify, launch)?;
    if let Err(e) = store.put_record(&record) {
        static SAID: std::sync::Once = std::sync::Once::new();
        SAID.call_once(|| eprintln!("kiln: could not write a wgpu GEMM tuning record: {e}"));
    }
    let t = GemmTile::parse(&record.winner).ok_or_else(|| format!("unparsable winner {}", record.winner))?;
    *LAST_RECORD.lock() = Some(record.clone());
    Ok((t, record))
}

static LAST_RECORD: parking_lot::Mutex<Option<TuneRecord>> = parking_lot::Mutex::new(None);

/// Takes the tuning record (searched or reused from the store) of the GEMM tile chosen last, since the previous
/// call: for reports and for the tests that check what the search decided.
pub fn take_last_tune_record() -> Option<TuneRecord> {
    LAST_RECORD.lock().take()
}

/// This process's adapter as the tuning keys see it.
pub fn fingerprint() -> Result<DeviceFingerprint, String> {
    Ok(super::backend().map_err(|e| e.to_string())?.ctx.fingerprint())
}

/// Device copies of `host`.
fn upload_all(ctx: &Arc<Ctx>, host: &[&HostBuffer]) -> Result<Vec<super::DeviceBuffer>, String> {
    host.iter()
        .map(|h| {
            let b = ctx.alloc(h.dtype(), h.len()).map_err(|e| e.to_string())?;
            let words = super::to_words(h).map_err(|e| e.to_string())?;
            if !words.is_empty() {
                ctx.queue.write_buffer(b.raw(), 0, &words);
            }
            Ok(b)
        })
        .collect()
}

/// A candidate's pipeline and workgroup grid.
type Built = (Arc<Pipeline>, (u32, u32));

/// Records one dispatch, submits it and waits for the device.
fn dispatch_and_wait(ctx: &Ctx, p: &Pipeline, bufs: &[&wgpu::Buffer], groups: (u32, u32)) -> Result<(), String> {
    let mut enc = ctx.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("kiln gemm") });
    {
        let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor { label: None, timestamp_writes: None });
        ctx.dispatch(&mut pass, p, bufs, groups);
    }
    ctx.queue.submit([enc.finish()]);
    ctx.device
        .poll(wgpu::PollType::Wait { submission_index: None, timeout: None })
        .map(|_| ())
        .map_err(|e| format!("waiting for the device: {e}"))
}

/// The tiles legal on this process's adapter, in the search's order.
pub fn gemm_candidates() -> Result<Vec<GemmTile>, String> {
    let b = super::backend().map_err(|e| e.to_string())?;
    Ok(tiles::candidates(&b.ctx.tile_limits()))
}

/// Renders GEMM kernel `k` with tile `tile`, runs it once on `inputs` (checked against the kernel's buffers) and
/// returns the output. Errors when there is no adapter, `k` is not a GEMM, or the tile is illegal here.
pub fn run_gemm_with(k: &KernelIr, tile: GemmTile, inputs: &[&HostBuffer]) -> Result<HostBuffer, String> {
    let b = super::backend().map_err(|e| e.to_string())?;
    let ctx = &b.ctx;
    let _turn = ctx.exclusive();
    let view = GemmView::of(k).ok_or("not a GEMM")?;
    if !tiles::legal(&tile, &ctx.tile_limits()) {
        return Err(format!("tile {} is not legal on this adapter", tile.name()));
    }
    if inputs.len() != k.inputs.len() {
        return Err(format!("{} inputs given, the kernel reads {}", inputs.len(), k.inputs.len()));
    }
    for (h, p) in inputs.iter().zip(&k.inputs) {
        if h.dtype() != p.dtype || h.len() < p.len {
            return Err(format!("an input is {}[{}], the kernel wants {}[{}]", h.dtype(), h.len(), p.dtype, p.len));
        }
    }
    let w = wgsl::render_gemm(k, &view, tile)?;
    let p = ctx.pipeline(&w)?;
    let dev = upload_all(ctx, inputs)?;
    let out = ctx.alloc(k.output.dtype, k.output.len).map_err(|e| e.to_string())?;
    let mut bufs: Vec<&wgpu::Buffer> = dev.iter().map(|d| d.raw()).collect();
    bufs.push(out.raw());
    dispatch_and_wait(ctx, &p, &bufs, w.groups)?;
    let bytes = ctx.read_words(out.raw(), k.output.len).map_err(|e| e.to_string())?;
    Ok(super::from_words(k.output.dtype, &bytes, k.output.len))
}
