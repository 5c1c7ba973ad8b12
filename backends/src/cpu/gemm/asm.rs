//! x86-64 AVX2 + FMA GEMM micro-kernels, generated at run time.
//!
//! Why generate machine code: Cranelift 0.135 emits only 128-bit SIMD on x86-64, half the FMA width of an AVX2 core,
//! so no Cranelift GEMM can pass ~50% of peak. `dynasmrt` assembles straight from Rust with run-time register
//! numbers and displacements (a tile shape, a stride and an epilogue are just arguments), needs no toolchain at run
//! time, and maps the code W^X. A generated 6x16 kernel reaches the measured 2-core FMA peak of the development
//! machine, which is what made generating code (rather than a better Cranelift kernel) worth it.
//!
//! This is the 8-lane family; `asm512` generates the 16-lane AVX-512 one with the same contract, and the tuner
//! races both where the CPU has AVX-512 (on a core that splits 512-bit FMAs in two halves, as AMD Zen 4 does, AVX2
//! often keeps winning; on one with two full 512-bit FMA units, AVX-512 does). The AVX2 family is the one every
//! x86-64 host kiln generates code for has.
//!
//! One kernel computes an `mr x (8 * nv)` tile of C = A * B over `k` steps:
//! `extern "sysv64" fn(a, b, c, k, ep)`. A is read by broadcasts at `a + k*a_ks + r*a_rs` (any layout: packed
//! panels or the caller's matrix), B by 8-lane loads at `b + k*b_ks + 32*v`. Then, by `Mode`, C is stored,
//! accumulated into, and/or finished by the epilogue program, applied in registers before the store. The last
//! vector of a row may be masked (`vmaskmovps`) for a ragged N; B is never read past a panel's zero padding.
//!
//! Registers: accumulators are ymm0.. (mr*nv of them), then nv B registers (a 1-row kernel uses memory-operand FMAs
//! instead), then one broadcast register; the epilogue allocates its temporaries from whatever the accumulators
//! leave free. Scratch GPRs are rax, r9, r10, r11 (caller-saved in SysV, which is pinned: Win64 would need
//! xmm6-15 saved); in the K loop r9, r10 and r11 walk the prefetch of the C tile and the epilogue's operands (`k_loop`). Every kernel ends with
//! `vzeroupper` (the host Rust is SSE code). Constants an epilogue reads (`exp`'s polynomial) sit after the kernel's
//! `ret` as 32-byte vectors, addressed relative to the instruction pointer (`ConstPool`), so the code stays position
//! independent.
//!
//! The epilogue is a register program (`program.rs`), emitted by `program_asm.rs` at either width.
//!
//! Pitfall (dynasm 5.1): `vbroadcastss ymm, [mem]` silently encodes the 128-bit form; `vpbroadcastd` is used.

// `dynasm!` converts every run-time register number with `.into()`, a no-op for the `u8`s used here.
#![allow(clippy::useless_conversion)]

use super::program::{EpInst, EpProgram};
use super::program_asm::{ConstPool, Ymm, emit_program};
use crate::cpu::isa::Isa;
use dynasmrt::x64::Assembler;
use dynasmrt::{AssemblyOffset, DynasmApi, DynasmLabelApi, ExecutableBuffer, dynasm};

/// The generator's revision, part of every cached kernel set's key (`kernel_set` in `mod.rs`): bump it when a change
/// here alters the code emitted for an unchanged spec and program, so that code cached on disk by an earlier build
/// of the same kiln version is not mapped in place of the new code (the key's other parts, the specs and the
/// program, would not change). 2: a value read twice by one instruction is released once (a kernel cached before
/// that fix could compute a wrong epilogue); constants in a pool after the code. 3: the bf16 kernels (`amx`) load
/// each tile just before its first product. 4: the K loop prefetches the epilogue's per-element operands.
pub const REVISION: u32 = 4;

/// `a, b, c, k, ep`: see the module doc. `ep` points at `[mask, uniforms, operand 0, operand 1, ...]`.
pub type MicroFn = unsafe extern "sysv64" fn(*const f32, *const f32, *mut f32, usize, *const *const u8);

