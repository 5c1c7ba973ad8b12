//! bf16 GEMM kernels, generated at run time, for the two bf16 units of current x86 cores: AMX tiles (`tdpbf16ps`)
//! and AVX512-BF16 (`vdpbf16ps`). Both read the same packed operands (B in the tiles' pair layout, A in rows), sum
//! in f32, and finish with the same epilogue (bias, activation, the rounding to bf16) in zmm registers before the
//! one store; `bf16_drive.rs` drives them (`run_bf16_item`, `run_bf16_depth`).
//!
//! AMX: a kernel computes a `16*mt x 16*nt` block of C (`mt`, `nt` in 1..=2) with `mt * nt` accumulator tiles
//! (tmm0..3), `mt` A tiles (tmm4, tmm5: 16 rows of 32 bf16, read at A's row stride) and `nt` B tiles (tmm6, tmm7: 16
//! rows of 16 column pairs, `(B[2p, j], B[2p+1, j])` in dword `j` of row `p`, packed by `bf16_pack::pack_b`). Each
//! of `k` steps of 32 loads the tiles and issues `mt * nt` `tdpbf16ps` (16 x 16 x 32 products each); the sums stay in
//! the tiles over the whole K. Then they go to a 64-byte-aligned stack area (`tilestored`), and each row of 16 f32 is
//! loaded into a zmm, finished by the shared epilogue emitter (`program_asm::emit_program` with `asm512`'s instructions)
//! and stored as f32 or as bf16 (the program rounds each bf16 value, nearest even as PyTorch, so the store keeps the
//! top half), masked at a ragged last vector.
//! The contract is `asm::MicroFn`'s: `(a, b, c, k, ep)`, `k` counting steps of 32. The K-split form
//! ([`emit_partial`]) loads, adds to and stores back a thread's f32 partial sums instead, with no epilogue.
//! Past [`K_BLOCK_STEPS`] steps K runs in blocks ([`emit_blocked`]): A's 16 KiB block stays in L1 for every panel
//! of B's block of columns, the sums go to a scratch block between blocks of K, and an epilogue-only kernel
//! (`Bf16Spec::from_sums`) finishes them (bf16 2048^3 on two threads: 9.7-10.4 -> 8.6-8.7 ms with its A prefetch;
//! 1024^3 1.32-1.41 -> 1.13-1.22).
//!
//! AVX512-BF16 ([`emit_dot`]): `mr x nt` zmm accumulators over the same steps, per pair of K one row of each B
//! tile and a broadcast of each row's A pair, `vdpbf16ps`; the sums never leave the registers. It is the bf16 unit
//! of a host without AMX (AMD Zen 4, Intel Cooper Lake); where both exist the tuner races them.
//!
//! Subnormals: both units treat subnormal inputs as zero and flush subnormal results to zero whatever MXCSR says
//! (`tdpbf16ps` and `vdpbf16ps` are specified so), so a sum below f32's smallest normal (1.2e-38) comes out 0 where
//! the f32 GEMM and the interpreter keep it (measured: 64 products of 1e-20 gave 0 against
//! 6.4e-39). oneDNN's bf16 kernels behind PyTorch run on the same instructions.
//!
//! The tile configuration (palette 1, every tile 16 rows of 64 bytes) sits after the code and is loaded by
//! `ldtilecfg` at each call; `tilerelease` ends it, so no tile state outlives a call. Edges are zeros rather than
//! smaller tiles: a ragged K or M is packed with zero padding (A is read in place only in full row blocks with K a
//! multiple of 32), a ragged N is a zero-padded B panel and a masked store.
//!
//! Why generated, as the AVX kernels are: the epilogue is part of the kernel. Why not `core::arch`: the AMX
//! intrinsics are not stable Rust. `dynasmrt` encodes neither AMX nor EVEX: the VEX forms of the six tile
//! instructions are written here as bytes (`Tile`), pinned against GNU `as` by the tests. Packing is Rust with
//! AVX-512 intrinsics, in `bf16_pack`.
//!
//! Linux hands out AMX's 8 KiB of tile state only on request (`arch_prctl(ARCH_REQ_XCOMP_PERM,
//! XFEATURE_XTILEDATA)`, once per process: [`amx_ready`]); without it the first tile instruction faults. A host without
//! AMX-BF16, AVX512-BF16 and AVX-512BW, or where that request fails, or where `KILN_CPU_ISA` rules out AVX-512, has
//! no AMX candidate ([`unit_ready`] for either unit).

