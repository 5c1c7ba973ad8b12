//! The tensor-core GEMM template for CUDA (sm_80 and later): a bf16 (or f16, or TF32: below) GEMM whose products run as
//! warp-level `mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32` instructions, f32 accumulators, and the kernel's
//! outer code as the epilogue (the shared template's `epilogue` function, so every fused epilogue the SIMT template
//! takes, this one takes).
//!
//! A block of `wm x wn` warps computes a tile of C ([`MmaTile`]: 64 x 64 from 2 x 2 warps of 2 x 4 instruction tiles
//! of 16 x 8, or thin 16-row tiles for decode shapes); each warp its sub-tile, 4 accumulators per instruction tile
//! and thread. K goes in slices of 32: the block stages a `bm x 32` slice of A as `[m][k]` and a `32 x bn` slice of
//! B as `[n][k]` in shared memory, bf16 bits as stored (rows padded
//! to 40 halves against bank conflicts), bounds-checked with zeros outside, so ragged M, N and K need no special
//! case; the read order follows each operand's contiguous dimension, so transposed operands are read coalesced, and
//! where an operand's offset and strides are multiples of 8 elements it is read 16 bytes (8 bf16) a load (one
//! 16-byte store into shared memory too where the operand runs along K; 8 stores where it runs along M or N), with
//! checked element loads only for vectors at a ragged edge.
//! Each warp then loads its fragments from the slices with `ldmatrix` (four 8 x 8 matrices of A, or two tiles of
//! B, a load), whose per-lane layout is the one `m16n8k16` takes ("Matrix Fragments for mma.m16n8k16 with floating
//! point type": with `g = lane / 4`, `q = lane % 4`, A's registers hold rows `g`, `g + 8` at columns `2q, 2q + 1`
//! and `2q + 8, 2q + 9`; B's columns `g` at rows `2q, 2q + 1` and `2q + 8, 2q + 9`; C's rows `g`, `g + 8` at
//! columns `2q, 2q + 1`), lower index in the low half of each register.
//!
//! The host shim (`host.rs`) defines `kiln_ldsm_x4` / `_x2` by `ldmatrix`'s layout and `kiln_mma_bf16_16816` as the
//! warp's product computed from every lane's fragments by the `mma` layout, so the template's indexing runs against the
//! interpreter on a machine without a GPU; what the shim cannot check is whether the layout is the hardware's (the PTX
//! ISA is the reference) and the order in which the tensor core sums a 16-term product (unspecified: results agree to
//! f32 accumulation, not bits).
//!
//! K splits as the SIMT template's do (`gemm.rs`'s module doc: the same `split_end`), for decode shapes.
//!
//! **TF32** ([`MmaType::Tf32`], f32 operands, where the user allows it: the GPU devices' `gpu_gemm::allow_tf32`):
//! the same tiles with `mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32`, the slices staged as f32 (rows padded
//! to 36 floats) and each fragment element rounded to TF32 as it is read (`cvt.rna.tf32.f32`: 10 mantissa bits,
//! to nearest, ties away from zero). Its layout ("Matrix Fragments for mma.m16n8k8", `.tf32`): A's registers hold
//! rows `g`, `g + 8` at columns `q` and `q + 4`; B's column `g` at rows `q`, `q + 4`; C as for `m16n8k16`. The shim
//! emulates it likewise (`kiln_mma_tf32_1688`, rounding as `cvt.rna` does). Operands whose strides are multiples of
//! 4 floats are staged 16 bytes (4 floats) a load.
//!
//! **f16** ([`MmaType::F16`]): `mma.sync...m16n8k16.row.col.f32.f16.f16.f32`, the bf16 product's layout and staging.
//!
//! **Double buffering**: where an operand is staged whole 16-byte vectors along K (a row-major A, a column-major B:
//! `x @ w.t()`), the slices alternate between two buffers and those vectors are `cp.async` copies (sm_80): slice
//! `i + 1` is in flight while slice `i` is multiplied, each thread committing a slice's copies as one group and
//! waiting for all but the newest before the barrier. Edge vectors, and operands staged another way, still go
//! through registers into the same buffers. The host shim lands a thread's copies only when it waits for their
//! group (the latest the PTX ISA allows), so a product that read a slice before its wait reads stale data there
//! too. Two buffers must fit 48 KiB of static shared memory: TF32's 36-float rows at 128-row tiles do not, and those
//! stay single-buffered.
//!
//! Deliberately not done yet: Hopper's `wgmma`/TMA, `ldmatrix` for TF32 (its fragments are rounded element by
//! element as they are read).