/// What a kernel does with the finished accumulators.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Mode {
    /// First K block of several: store.
    First,
    /// A middle K block: C += acc.
    Middle,
    /// The last K block: C + acc, then the epilogue, then store.
    Last,
    /// The only K block: the epilogue, then store.
    Single,
}

/// The shape and addressing of one micro-kernel.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct MicroSpec {
    /// The family the kernel is written for: this file's AVX2 kernels or `asm512`'s AVX-512 ones.
    pub isa: Isa,
    pub mr: usize,
    pub nv: usize,
    /// Byte strides of A along k and along rows.
    pub a_ks: i32,
    pub a_rs: i32,
    /// Byte stride of B along k (its vectors are contiguous).
    pub b_ks: i32,
    /// Byte stride of C rows.
    pub ldc: i32,
    pub mode: Mode,
    /// The last vector of each row is masked (ragged N): the mask is `ep[0]`.
    pub masked: bool,
    /// K-loop unroll (a power of two).
    pub unroll: usize,
    /// Prefetch B this many k-steps ahead (0: none). For B read in place from memory (skinny GEMMs), where a tile
    /// sweep interleaves many rows and the hardware prefetchers lose track.
    pub prefetch: i32,
}

/// Accumulator register of tile element (r, v).
fn acc(nv: usize, r: usize, v: usize) -> u8 {
    (r * nv + v) as u8
}

/// Emits one kernel at the assembler's current offset and returns that offset.
pub fn emit(ops: &mut Assembler, s: &MicroSpec, ep: &EpProgram) -> Result<AssemblyOffset, String> {
    if s.isa != Isa::Avx2 || !super::config::fits(Isa::Avx2, s.mr, s.nv) || !s.unroll.is_power_of_two() {
        return Err(format!("tile {}x{} (unroll {}) does not fit 16 registers", s.mr, 8 * s.nv, s.unroll));
    }
    let with_ep = matches!(s.mode, Mode::Last | Mode::Single);
    let epi = if with_ep { ep.clone() } else { EpProgram::identity() };
    let nacc = s.mr * s.nv;
    let free_regs: Vec<u8> = (nacc as u8..16).filter(|&r| !(s.masked && r == 15)).collect();
    if epi.temps_needed() > free_regs.len() {
        return Err(format!("epilogue needs {} registers, {} free", epi.temps_needed(), free_regs.len()));
    }
    let start = ops.offset();
    let b0 = nacc as u8;
    let areg = 15u8;
    let (mr, nv) = (s.mr, s.nv);
    // Prologue: zero the accumulators (the K loop prefetches the C tile, see `k_loop`).
    for i in 0..nacc as u8 {
        dynasm!(ops ; .arch x64 ; vxorps Ry(i), Ry(i), Ry(i));
    }
    let step = |ops: &mut Assembler, u: usize| {
        let bk = u as i32 * s.b_ks;
        let ak = u as i32 * s.a_ks;
        if s.prefetch > 0 {
            for line in 0..(nv * 32).div_ceil(64) {
                let d = bk + s.prefetch * s.b_ks + 64 * line as i32;
                dynasm!(ops ; .arch x64 ; prefetcht0 [rsi + d]);
            }
        }
        if mr == 1 {
            dynasm!(ops ; .arch x64 ; vpbroadcastd Ry(areg), DWORD [rdi + ak]);
            for v in 0..nv {
                let d = bk + 32 * v as i32;
                let a = acc(nv, 0, v);
                dynasm!(ops ; .arch x64 ; vfmadd231ps Ry(a), Ry(areg), [rsi + d]);
            }
            return;
        }
        for v in 0..nv {
            let d = bk + 32 * v as i32;
            let br = b0 + v as u8;
            dynasm!(ops ; .arch x64 ; vmovups Ry(br), [rsi + d]);
        }
        for r in 0..mr {
            let d = ak + r as i32 * s.a_rs;
            dynasm!(ops ; .arch x64 ; vpbroadcastd Ry(areg), DWORD [rdi + d]);
            for v in 0..nv {
                let a = acc(nv, r, v);
                let br = b0 + v as u8;
                dynasm!(ops ; .arch x64 ; vfmadd231ps Ry(a), Ry(br), Ry(areg));
            }
        }
    };
    k_loop(ops, s, &epi, &step);
    // Finish: mask, C, epilogue, store.
    let mreg = 15u8;
    if s.masked {
        dynasm!(ops ; .arch x64 ; mov r9, QWORD [r8] ; vmovups Ry(mreg), [r9]);
    }
    let load_c = matches!(s.mode, Mode::Middle | Mode::Last);
    let last_uses = epi.last_uses();
    let mut consts = ConstPool::default();
    for r in 0..mr {
        for v in 0..nv {
            let a = acc(nv, r, v);
            let cd = r as i32 * s.ldc + 32 * v as i32;
            let masked = s.masked && v == nv - 1;
            if load_c {
                let t = free_regs[0];
                if masked {
                    dynasm!(ops ; .arch x64 ; vmaskmovps Ry(t), Ry(mreg), [rdx + cd] ; vaddps Ry(a), Ry(a), Ry(t));
                } else {
                    dynasm!(ops ; .arch x64 ; vaddps Ry(a), Ry(a), [rdx + cd]);
                }
            }
            let res = emit_program(&Ymm, ops, &epi, &last_uses, &free_regs, (a, r, v), masked, &mut consts)?;
            if res != a {
                dynasm!(ops ; .arch x64 ; vmovaps Ry(a), Ry(res));
            }
            if masked {
                dynasm!(ops ; .arch x64 ; vmaskmovps [rdx + cd], Ry(mreg), Ry(a));
            } else {
                dynasm!(ops ; .arch x64 ; vmovups [rdx + cd], Ry(a));
            }
        }
    }
    dynasm!(ops ; .arch x64 ; vzeroupper ; ret);
    consts.emit(ops);
    Ok(start)
}