// `dynasm!` converts every run-time register number with `.into()`, a no-op for the `u8`s used here.
#![allow(clippy::useless_conversion)]

use super::asm512::Zmm;
use super::config::Bf16Unit;
use super::evex::{Enc, Rm, gpr, mem};
use super::program::EpProgram;
use super::program_asm::{ConstPool, emit_program};
use dynasmrt::x64::Assembler;
use dynasmrt::{AssemblyOffset, DynasmApi, DynasmLabelApi, dynasm};

/// Rows of a tile, and bf16 pairs (f32 columns) per tile row.
pub const TILE: usize = 16;
/// bf16 elements of K per step (one A tile row: 64 bytes).
pub const KSTEP: usize = 32;
/// Bytes of one packed B tile.
pub(super) const B_TILE_BYTES: usize = TILE * 64;

/// One bf16 micro-kernel (either unit).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Bf16Spec {
    pub unit: Bf16Unit,
    /// Rows of the block (AMX: 16 or 32, whole A tiles) and 16-column B tiles.
    pub mr: usize,
    pub nt: usize,
    /// Rows of C stored (`<= mr`).
    pub rows: usize,
    /// 16-column vectors stored per row (`<= nt`).
    pub nv: usize,
    /// The last vector of a row is masked (ragged N): the mask is `ep[0]`.
    pub masked: bool,
    /// Byte stride of C's rows.
    pub ldc: i32,
    /// C is bf16 (rounded at the store), else f32.
    pub out_bf16: bool,
    /// AMX only: the block's sums are already finished, as f32 rows of `16 * nt` at the A pointer (a block of
    /// [`emit_blocked`]'s partial sums): no products, only the epilogue and the store.
    pub from_sums: bool,
}

/// VEX encodings of the AMX instructions used (all `VEX.128.0F38.W0`).
struct Tile<'a>(&'a mut Vec<u8>);

impl Tile<'_> {
    /// The 3-byte VEX prefix: extension bits of ModRM.reg, SIB.index and ModRM.rm/SIB.base, EVEX-style inverted;
    /// `vvvv` (a tile register, or none) inverted; pp 0 none, 1 66, 2 F3, 3 F2.
    fn vex(&mut self, r: u8, x: u8, b: u8, vvvv: Option<u8>, pp: u8) {
        let inv = |bit: u8| (bit & 1) ^ 1;
        let v = vvvv.map_or(0xf, |v| !v & 0xf);
        self.0.extend([0xc4, inv(r) << 7 | inv(x) << 6 | inv(b) << 5 | 0x02, v << 3 | pp]);
    }

    /// `op tmm, [base + index + disp]` (SIB addressing, as the tile loads and stores require).
    fn sib(&mut self, pp: u8, op: u8, tmm: u8, base: u8, index: u8, disp: i32) {
        self.vex(0, index >> 3, base >> 3, None, pp);
        let md = if disp == 0 && base & 7 != 5 {
            0
        } else if (-128..=127).contains(&disp) {
            1
        } else {
            2
        };
        self.0.extend([op, md << 6 | (tmm & 7) << 3 | 4, (index & 7) << 3 | (base & 7)]);
        match md {
            1 => self.0.push(disp as i8 as u8),
            2 => self.0.extend(disp.to_le_bytes()),
            _ => {}
        }
    }

    /// `tileloadd tmm, [base + index + disp]`: 16 rows of 64 bytes at a stride of `index`.
    fn load(&mut self, tmm: u8, base: u8, index: u8, disp: i32) {
        self.sib(3, 0x4b, tmm, base, index, disp);
    }

    /// `tilestored [base + index + disp], tmm`.
    fn store(&mut self, tmm: u8, base: u8, index: u8, disp: i32) {
        self.sib(2, 0x4b, tmm, base, index, disp);
    }

    /// `tdpbf16ps c, a, b`: `c[i][j] += a[i][2p] * b[p][2j] + a[i][2p+1] * b[p][2j+1]` summed over p.
    fn dp(&mut self, c: u8, a: u8, b: u8) {
        self.vex(0, 0, 0, Some(b), 2);
        self.0.extend([0x5c, 0xc0 | (c & 7) << 3 | (a & 7)]);
    }

    fn zero(&mut self, tmm: u8) {
        self.vex(0, 0, 0, None, 3);
        self.0.extend([0x49, 0xc0 | (tmm & 7) << 3]);
    }

    /// `ldtilecfg [base]` (a base other than rsp, rbp, r12 and r13: no SIB, no displacement).
    fn config(&mut self, base: u8) {
        self.vex(0, 0, base >> 3, None, 0);
        self.0.extend([0x49, base & 7]);
    }

    fn release(&mut self) {
        self.0.extend([0xc4, 0xe2, 0x78, 0x49, 0xc0]);
    }
}