use super::gemm::{assemble, grid, split_end, split_of};
use super::{CudaC, Flavor, GpuKernel, check, math};
use crate::dtype::DType;
use crate::kernel::KernelIr;
use crate::kernel::gemm::{GemmOperand, GemmView};
use crate::render::cstyle::{self, Acc, Emitter, KSplit, epilogue_fn, operand_at as at, operand_bases};
use std::fmt::Write;

/// K per staged slice.
pub const BK: u32 = 32;
/// Halves per shared row (`BK` plus padding, even so every register pair is 4-byte aligned).
const LD: u32 = BK + 8;
/// Floats per shared row for TF32 (`BK` plus 4: a warp's fragment reads, 8 rows at 4 columns, hit 32 banks).
const LD_TF32: u32 = BK + 4;

/// What the tensor cores multiply: bf16 or f16 operands, or f32 operands rounded to TF32.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MmaType {
    Bf16,
    F16,
    Tf32,
}

impl MmaType {
    /// The type for operands of `dtype`, if the tensor cores take them.
    pub fn of(dtype: DType) -> Option<MmaType> {
        match dtype {
            DType::BF16 => Some(MmaType::Bf16),
            DType::F16 => Some(MmaType::F16),
            DType::F32 => Some(MmaType::Tf32),
            _ => None,
        }
    }

    /// The helper that runs one warp-level product of this type (`helpers`).
    fn product(self) -> &'static str {
        match self {
            MmaType::Bf16 => "kiln_mma_bf16_16816",
            MmaType::F16 => "kiln_mma_f16_16816",
            MmaType::Tf32 => "kiln_mma_tf32_1688",
        }
    }

    /// Elements per shared row, and bytes per element.
    fn row(self) -> (u32, u32) {
        match self {
            MmaType::Bf16 | MmaType::F16 => (LD, 2),
            MmaType::Tf32 => (LD_TF32, 4),
        }
    }

    /// The C type an operand is staged as: its bits (16-bit types) or the f32 itself (TF32).
    fn elem(self) -> &'static str {
        match self {
            MmaType::Bf16 | MmaType::F16 => "unsigned short",
            MmaType::Tf32 => "float",
        }
    }

    /// Elements in a 16-byte vector load.
    fn vector_width(self) -> u32 {
        16 / self.row().1
    }
}

/// A tensor-core tile: `wm x wn` warps a block, each computing `fm x fn_` instruction tiles of 16 x 8, so the
/// block's tile of C is `16 * wm * fm` rows by `8 * wn * fn_` columns.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MmaTile {
    pub wm: u32,
    pub wn: u32,
    pub fm: u32,
    pub fn_: u32,
}

impl MmaTile {
    /// 64 x 64: four warps of 32 x 32.
    pub const SQUARE: MmaTile = MmaTile { wm: 2, wn: 2, fm: 2, fn_: 4 };

    /// Rows of C per block.
    pub fn bm(&self) -> u32 {
        16 * self.wm * self.fm
    }

    /// Columns of C per block.
    pub fn bn(&self) -> u32 {
        8 * self.wn * self.fn_
    }

    pub fn threads(&self) -> u32 {
        32 * self.wm * self.wn
    }

    /// Whether the template can take it: at least one warp and instruction tile, at most 1024 threads, at most
    /// 32 accumulator tiles a thread (128 registers), and 48 KiB of shared memory for either type.
    pub fn well_formed(&self) -> bool {
        let MmaTile { wm, wn, fm, fn_ } = *self;
        wm > 0
            && wn > 0
            && fm > 0
            && fn_ > 0
            && self.threads() <= 1024
            && fm * fn_ <= 32
            && self.shared_bytes(MmaType::Tf32) <= 48 * 1024
    }