/// The K loop every micro-kernel runs (either family): `step(ops, u)` emits k-step `u` of an unrolled iteration,
/// addressing A and B at `u` steps past rdi and rsi; the loop runs `k / unroll` such iterations (rcx = k), then the
/// remainder one step at a time. Uses rax, r9, and r10 and r11 for the C tile's prefetch.
///
/// The C tile (rdx, stored or accumulated into after the loop) is prefetched one row per iteration, its rows in
/// turn (r11 walks them, r10 marks the end, then r11 starts over: rows already in L1 cost a prefetch that hits).
/// So is the same row of each f32 operand the epilogue `ep` reads per element with C's row stride (a training
/// step's saved activations, which the GELU's gradient reads two of): its tile is at the same offset from its
/// pointer in the epilogue table as C's row from rdx, so r9 = that pointer + (r11 - rdx). Those operands, like C,
/// were written long before and have left the caches; read only by the epilogue, after the loop, each line was a
/// miss the tile waited for.
/// Why spread: a 14 x 32 tile is 28 lines, more than the core's line fill buffers (16 on the Xeon guest). All 28
/// prefetched at the kernel's start measured slower than no prefetch at all with C in cache, and a GEMM writing a C
/// that had left the caches (a training step's outputs) ran ~15 % slower than with C in cache at K = 128; spread,
/// both are faster (`KILN_PROFILE=1 train_gpt`: its K = 128 products 15-25 % a launch).
pub(crate) fn k_loop(ops: &mut Assembler, s: &MicroSpec, ep: &EpProgram, step: &dyn Fn(&mut Assembler, usize)) {
    let u = s.unroll;
    let (main, main_end, rem, done) =
        (ops.new_dynamic_label(), ops.new_dynamic_label(), ops.new_dynamic_label(), ops.new_dynamic_label());
    let (a_adv, b_adv) = (u as i32 * s.a_ks, u as i32 * s.b_ks);
    let shift = u.trailing_zeros() as i8;
    let (tile_end, ldc) = (s.mr as i32 * s.ldc, s.ldc);
    // A row of the tile: `nv` vectors of 32 or 64 bytes.
    let row_lines = (s.nv * s.isa.lanes() * 4).div_ceil(64) as i32;
    // Table slots of the f32 per-element operands laid out as C (once each).
    let mut operands: Vec<i32> = Vec::new();
    for inst in &ep.insts {
        if let EpInst::Mat { op, ld, bf16: false } = *inst {
            let slot = 8 * (2 + op as i32);
            if ld == ldc && !operands.contains(&slot) {
                operands.push(slot);
            }
        }
    }
    let prefetch_c_row = |ops: &mut Assembler| {
        for line in 0..row_lines {
            dynasm!(ops ; .arch x64 ; prefetcht0 [r11 + 64 * line]);
        }
        for &slot in &operands {
            dynasm!(ops ; .arch x64 ; mov r9, QWORD [r8 + slot] ; add r9, r11 ; sub r9, rdx);
            for line in 0..row_lines {
                dynasm!(ops ; .arch x64 ; prefetcht0 [r9 + 64 * line]);
            }
        }
        dynasm!(ops ; .arch x64 ; add r11, ldc ; cmp r11, r10 ; cmovae r11, rdx);
    };
    dynasm!(ops ; .arch x64
        ; mov r11, rdx
        ; lea r10, [rdx + tile_end]
        ; mov rax, rcx
        ; shr rax, shift
        ; test rax, rax
        ; jz =>main_end
        ; =>main
    );
    prefetch_c_row(ops);
    for i in 0..u {
        step(ops, i);
    }
    dynasm!(ops ; .arch x64
        ; add rdi, a_adv
        ; add rsi, b_adv
        ; dec rax
        ; jnz =>main
        ; =>main_end
        ; mov rax, rcx
        ; and rax, (u as i32) - 1
        ; jz =>done
        ; =>rem
    );
    prefetch_c_row(ops);
    step(ops, 0);
    let (a1, b1) = (s.a_ks, s.b_ks);
    dynasm!(ops ; .arch x64
        ; add rdi, a1
        ; add rsi, b1
        ; dec rax
        ; jnz =>rem
        ; =>done
    );
}