fn tiles(ops: &mut Assembler, f: impl FnOnce(&mut Tile)) {
    let mut bytes = Vec::new();
    f(&mut Tile(&mut bytes));
    ops.extend(bytes);
}

fn put(ops: &mut Assembler, f: impl FnOnce(&mut Enc)) {
    let mut e = Enc::default();
    f(&mut e);
    ops.extend(e.bytes);
}

/// Tile registers: accumulators 0.., A tiles 4 and 5, B tiles 6 and 7.
const A_TILE: u8 = 4;
const B_TILE: u8 = 6;
/// The opmask of a ragged last vector.
const TAIL_MASK: u8 = 1;

/// Emits one kernel at the assembler's current offset and returns that offset.
pub fn emit(ops: &mut Assembler, s: &Bf16Spec, ep: &EpProgram) -> Result<AssemblyOffset, String> {
    if s.unit == Bf16Unit::Avx512Bf16 {
        return emit_dot(ops, s, ep);
    }
    let (mt, nt) = (s.mr / TILE, s.nt);
    if !(1..=2).contains(&mt)
        || mt * TILE != s.mr
        || !(1..=2).contains(&nt)
        || s.rows == 0
        || s.rows > s.mr
        || s.nv == 0
        || s.nv > nt
    {
        return Err(format!("AMX tile {}x{} storing {} rows of {} vectors", s.mr, TILE * nt, s.rows, s.nv));
    }
    // The accumulator lives in zmm0; the program takes its temporaries from the rest.
    let free_regs: Vec<u8> = (1..32).collect();
    debug_assert_eq!(free_regs.len(), epilogue_registers(Bf16Unit::Amx, s.mr, s.nt));
    if ep.temps_needed() > free_regs.len() {
        return Err(format!("epilogue needs {} registers", ep.temps_needed()));
    }
    if s.from_sums {
        let start = ops.offset();
        let mut consts = ConstPool::default();
        let row = (nt * 64) as i32;
        let fetch = |ops: &mut Assembler, r: usize, v: usize| {
            put(ops, |e| e.load(0, mem(gpr::RDI, r as i32 * row + v as i32 * 64), 0));
            0
        };
        emit_stores(ops, s, ep, &free_regs, &mut consts, fetch)?;
        dynasm!(ops ; .arch x64 ; vzeroupper ; ret);
        consts.emit(ops);
        return Ok(start);
    }
    let start = ops.offset();
    let scratch = (mt * nt * B_TILE_BYTES) as i32;
    dynasm!(ops ; .arch x64
        ; push rbp
        ; mov rbp, rsp
        ; sub rsp, scratch
        ; and rsp, -64
    );
    let cfg = emit_tile_setup(ops, mt);
    tiles(ops, |t| (0..(mt * nt) as u8).for_each(|c| t.zero(c)));
    emit_k_loop(ops, mt, nt);
    tiles(ops, |t| {
        for c in 0..(mt * nt) as u8 {
            t.store(c, gpr::RSP, gpr::R9, c as i32 * B_TILE_BYTES as i32);
        }
        t.release();
    });
    let mut consts = ConstPool::default();
    // Each row of 16 f32 comes back from the stack into zmm0.
    let fetch = |ops: &mut Assembler, r: usize, v: usize| {
        let tile = (r / TILE * nt + v) as i32;
        put(ops, |e| e.load(0, mem(gpr::RSP, tile * B_TILE_BYTES as i32 + (r % TILE) as i32 * 64), 0));
        0
    };
    emit_stores(ops, s, ep, &free_regs, &mut consts, fetch)?;
    dynasm!(ops ; .arch x64
        ; mov rsp, rbp
        ; pop rbp
        ; vzeroupper
        ; ret
    );
    consts.emit(ops);
    emit_config(ops, cfg);
    Ok(start)
}