    /// Bytes of shared memory: the A and B slices of `ty`.
    pub fn shared_bytes(&self, ty: MmaType) -> u32 {
        let (ld, size) = ty.row();
        (self.bm() + self.bn()) * ld * size
    }
}

/// Whether `arch` (`sm_XY`) has the bf16 `mma.sync` this template uses (sm_80 and later).
pub fn mma_arch(arch: &str) -> bool {
    arch.strip_prefix("sm_")
        .map(|v| v.trim_end_matches(|c: char| c.is_ascii_alphabetic()))
        .and_then(|v| v.parse::<u32>().ok())
        .is_some_and(|v| v >= 80)
}

/// The helpers a tensor-core kernel of type `ty` calls: its warp-level product (on the device; the host shim defines
/// its own, see the module doc), TF32's rounding, the 16-bit types' `ldmatrix`, the 16-byte loads and stores where
/// it stages `vectors`, and the asynchronous copies where it is `pipelined`.
fn helpers(ty: MmaType, vectors: bool, pipelined: bool) -> String {
    let name = ty.product();
    let (shape, ptx, what) = match ty {
        MmaType::Bf16 => ("m16n8k16", "bf16", "A (16 x 16, row) * B (16 x 8, col), bf16 in"),
        MmaType::F16 => ("m16n8k16", "f16", "A (16 x 16, row) * B (16 x 8, col), f16 in"),
        MmaType::Tf32 => ("m16n8k8", "tf32", "A (16 x 8, row) * B (8 x 8, col), TF32 in"),
    };
    let mut s = format!(
        r#"
#ifndef KILN_HOST_SHIM
// d += {what}, over one warp, f32 accumulators.
__device__ __forceinline__ void {name}(float* d, const unsigned int* a, const unsigned int* b) {{
    asm volatile(
        "mma.sync.aligned.{shape}.row.col.f32.{ptx}.{ptx}.f32 {{%0, %1, %2, %3}}, {{%4, %5, %6, %7}}, {{%8, %9}}, "
        "{{%0, %1, %2, %3}};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}}
"#
    );
    s.push_str(match ty {
        MmaType::Tf32 => {
            r#"// An f32 rounded to TF32 (to nearest, ties away from zero), as the tensor cores take it.
__device__ __forceinline__ unsigned int kiln_tf32(float x) {
    unsigned int r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
    return r;
}
#endif
"#
        }
        MmaType::Bf16 | MmaType::F16 => {
            r#"// Four (two) 8 x 8 matrices of 16-bit values from shared memory into a register each a lane (`ldmatrix`,
// sm_75), lanes 8i .. 8i + 7 giving the row addresses of matrix i.
__device__ __forceinline__ void kiln_ldsm_x4(unsigned int* r, const unsigned short* row) {
    unsigned int at = (unsigned int)__cvta_generic_to_shared(row);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(at));
}
__device__ __forceinline__ void kiln_ldsm_x2(unsigned int* r, const unsigned short* row) {
    unsigned int at = (unsigned int)__cvta_generic_to_shared(row);
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n" : "=r"(r[0]), "=r"(r[1]) : "r"(at));
}
#endif
"#
        }
    });
    if vectors {
        s.push_str(match ty {
            MmaType::Bf16 | MmaType::F16 => {
                r#"// 8 16-bit values as 16 bytes: loaded and stored whole (16-byte aligned), packed and split.
#ifndef KILN_HOST_SHIM
__device__ __forceinline__ uint4 kiln_ld16(const unsigned short* p) { return *(const uint4*)p; }
__device__ __forceinline__ void kiln_st16(unsigned short* p, uint4 x) { *(uint4*)p = x; }
#endif
__device__ __forceinline__ uint4 kiln_pack16(const unsigned short* h) {
    uint4 x;
    x.x = (unsigned int)h[0] | ((unsigned int)h[1] << 16);
    x.y = (unsigned int)h[2] | ((unsigned int)h[3] << 16);
    x.z = (unsigned int)h[4] | ((unsigned int)h[5] << 16);
    x.w = (unsigned int)h[6] | ((unsigned int)h[7] << 16);
    return x;
}
__device__ __forceinline__ unsigned short kiln_part16(uint4 x, int i) {
    unsigned int w = i < 2 ? x.x : i < 4 ? x.y : i < 6 ? x.z : x.w;
    return (unsigned short)(i % 2 ? w >> 16 : w & 0xffffu);
}
"#
            }
            MmaType::Tf32 => {
                r#"// 4 floats as 16 bytes: loaded and stored whole (16-byte aligned), packed and split.
#ifndef KILN_HOST_SHIM
__device__ __forceinline__ uint4 kiln_ld16(const float* p) { return *(const uint4*)p; }
__device__ __forceinline__ void kiln_st16(float* p, uint4 x) { *(uint4*)p = x; }
#endif
__device__ __forceinline__ uint4 kiln_pack16(const float* h) {
    uint4 x;
    x.x = __float_as_uint(h[0]);
    x.y = __float_as_uint(h[1]);
    x.z = __float_as_uint(h[2]);
    x.w = __float_as_uint(h[3]);
    return x;
}
__device__ __forceinline__ float kiln_part16(uint4 x, int i) {
    return __uint_as_float(i == 0 ? x.x : i == 1 ? x.y : i == 2 ? x.z : x.w);
}
"#
            }
        });
    }
    if pipelined {
        s.push_str(
            r#"#ifndef KILN_HOST_SHIM
// 16 bytes from global to shared memory without registers (sm_80's cp.async, L1 bypassed), in flight until this
// thread waits for the group it is committed in.
__device__ __forceinline__ void kiln_cp16(void* dst, const void* src) {
    unsigned int to = (unsigned int)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(to), "l"(src) : "memory");
}
// Closes this thread's group of copies issued since the last commit.
__device__ __forceinline__ void kiln_cp_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// Waits until at most one committed group (the newest) is still in flight.
__device__ __forceinline__ void kiln_cp_wait1() { asm volatile("cp.async.wait_group 1;\n" ::: "memory"); }
#endif
"#,
        );
    }
    s
}

/// Renders GEMM kernel `k` (recognized as `v`) for the tensor cores in tile `t`, K split `splits` ways (1: not
/// split): bf16 and f16 operands as they are, f32 operands as TF32 (the caller decides whether the user allows
/// TF32). Errors for
/// another flavor (HIP has no `mma.sync`), other operands, a kernel that gathers, or a grid past the launch limits
/// (the caller then renders the SIMT template or the generic kernel). The caller checks the architecture
/// ([`mma_arch`]).
pub fn render_gemm_mma(
    k: &KernelIr,
    v: &GemmView,
    t: MmaTile,
    splits: u32,
    flavor: Flavor,
) -> Result<GpuKernel, String> {
    check(k)?;
    if !t.well_formed() {
        return Err(format!("malformed tensor-core tile {t:?}"));
    }
    let (bm, bn, threads) = (t.bm(), t.bn(), t.threads());
    if flavor != Flavor::Cuda {
        return Err(format!("kernel {}: tensor-core tiles are CUDA's", k.name));
    }
    let ty = MmaType::of(v.operands)
        .filter(|_| v.out == DType::F32 || v.out == v.operands)
        .ok_or_else(|| format!("kernel {}: the tensor-core GEMM takes bf16, f16 or f32 (TF32) operands", k.name))?;
    if k.can_fault() {
        return Err(format!("kernel {}: a GEMM that gathers runs as the generic kernel", k.name));
    }
    let split = split_of(v, BK, splits)?;
    let (tiles_m, blocks) = grid(v, bm, bn, splits)?;
    let dialect = CudaC { flavor };
    let mut em = Emitter::new(&dialect, k);
    let epilogue = epilogue_fn(&mut em, v);
    let split_name = if splits > 1 { format!(", K split {splits} ways") } else { String::new() };
    let what = match ty {
        MmaType::Bf16 => "tensor-core GEMM",
        MmaType::F16 => "f16 tensor-core GEMM",
        MmaType::Tf32 => "TF32 tensor-core GEMM",
    };
    if v.out == DType::F16 {
        em.helpers.insert(cstyle::Helper::F16);
    }
    let mut head = format!("// kiln kernel {} ({}, {what} {bm}x{bn}x{BK}{split_name})\n", k.name, flavor.name());
    head.push_str(math::PRELUDE);
    head.push_str(&em.helpers_source());
    // Operands staged 16 bytes a load (8 halves or 4 floats, [`vector16`]).
    let vectors = [&v.a, &v.b].map(|op| vector16(op, op.cols == 1, ty));
    let (body, accs, pipelined) = body(&dialect, v, t, ty, vectors, tiles_m, split);
    head.push_str(&helpers(ty, vectors.contains(&true), pipelined));
    let (tail, workspace) = split_end(v, (bm, bn), split, blocks, &accs)?;
    let lines = epilogue.lines().chain(body.lines()).chain(tail.lines());
    Ok(assemble(k, head, threads, lines, blocks, em.uses_rng, workspace))
}

/// A `rows x cols` slice of an operand staged into shared memory: element (r, c) of the slice is the operand's
/// (`origin.0 + r`, `origin.1 + c`), in bounds below `bounds`; `load` and `shared` write the global and shared
/// element of (r, c); the operand is contiguous along the slice's columns where `along_cols`, and the shared row
/// runs along K: the slice's columns where `k_is_cols`, its rows else. `vector`: read 16 bytes a load
/// ([`vector16`]).
struct Slice<L, S> {
    rows: u32,
    cols: u32,
    along_cols: bool,
    bounds: (String, String),
    origin: (&'static str, &'static str),
    load: L,
    shared: S,
    k_is_cols: bool,
    vector: bool,
}

impl<L, S> Slice<L, S> {
    /// Whether its in-bounds vectors go to shared memory whole (read along K, into rows that run along K): one
    /// 16-byte store, or one asynchronous copy.
    fn copied_whole(&self) -> bool {
        self.vector && self.along_cols == self.k_is_cols
    }
}

/// Whether operand `op` of a `ty` product can be read 16 bytes (8 halves, or 4 floats for TF32) at a time along its
/// contiguous dimension (`cols` where `along_cols`): see `cstyle::vectorizable`.
fn vector16(op: &GemmOperand, along_cols: bool, ty: MmaType) -> bool {
    cstyle::vectorizable(op, along_cols, ty.vector_width().into())
}

/// The staging loop of slice `sl` of a `ty` product over a block of `threads` threads: 16-byte vectors (8 halves, 4
/// floats) along the contiguous dimension where `sl.vector`, each one load where all its elements are in bounds and
/// checked element loads at the edge, stored as one 16-byte store where the shared row runs the same way
/// ([`Slice::copied_whole`]) and element by element else; or one element at a time. With `async_copy`, a whole
/// vector in bounds is one `cp.async` (global to shared without registers; it lands by the caller's
/// `kiln_cp_wait1`), and only edge vectors go through registers.
fn stage<L, S>(s: &mut String, sl: &Slice<L, S>, threads: u32, ty: MmaType, async_copy: bool)
where
    L: Fn(&str, &str) -> String,
    S: Fn(&str, &str) -> String,
{
    let (rows, cols) = (sl.rows, sl.cols);
    let (o_r, o_c) = sl.origin;
    let (b_r, b_c) = (&sl.bounds.0, &sl.bounds.1);
    let elem = ty.elem();
    if !sl.vector {
        let (r, c) = if sl.along_cols {
            (format!("e / {cols}"), format!("e % {cols}"))
        } else {
            (format!("e % {rows}"), format!("e / {rows}"))
        };
        let _ = writeln!(
            s,
            "    for (int e = l; e < {}; e += {threads}) {{\n        int r = {r};\n        int c = {c};\n        \
             {elem} x = 0;\n        if ({o_r} + r < {b_r} && {o_c} + c < {b_c}) x = {};\n        {} = x;\n    }}",
            rows * cols,
            (sl.load)("r", "c"),
            (sl.shared)("r", "c"),
        );
        return;
    }
    // Vector `e` covers (r, c .. c + w - 1) along the columns, or (r .. r + w - 1, c) along the rows.
    let w = ty.vector_width();
    let (r, c, full, elem_at) = if sl.along_cols {
        let per = cols / w;
        (
            format!("e / {per}"),
            format!("(e % {per}) * {w}"),
            format!("{o_r} + r < {b_r} && {o_c} + c + {w} <= {b_c}"),
            ("r".to_string(), "c + i".to_string()),
        )
    } else {
        let per = rows / w;
        (
            format!("(e % {per}) * {w}"),
            format!("e / {per}"),
            format!("{o_r} + r + {w} <= {b_r} && {o_c} + c < {b_c}"),
            ("r + i".to_string(), "c".to_string()),
        )
    };
    let _ = writeln!(s, "    for (int e = l; e < {}; e += {threads}) {{", rows * cols / w);
    let _ = writeln!(s, "        int r = {r};\n        int c = {c};\n        uint4 x;");
    let whole = sl.copied_whole();
    if whole && async_copy {
        let (to, from) = ((sl.shared)("r", "c"), (sl.load)("r", "c"));
        let _ = writeln!(
            s,
            "        if ({full}) {{\n            kiln_cp16(&{to}, &{from});\n            continue;\n        }}"
        );
        s.push_str("        {\n");
    } else {
        let _ = writeln!(
            s,
            "        if ({full}) {{\n            x = kiln_ld16(&{});\n        }} else {{",
            (sl.load)("r", "c")
        );
    }
    let _ = writeln!(s, "            {elem} h[{w}];\n            for (int i = 0; i < {w}; i++) {{");
    let (er, ec) = &elem_at;
    let _ = writeln!(
        s,
        "                h[i] = {o_r} + {er} < {b_r} && {o_c} + {ec} < {b_c} ? {} : ({elem})0;",
        (sl.load)(er, ec)
    );
    s.push_str("            }\n            x = kiln_pack16(h);\n        }\n");
    if whole {
        let _ = writeln!(s, "        kiln_st16(&{}, x);", (sl.shared)("r", "c"));
    } else {
        let _ = writeln!(s, "        for (int i = 0; i < {w}; i++) {{ {} = kiln_part16(x, i); }}", (sl.shared)(er, ec));
    }
    s.push_str("    }\n");
}

/// The entry point's body: staging loop (over the split's K range, with one), fragments and products, then
/// (without a split) the epilogue per accumulator in bounds; the thread's accumulators; and whether the slices are
/// double-buffered with asynchronous copies.
fn body(
    d: &CudaC,
    v: &GemmView,
    t: MmaTile,
    ty: MmaType,
    [vector_a, vector_b]: [bool; 2],
    tiles_m: u64,
    split: Option<KSplit>,
) -> (String, Vec<Acc>, bool) {
    let (m, n, kk) = (v.m, v.n, v.k);
    let (bm, bn, threads) = (t.bm(), t.bn(), t.threads());
    let MmaTile { wn, fm, fn_, .. } = t;
    let frags = fm * fn_;
    let (ld, _) = ty.row();
    let elem = ty.elem();
    // The K range: all of it, or the split's (`kbeg`, `kend`, declared below).
    let (kbeg, kend) = match split {
        None => ("0".to_string(), kk.to_string()),
        Some(_) => ("kbeg".to_string(), "kend".to_string()),
    };
    // A's slice (`bm x BK`, stored `[m][k]`) and B's (`BK x bn`, stored `[n][k]`) at K offset `k0` into `sa_n` and
    // `sb_n`, each read along the operand's contiguous dimension so that a warp's loads are coalesced, 16 bytes a
    // load where the layout allows it ([`vector16`]).
    let a = Slice {
        rows: bm,
        cols: BK,
        along_cols: v.a.cols == 1,
        bounds: (m.to_string(), kend.clone()),
        origin: ("m0", "k0"),
        load: |r: &str, c: &str| at(&v.a, "abase", &format!("(m0 + {r})"), &format!("(k0 + {c})")),
        shared: |r: &str, c: &str| format!("sa_n[({r}) * {ld} + {c}]"),
        k_is_cols: true,
        vector: vector_a,
    };
    let b = Slice {
        rows: BK,
        cols: bn,
        along_cols: v.b.cols == 1,
        bounds: (kend.clone(), n.to_string()),
        origin: ("k0", "n0"),
        load: |r: &str, c: &str| at(&v.b, "bbase", &format!("(k0 + {r})"), &format!("(n0 + {c})")),
        shared: |r: &str, c: &str| format!("sb_n[({c}) * {ld} + {r}]"),
        k_is_cols: false,
        vector: vector_b,
    };
    // Double-buffered with asynchronous copies where an operand is copied whole vectors at a time and two buffers
    // fit the 48 KiB of static shared memory (TF32's at 128-row tiles do not: they stay single).
    let pipelined = (a.copied_whole() || b.copied_whole()) && 2 * t.shared_bytes(ty) <= 48 * 1024;
    let (a_len, b_len) = (bm * ld, bn * ld);
    let bufs = if pipelined { 2 } else { 1 };
    let mut s = String::new();
    // 16-byte aligned: rows of `LD` halves (80 bytes) or `LD_TF32` floats (144) keep every vector along a row so.
    let _ = writeln!(s, "__shared__ __align__(16) {elem} sa[{}]; // [m][k]", bufs * a_len);
    let _ = writeln!(s, "__shared__ __align__(16) {elem} sb[{}]; // [n][k]", bufs * b_len);
    let _ = writeln!(s, "int bz = (int)(blockIdx.y / {tiles_m}u);");
    let _ = writeln!(s, "int m0 = (int)(blockIdx.y % {tiles_m}u) * {bm};");
    match split {
        None => {
            let _ = writeln!(s, "int n0 = (int)blockIdx.x * {bn};");
        }
        Some(KSplit { chunk, .. }) => {
            let tiles_n = n.div_ceil(bn as usize);
            let _ = writeln!(s, "int ks = (int)(blockIdx.x / {tiles_n}u);");
            let _ = writeln!(s, "int n0 = (int)(blockIdx.x % {tiles_n}u) * {bn};");
            let _ = writeln!(s, "int kbeg = ks * {chunk};\nint kend = min({kk}, kbeg + {chunk});");
        }
    }
    s.push_str("int l = (int)threadIdx.x;\nint lane = l % 32;\nint warp = l / 32;\n");
    let _ = writeln!(s, "int wm = (warp / {wn}) * {};\nint wn = (warp % {wn}) * {};", 16 * fm, 8 * fn_);
    s.push_str("int g = lane >> 2;\nint q = lane & 3;\n");
    s.push_str(&operand_bases(d, v));
    let _ = writeln!(s, "float acc[{}];\nfor (int i = 0; i < {}; i++) acc[i] = 0.0f;", frags * 4, frags * 4);
    let stage_slices = |s: &mut String| {
        stage(s, &a, threads, ty, pipelined);
        stage(s, &b, threads, ty, pipelined);
    };
    let slice_at = |s: &mut String, k0: &str, buf: &str| {
        let _ = writeln!(
            s,
            "const int k0 = {k0};\n{elem}* sa_n = sa + {buf} * {a_len};\n{elem}* sb_n = sb + {buf} * {b_len};"
        );
    };
    if pipelined {
        // Slice `it + 1` is copied into one buffer while slice `it` is multiplied from the other: each thread
        // commits its copies of a slice as one group and waits for all but the newest group before the barrier that
        // makes the slice visible; the barrier after the products frees the buffer the next slice overwrites.
        s.push_str("{\n");
        slice_at(&mut s, &kbeg, "0");
        stage_slices(&mut s);
        s.push_str("}\nkiln_cp_commit();\n");
        let _ = writeln!(s, "for (int kc = {kbeg}, it = 0; kc < {kend}; kc += {BK}, it++) {{");
        let _ = writeln!(s, "if (kc + {BK} < {kend}) {{");
        slice_at(&mut s, &format!("kc + {BK}"), "((it + 1) & 1)");
        stage_slices(&mut s);
        s.push_str("}\nkiln_cp_commit();\nkiln_cp_wait1();\n");
        let _ =
            writeln!(s, "const {elem}* sa_c = sa + (it & 1) * {a_len};\nconst {elem}* sb_c = sb + (it & 1) * {b_len};");
    } else {
        let _ = writeln!(s, "for (int kc = {kbeg}; kc < {kend}; kc += {BK}) {{");
        slice_at(&mut s, "kc", "0");
        stage_slices(&mut s);
        let _ = writeln!(s, "const {elem}* sa_c = sa;\nconst {elem}* sb_c = sb;");
    }
    s.push_str("    __syncthreads();\n");
    // Per instruction: K of 16 (16-bit types: a register holds 2 adjacent K) or 8 (TF32: one each).
    let step = if ty == MmaType::Tf32 { 8 } else { 16 };
    let mma = ty.product();
    let _ = writeln!(s, "    for (int kk = 0; kk < {BK}; kk += {step}) {{");
    let _ = writeln!(s, "        unsigned int af[{fm}][4];\n        unsigned int bf[{fn_}][2];");
    if ty == MmaType::Tf32 {
        // Element by element, each rounded to TF32: A's four registers at (row, K) offsets, B's two at K offsets (the
        // module doc's m16n8k8 layout).
        let fetch = |array: &str, at: String| format!("kiln_tf32({array}[{at} + q])");
        for i in 0..fm {
            let r = format!("(wm + {} + g)", i * 16);
            for (reg, (dr, dk)) in [(0, 0), (8, 0), (0, 4), (8, 4)].into_iter().enumerate() {
                let at = format!("({r} + {dr}) * {ld} + kk + {dk}");
                let _ = writeln!(s, "        af[{i}][{reg}] = {};", fetch("sa_c", at));
            }
        }
        for j in 0..fn_ {
            let c = format!("(wn + {} + g)", j * 8);
            for (reg, dk) in [0, 4].into_iter().enumerate() {
                let _ = writeln!(s, "        bf[{j}][{reg}] = {};", fetch("sb_c", format!("{c} * {ld} + kk + {dk}")));
            }
        }
    } else {
        // `ldmatrix`: lane t gives the address of row t % 8 of 8 x 8 matrix t / 8 and receives, from matrix i, row
        // t / 4 at columns 2 (t % 4) and 2 (t % 4) + 1 in register i: the `mma` fragments' layout. A's matrices are
        // rows 0-7 and 8-15 at K 0-7, then at K 8-15 (its registers' order); B's, stored `[n][k]`, a tile's K 0-7
        // and 8-15, two tiles of 8 columns a load.
        for i in 0..fm {
            let row = format!("(wm + {} + (lane & 15)) * {ld} + kk + (lane >> 4) * 8", i * 16);
            let _ = writeln!(s, "        kiln_ldsm_x4(af[{i}], &sa_c[{row}]);");
        }
        for j in (0..fn_).step_by(2) {
            let (x, lanes) = if j + 1 < fn_ { ("x4", "(lane >> 4) * 8 + (lane & 7)") } else { ("x2", "(lane & 7)") };
            let row = format!("(wn + {} + {lanes}) * {ld} + kk + ((lane >> 3) & 1) * 8", j * 8);
            let _ = writeln!(s, "        kiln_ldsm_{x}(bf[{j}], &sb_c[{row}]);");
        }
    }
    for i in 0..fm {
        for j in 0..fn_ {
            let _ = writeln!(s, "        {mma}(&acc[{}], af[{i}], bf[{j}]);", (i * fn_ + j) * 4);
        }
    }
    s.push_str("    }\n    __syncthreads();\n}\n");
    // Accumulator e of instruction tile (i, j): row g (+ 8 for e >= 2), column 2q + (e & 1).
    let mut accs = Vec::new();
    for i in 0..fm {
        for j in 0..fn_ {
            for e in 0..4 {
                let (dr, dc) = (i * 16 + if e >= 2 { 8 } else { 0 }, j * 8 + (e & 1));
                let acc = (i * fn_ + j) * 4 + e;
                if split.is_none() {
                    let _ = writeln!(
                        s,
                        "if (m0 + wm + g + {dr} < {m} && n0 + wn + q * 2 + {dc} < {n}) \
                         {{ epilogue(bz, m0 + wm + g + {dr}, n0 + wn + q * 2 + {dc}, acc[{acc}]); }}",
                    );
                }
                accs.push(Acc {
                    row: format!("wm + g + {dr}"),
                    col: format!("wn + q * 2 + {dc}"),
                    value: format!("acc[{acc}]"),
                });
            }
        }
    }
    (s, accs, pipelined)
}