/// A finalized set of kernels (one mapping) and their entry points.
#[derive(Clone)]
pub struct KernelSet {
    /// Keeps the code mapped for as long as the entry points are used (shared when several sets were mapped
    /// together, see [`KernelSet::map_artifacts`]).
    _code: std::sync::Arc<ExecutableBuffer>,
    pub fns: Vec<MicroFn>,
    /// The code bytes, position independent (relative jumps, register and RIP-relative addressing within the
    /// bytes): what a cache stores.
    pub bytes: Vec<u8>,
    offsets: Vec<usize>,
}

/// Magic of a serialized kernel set (`to_artifact`): format version 1.
const ARTIFACT_MAGIC: &[u8; 8] = b"KGEMMv1\n";

impl KernelSet {
    /// Assembles every spec (all sharing `ep`) into one mapping.
    pub fn build(specs: &[MicroSpec], ep: &EpProgram) -> Result<KernelSet, String> {
        Self::assemble(specs.len(), |ops, i| match specs[i].isa {
            Isa::Avx2 => emit(ops, &specs[i], ep),
            Isa::Avx512 => super::asm512::emit(ops, &specs[i], ep),
        })
    }

    /// Assembles `count` kernels, kernel `i` emitted by `emit(ops, i)` (returning its entry), into one mapping.
    pub fn assemble(
        count: usize,
        mut emit: impl FnMut(&mut Assembler, usize) -> Result<AssemblyOffset, String>,
    ) -> Result<KernelSet, String> {
        let mut ops = Assembler::new().map_err(|e| e.to_string())?;
        let mut offsets = Vec::with_capacity(count);
        for i in 0..count {
            offsets.push(emit(&mut ops, i)?.0);
        }
        let code = ops.finalize().map_err(|_| "finalizing the GEMM kernels failed".to_string())?;
        crate::cpu::code::MAPPINGS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let bytes = code.to_vec();
        Ok(Self::from_code(std::sync::Arc::new(code), 0, bytes, offsets))
    }