/// The end both units share: for each stored row and vector, `fetch` puts the finished sum in a register (and
/// returns it), the epilogue program runs on it (rounding bf16 values itself), and it is stored as f32 or bf16, the
/// last vector masked
/// at a ragged edge (the mask loaded from `ep[0]` into k1 first).
fn emit_stores(
    ops: &mut Assembler,
    s: &Bf16Spec,
    ep: &EpProgram,
    free_regs: &[u8],
    consts: &mut ConstPool,
    mut fetch: impl FnMut(&mut Assembler, usize, usize) -> u8,
) -> Result<(), String> {
    if s.masked {
        dynasm!(ops ; .arch x64 ; mov r9, QWORD [r8]);
        put(ops, |e| e.kmov_load(TAIL_MASK, mem(gpr::R9, 0)));
    }
    let pool = consts.base(ops);
    dynasm!(ops ; .arch x64 ; lea r10, [=>pool]);
    let last_uses = ep.last_uses();
    let zmm = Zmm { pool: gpr::R10 };
    for r in 0..s.rows {
        for v in 0..s.nv {
            let acc = fetch(ops, r, v);
            let k = if s.masked && v == s.nv - 1 { TAIL_MASK } else { 0 };
            let res = emit_program(&zmm, ops, ep, &last_uses, free_regs, (acc, r, v), k != 0, consts)?;
            let row = r as i32 * s.ldc;
            put(ops, |e| {
                if s.out_bf16 {
                    // The program's result is a bf16 value (`epilogue::translate_with`): its top half, exactly.
                    e.shift(2, res, res, 16);
                    e.store_low_words(mem(gpr::RDX, row + 32 * v as i32), res, k);
                } else {
                    e.store(mem(gpr::RDX, row + 64 * v as i32), res, k);
                }
            });
        }
    }
    Ok(())
}

/// The vector registers an epilogue program has for its temporaries in a kernel of `unit` with an `mr x nt`
/// block: AMX keeps its accumulator tiles outside them (one zmm for the element being finished), AVX512-BF16 holds
/// `mr * nt` accumulators in zmm.
pub fn epilogue_registers(unit: Bf16Unit, mr: usize, nt: usize) -> usize {
    match unit {
        Bf16Unit::Amx => 31,
        Bf16Unit::Avx512Bf16 => 32usize.saturating_sub(mr * nt),
    }
}

/// The AVX512-BF16 kernel over the same operands as the AMX one (A packed by `bf16_pack::pack_a`, B panels in the
/// tiles' pair layout, `k` steps of 32): `mr x nt` zmm accumulators, and per pair of K (16 a step) `nt` B vectors (one
/// row of each tile) and, per row, a broadcast of A's pair (a dword) into zmm31, then `vdpbf16ps`. The sums never
/// leave the registers: the epilogue runs on them in place.
pub fn emit_dot(ops: &mut Assembler, s: &Bf16Spec, ep: &EpProgram) -> Result<AssemblyOffset, String> {
    let (mr, nt) = (s.mr, s.nt);
    let nacc = mr * nt;
    if mr == 0 || nt == 0 || nacc + nt >= 32 || s.rows == 0 || s.rows > mr || s.nv == 0 || s.nv > nt {
        return Err(format!("AVX512-BF16 tile {mr}x{} storing {} rows of {} vectors", TILE * nt, s.rows, s.nv));
    }
    const A_REG: u8 = 31;
    let acc = |r: usize, v: usize| (r * nt + v) as u8;
    let b0 = nacc as u8;
    let free_regs: Vec<u8> = (nacc as u8..32).collect();
    debug_assert_eq!(free_regs.len(), epilogue_registers(Bf16Unit::Avx512Bf16, mr, nt));
    if ep.temps_needed() > free_regs.len() {
        return Err(format!("epilogue needs {} registers, {} free", ep.temps_needed(), free_regs.len()));
    }
    let start = ops.offset();
    put(ops, |e| (0..nacc as u8).for_each(|i| e.zero(i)));
    let top = ops.new_dynamic_label();
    dynasm!(ops ; .arch x64 ; =>top);
    put(ops, |e| {
        for p in 0..TILE as i32 {
            for v in 0..nt {
                e.load(b0 + v as u8, mem(gpr::RSI, v as i32 * B_TILE_BYTES as i32 + 64 * p), 0);
            }
            for r in 0..mr {
                e.broadcast(A_REG, mem(gpr::RDI, r as i32 * A_ROW_BYTES + 4 * p));
                for v in 0..nt {
                    e.dot_bf16(acc(r, v), b0 + v as u8, Rm::Reg(A_REG));
                }
            }
        }
    });
    let (b_step, a_step) = ((nt * B_TILE_BYTES) as i32, A_ROW_BYTES * mr as i32);
    dynasm!(ops ; .arch x64
        ; add rdi, a_step
        ; add rsi, b_step
        ; dec rcx
        ; jnz =>top
    );
    let mut consts = ConstPool::default();
    emit_stores(ops, s, ep, &free_regs, &mut consts, |_, r, v| acc(r, v))?;
    dynasm!(ops ; .arch x64 ; vzeroupper ; ret);
    consts.emit(ops);
    Ok(start)
}

/// A kernel of the K-split GEMM (`Split::Depth`): the `16 * mt x 16 * nt` block of a thread's f32 partial sums
/// (rows of `ldc` bytes, padded to whole tiles) is zeroed (`first`) or loaded, the `k` steps added, and the block
/// stored back; no epilogue, no edges.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PartialSpec {
    pub mt: usize,
    pub nt: usize,
    pub ldc: i32,
    pub first: bool,
}

/// Emits one [`PartialSpec`] kernel (`asm::MicroFn`'s contract; `ep` is not read) and returns its offset.
pub fn emit_partial(ops: &mut Assembler, s: &PartialSpec) -> Result<AssemblyOffset, String> {
    let (mt, nt) = (s.mt, s.nt);
    check_amx_block(mt, nt)?;
    let start = ops.offset();
    let cfg = emit_tile_setup(ops, mt);
    let ldc = s.ldc;
    dynasm!(ops ; .arch x64 ; mov r8, ldc);
    emit_sums_block(ops, mt, nt, ldc, s.first);
    tiles(ops, |t| t.release());
    dynasm!(ops ; .arch x64 ; ret);
    emit_config(ops, cfg);
    Ok(start)
}

/// A kernel of the K-blocked AMX drive (`run_bf16_item` where K is longer than [`K_BLOCK_STEPS`]): one block of K
/// for a row block of `16 * mt` rows against every panel of a block of B's columns, so the row block's A tiles (16
/// KiB at 32 rows) are read from L1 by every panel while B's panels stream from L2. For each panel its block of f32
/// partial sums (`16 * mt` contiguous rows of `16 * nt` floats, panel after panel) is zeroed (`first`) or loaded,
/// the steps added, and the block stored back.
///
/// Contract: `asm::MicroFn`'s `(a, b, c, k, ep)` with `k` = [`blocked_k`]`(steps, panels)`; B's panels follow each
/// other, each `steps` steps of `nt` tiles (the layout `bf16_pack::pack_b` writes for that block of K's rows); `ep`
/// is not read. The tiles must be configured (by [`emit_tile_config`]'s stub) before the first call and released
/// after the last: a configuration and release per call measured 30-40 ns, a tenth of one panel's 32 products.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct BlockedSpec {
    pub mt: usize,
    pub nt: usize,
    pub first: bool,
}