    /// The set whose code starts at byte `base` of `code`.
    fn from_code(
        code: std::sync::Arc<ExecutableBuffer>,
        base: usize,
        bytes: Vec<u8>,
        offsets: Vec<usize>,
    ) -> KernelSet {
        let fns = offsets
            .iter()
            .map(|&o| {
                // SAFETY: `base + o` is the start of a function emitted with `MicroFn`'s sysv64 signature (by `build`,
                // or by a `build` whose bytes `parse_artifact` validated, copied to `base`), and `code` (kept in the
                // returned set) keeps it mapped executable.
                unsafe { std::mem::transmute::<*const u8, MicroFn>(code.ptr(AssemblyOffset(base + o))) }
            })
            .collect();
        KernelSet { _code: code, fns, bytes, offsets }
    }

    /// The set as bytes for a cache: magic, kernel count, offsets, code.
    pub fn to_artifact(&self) -> Vec<u8> {
        let mut out = ARTIFACT_MAGIC.to_vec();
        out.extend((self.offsets.len() as u32).to_le_bytes());
        for &o in &self.offsets {
            out.extend((o as u32).to_le_bytes());
        }
        out.extend(&self.bytes);
        out
    }

    /// Maps a cached set back (no code generation). The cache entry was checksummed and keyed by the exact specs,
    /// program, kiln version and CPU fingerprint; this checks only its framing (`expected` kernels, offsets inside
    /// the code).
    pub fn from_artifact(a: &[u8], expected: usize) -> Result<KernelSet, String> {
        let (offsets, code_bytes) = parse_artifact(a)?;
        if offsets.len() != expected {
            return Err("malformed GEMM code artifact".into());
        }
        let (code, _) = crate::cpu::code::map_together(&[code_bytes])?;
        Ok(Self::from_code(std::sync::Arc::new(code), 0, code_bytes.to_vec(), offsets))
    }

    /// Maps several cached sets into one executable mapping (one `mmap` and `mprotect` for all: see the CPU
    /// backend's `code` module). A malformed artifact is left out, not an error.
    pub fn map_artifacts(artifacts: &[&[u8]]) -> Result<Vec<Option<KernelSet>>, String> {
        let parsed: Vec<Option<(Vec<usize>, &[u8])>> = artifacts.iter().map(|a| parse_artifact(a).ok()).collect();
        let blobs: Vec<&[u8]> = parsed.iter().flatten().map(|(_, code)| *code).collect();
        let (code, bases) = crate::cpu::code::map_together(&blobs)?;
        let code = std::sync::Arc::new(code);
        let mut bases = bases.into_iter();
        Ok(parsed
            .into_iter()
            .map(|p| {
                let (offsets, bytes) = p?;
                let base = bases.next()?;
                Some(Self::from_code(code.clone(), base, bytes.to_vec(), offsets))
            })
            .collect())
    }
}

/// The framing of a kernel-set artifact: magic, kernel count, offsets (inside the code), code.
fn parse_artifact(a: &[u8]) -> Result<(Vec<usize>, &[u8]), String> {
    let bad = || "malformed GEMM code artifact".to_string();
    let rest = a.strip_prefix(&ARTIFACT_MAGIC[..]).ok_or_else(bad)?;
    let word =
        |i: usize| -> Option<usize> { Some(u32::from_le_bytes(rest.get(4 * i..4 * i + 4)?.try_into().ok()?) as usize) };
    let n = word(0).ok_or_else(bad)?;
    let offsets: Vec<usize> = (1..=n).map(word).collect::<Option<_>>().ok_or_else(bad)?;
    let code_bytes = rest.get(4 * (n + 1)..).ok_or_else(bad)?;
    if code_bytes.is_empty() || offsets.iter().any(|&o| o >= code_bytes.len()) {
        return Err(bad());
    }
    Ok((offsets, code_bytes))
}

/// Whether this host can run the generated kernels.
pub fn host_supported() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}