/// Steps of 32 of K per block of the K-blocked AMX drive: a 32-row block of A is 16 KiB, in L1 with the C block and
/// B's tiles in flight.
pub const K_BLOCK_STEPS: usize = 8;

/// The `k` argument of a [`BlockedSpec`] kernel: `steps` (of 32, below 2^16) and `panels` in one word, which the
/// kernel splits.
pub fn blocked_k(steps: usize, panels: usize) -> usize {
    debug_assert!(steps < 1 << 16);
    steps | panels << 16
}

/// Emits one [`BlockedSpec`] kernel and returns its offset.
pub fn emit_blocked(ops: &mut Assembler, s: &BlockedSpec) -> Result<AssemblyOffset, String> {
    let (mt, nt) = (s.mt, s.nt);
    check_amx_block(mt, nt)?;
    let start = ops.offset();
    let ldc = (nt * 64) as i32;
    let block = (mt * nt * B_TILE_BYTES) as i32;
    let a_block_step = A_ROW_BYTES * (TILE * mt) as i32;
    const PREFETCH_LINES: i32 = 32;
    // rbx: panels left; r12: A's first step; r10: steps per panel; r13: the A prefetch cursor.
    dynasm!(ops ; .arch x64
        ; push rbx
        ; push r12
        ; push r13
    );
    emit_strides(ops);
    dynasm!(ops ; .arch x64
        ; mov r8, ldc
        ; mov rbx, rcx
        ; shr rbx, 16
        ; and ecx, 0xffff
        ; mov r10, rcx
        ; mov r12, rdi
        ; mov r13, rcx
        ; imul r13, r13, a_block_step
        ; add r13, rdi
    );
    let panel = ops.new_dynamic_label();
    dynasm!(ops ; .arch x64 ; =>panel ; mov rdi, r12 ; mov rcx, r10);
    // The next block of A (packed A's next steps: this row block's next block of K, or the next row block's
    // first) follows this one; each panel brings 2 KiB of it into L1, so the next call's first panel does not wait
    // on L3 for its A tiles (bf16 2048^3, one thread: 18.0-18.6 -> 16.1-16.7 ms; two: 9.7-9.8 -> 8.5-8.9).
    for line in 0..PREFETCH_LINES {
        dynasm!(ops ; .arch x64 ; prefetcht0 [r13 + line * 64]);
    }
    dynasm!(ops ; .arch x64 ; add r13, PREFETCH_LINES * 64);
    if mt == 2 {
        let second = 16 * A_ROW_BYTES;
        dynasm!(ops ; .arch x64 ; lea rax, [r12 + second]);
    }
    emit_sums_block(ops, mt, nt, ldc, s.first);
    dynasm!(ops ; .arch x64
        ; add rdx, block
        ; dec rbx
        ; jnz =>panel
        ; pop r13
        ; pop r12
        ; pop rbx
        ; ret
    );
    Ok(start)
}

/// The stub that configures the tiles for [`emit_blocked`]'s kernels (the palette every kernel here uses).
pub fn emit_tile_config(ops: &mut Assembler) -> Result<AssemblyOffset, String> {
    let start = ops.offset();
    let cfg = emit_load_config(ops);
    dynasm!(ops ; .arch x64 ; ret);
    emit_config(ops, cfg);
    Ok(start)
}

/// The stub that releases the tiles after [`emit_blocked`]'s last call.
pub fn emit_tile_release(ops: &mut Assembler) -> Result<AssemblyOffset, String> {
    let start = ops.offset();
    tiles(ops, |t| t.release());
    dynasm!(ops ; .arch x64 ; ret);
    Ok(start)
}

/// Packed A (`bf16_pack::pack_a`): rows of 64 bytes, a step's `mr` rows contiguous, so a tile is 1 KiB and A advances
/// `64 * mr` bytes a step.
const A_ROW_BYTES: i32 = 64;

/// The set-up both AMX kernels share: the tile configuration loaded (from the label returned, which the caller
/// places with [`emit_config`]), A's row stride in r11 and the second A tile's address in rax, B's in r9.
fn emit_tile_setup(ops: &mut Assembler, mt: usize) -> dynasmrt::DynamicLabel {
    let cfg = emit_load_config(ops);
    emit_strides(ops);
    if mt == 2 {
        let second = 16 * A_ROW_BYTES;
        dynasm!(ops ; .arch x64 ; lea rax, [rdi + second]);
    }
    cfg
}

/// Loads the tile configuration from the label returned (placed by the caller with [`emit_config`]).
fn emit_load_config(ops: &mut Assembler) -> dynasmrt::DynamicLabel {
    let cfg = ops.new_dynamic_label();
    dynasm!(ops ; .arch x64 ; lea r10, [=>cfg]);
    tiles(ops, |t| t.config(gpr::R10));
    cfg
}

/// The K loop's tile strides: A's rows (r11) and B's (r9), 64 bytes each.
fn emit_strides(ops: &mut Assembler) {
    dynasm!(ops ; .arch x64
        ; mov r11, A_ROW_BYTES
        ; mov r9, 64
    );
}

/// `mt x nt` accumulator tiles, within the 4 the kernels hold.
fn check_amx_block(mt: usize, nt: usize) -> Result<(), String> {
    if (1..=2).contains(&mt) && (1..=2).contains(&nt) {
        Ok(())
    } else {
        Err(format!("AMX tile {}x{}", TILE * mt, TILE * nt))
    }
}

/// A block of f32 partial sums at rdx (rows `ldc` bytes apart, r8 = `ldc`) zeroed (`first`) or loaded into the
/// accumulator tiles, the K loop's steps added, and stored back: the body of both partial-sum kernels.
fn emit_sums_block(ops: &mut Assembler, mt: usize, nt: usize, ldc: i32, first: bool) {
    let c_at = |i: usize, j: usize| (i * TILE) as i32 * ldc + (j * 64) as i32;
    tiles(ops, |t| {
        for i in 0..mt {
            for j in 0..nt {
                let c = (i * nt + j) as u8;
                if first { t.zero(c) } else { t.load(c, gpr::RDX, gpr::R8, c_at(i, j)) }
            }
        }
    });
    emit_k_loop(ops, mt, nt);
    tiles(ops, |t| {
        for i in 0..mt {
            for j in 0..nt {
                t.store((i * nt + j) as u8, gpr::RDX, gpr::R8, c_at(i, j));
            }
        }
    });
}

/// The K loop both AMX kernels share: `rcx` steps of A tiles at rdi (and rax), stride r11, and B tiles at rsi,
/// stride r9 (64).
fn emit_k_loop(ops: &mut Assembler, mt: usize, nt: usize) {
    let a_step = A_ROW_BYTES * (TILE * mt) as i32;
    let top = ops.new_dynamic_label();
    dynasm!(ops ; .arch x64 ; =>top);
    // Each tile loaded just before its first product, so a step's loads overlap the previous products instead of
    // all four waiting for the tiles they overwrite (bf16 1024^3, 2 threads: 1.31-1.33 ms against 1.54-1.60 with
    // the four loads first; 2048^3 within noise).
    tiles(ops, |t| {
        t.load(A_TILE, gpr::RDI, gpr::R11, 0);
        for j in 0..nt {
            t.load(B_TILE + j as u8, gpr::RSI, gpr::R9, (j * B_TILE_BYTES) as i32);
            t.dp(j as u8, A_TILE, B_TILE + j as u8);
        }
        if mt == 2 {
            t.load(A_TILE + 1, gpr::RAX, gpr::R11, 0);
            for j in 0..nt {
                t.dp((nt + j) as u8, A_TILE + 1, B_TILE + j as u8);
            }
        }
    });
    let b_step = (nt * B_TILE_BYTES) as i32;
    dynasm!(ops ; .arch x64
        ; add rdi, a_step
        ; add rax, a_step
        ; add rsi, b_step
        ; dec rcx
        ; jnz =>top
    );
}

/// The tile configuration at label `cfg`: palette 1, every tile 16 rows of 64 bytes (bytes 16.. : bytes per row of
/// each tile as u16; 48.. : rows of each tile).
fn emit_config(ops: &mut Assembler, cfg: dynasmrt::DynamicLabel) {
    let mut config = [0u8; 64];
    config[0] = 1;
    for t in 0..8 {
        config[16 + 2 * t] = 64;
        config[48 + t] = TILE as u8;
    }
    dynasm!(ops ; .arch x64 ; .align 64 ; =>cfg);
    ops.extend(config);
}

/// Whether this host may run `unit`'s kernels ([`amx_ready`] for AMX; AVX512-BF16 needs it and AVX-512BW, and
/// `KILN_CPU_ISA` allowing AVX-512).
pub fn unit_ready(unit: Bf16Unit) -> bool {
    match unit {
        Bf16Unit::Amx => amx_ready(),
        Bf16Unit::Avx512Bf16 => {
            static DOT: std::sync::LazyLock<bool> = std::sync::LazyLock::new(|| {
                use crate::cpu::isa::{self, Isa};
                isa::bf16_units().avx512_bf16 && isa::has_avx512bw() && isa::allows(Isa::Avx512)
            });
            *DOT
        }
    }
}

/// Whether this host may run AMX kernels: AMX-BF16 and AMX-TILE, AVX512-BF16 and AVX-512BW (the epilogue and the
/// packing), `KILN_CPU_ISA` allowing AVX-512, and the kernel's permission for the tile data, asked once.
pub fn amx_ready() -> bool {
    static READY: std::sync::LazyLock<bool> = std::sync::LazyLock::new(|| {
        use crate::cpu::isa::{self, Isa};
        let u = isa::bf16_units();
        u.amx_bf16 && u.avx512_bf16 && isa::has_avx512bw() && isa::allows(Isa::Avx512) && request_tile_data()
    });
    *READY
}

/// `arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`: permission for this process's threads to use the tile
/// registers; `false` (with a note) when the kernel refuses.
fn request_tile_data() -> bool {
    #[cfg(all(target_os = "linux", target_arch = "x86_64"))]
    {
        const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
        const XFEATURE_XTILEDATA: libc::c_long = 18;
        // SAFETY: a plain syscall with integer arguments; it changes only which state the kernel saves for us.
        let rc = unsafe { libc::syscall(libc::SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) };
        if rc != 0 {
            crate::runtime::tracing_note(&format!(
                "AMX present but the kernel refused its tile state (arch_prctl: {}): no AMX GEMM",
                std::io::Error::last_os_error()
            ));
        }
        rc == 0
    }
    #[cfg(not(all(target_os = "linux", target_arch = "x86_64")))]
    {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The tile instructions against GNU `as` 2.40 on the same instructions (AT&T source, listed here in Intel
    /// order).
    #[test]
    fn tile_encodings_match_gnu_as() {
        let mut b = Vec::new();
        let mut t = Tile(&mut b);
        t.dp(0, 5, 3);
        t.load(4, gpr::RDI, gpr::R11, 0);
        t.load(5, gpr::RAX, gpr::R11, 64);
        t.store(1, gpr::RSP, gpr::R9, 0);
        t.config(gpr::R10);
        t.release();
        t.zero(2);
        t.store(3, gpr::RSP, gpr::R9, 3072);
        let want: &[u8] = &[
            0xc4, 0xe2, 0x62, 0x5c, 0xc5, // tdpbf16ps tmm0, tmm5, tmm3
            0xc4, 0xa2, 0x7b, 0x4b, 0x24, 0x1f, // tileloadd tmm4, [rdi + r11]
            0xc4, 0xa2, 0x7b, 0x4b, 0x6c, 0x18, 0x40, // tileloadd tmm5, [rax + r11 + 64]
            0xc4, 0xa2, 0x7a, 0x4b, 0x0c, 0x0c, // tilestored [rsp + r9], tmm1
            0xc4, 0xc2, 0x78, 0x49, 0x02, // ldtilecfg [r10]
            0xc4, 0xe2, 0x78, 0x49, 0xc0, // tilerelease
            0xc4, 0xe2, 0x7b, 0x49, 0xd0, // tilezero tmm2
            0xc4, 0xa2, 0x7a, 0x4b, 0x9c, 0x0c, 0x00, 0x0c, 0x00, 0x00, // tilestored [rsp + r9 + 3072], tmm3
        ];
        assert_eq!(&b[..], want);
    }
}
