//! The C-like renderer: kernel IR -> the source text of a C-family shading or compute language, written once and
//! lowered per target through a small [`Dialect`]. WGSL is its first dialect (`render::wgsl`); CUDA C and HIP C are
//! meant to be two more of a few hundred lines each (the shape of tinygrad's `CStyleLanguage` and cubecl's shared
//! C++ emitter).
//!
//! What is shared (this module): how a kernel's element is computed and stored ([`Emitter::element_fn`]: the
//! decomposition of the flat output index, the reduce loop nest and its fold, the outer code, the store), the one
//! table of code per instruction (`table.rs`: constants, index math, guarded loads, random numbers, every
//! unary / binary op and cast with `kernel::eval`'s semantics), and which helper functions a kernel needs
//! (`helpers.rs`, with their dependencies), and the cooperative form of long reductions and row kernels (`coop.rs`:
//! a workgroup folds each output, meeting at barriers). What a target differs in is asked of its dialect.
//!
//! # What a dialect provides
//! - **Types**: the dtype each value is computed in ([`Dialect::compute_dtype`]: WGSL narrows 64-bit values to
//!   32 bits), the register type of each ([`Dialect::reg_ty`]; f16 values live in f32 registers everywhere and are
//!   rounded after each op by the `kiln_round_f16` helper), and how a word read from or written to a buffer
//!   converts to and from a register ([`Dialect::load_word`], [`Dialect::store_word`]: WGSL stores bool and u8 as
//!   one `u32` per element).
//! - **Literals** of every computed dtype ([`Dialect::float_lit`], [`Dialect::int_lit`], [`Dialect::bool_lit`]),
//!   exact: non-finite and subnormal floats as bit patterns where the language has no literal for them.
//! - **Expressions**: `select` ([`Dialect::select`], C's `?:`), numeric conversions ([`Dialect::convert`]: an int
//!   to a float, and between ints keeping the low bits, as WGSL's `i32(u32)` and C's casts do), reinterpretation
//!   ([`Dialect::bitcast`]) and the builtin names ([`Dialect::builtin`]: `exp` in WGSL, `expf` for an f32 in CUDA).
//! - **Statements**: typed and index `let`s, a mutable accumulator, a counted `for` loop, a function header and
//!   close ([`Dialect::fn_open`]: a WGSL `fn`; a C dialect can open a lambda inside its kernel so the function sees
//!   the kernel's buffer parameters).
//! - **Helpers**: the source of each [`Helper`] ([`Dialect::helper_source`]) where the builtin does not have
//!   `kernel::eval`'s semantics (NaN-propagating max, division by zero, f16 rounding, Philox), and how a kernel
//!   reaches the rng keys ([`Dialect::rand_words`]).
//! - **The kernel around the element** stays in the dialect's module: buffer bindings or parameters, the entry
//!   point with its thread and group indices, the launch shape, and what the target refuses (`wgsl::check`).
//!   Templates that need workgroup memory and barriers (the tiled GEMM, `wgsl/gemm.rs`) use the same statements
//!   plus the dialect's shared-array and barrier syntax.
//!
//! Text written here uses only syntax that WGSL and C share: parenthesized infix arithmetic, comparisons and logic,
//! `u`-suffixed unsigned literals (`0u`, `0xffu`), array indexing, `acc = e;` and helper calls. Everything else goes
//! through the dialect.
//!
//! Rows are per computed dtype; the 64-bit rows (f64, i64) are written with the first dialect that computes in
//! them (WGSL has neither). Signed integer `+ - *` and negation are written infix and rely on two's-complement
//! wrapping, which WGSL defines; in C it is undefined behaviour on paper, so a C dialect either checks that its
//! compiler wraps (NVRTC and hiprtc do) or this table routes those rows through the unsigned type. Every per-op match names each `UnaryOp` and `BinaryOp` variant (no `_` arm), so an op
//! added to `op.rs` does not build until this table has its rows.

mod coop;
mod gemm;
mod helpers;
mod table;

pub use coop::{Coop, loop_trips};
pub use gemm::{Acc, GemmParts, GemmTile, KSplit, epilogue_fn, gemm_parts, operand_at, operand_bases, vectorizable};
pub use helpers::Helper;
pub use table::{iexpr, konst};

use crate::dtype::DType;
use crate::kernel::{IExpr, Inst, InstOp, KernelIr};
use std::collections::BTreeSet;
use std::fmt::Write;

/// A builtin function whose target spelling the dialect chooses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Builtin {
    Abs,
    Exp,
    Log,
    Sqrt,
    Max,
    Min,
    Floor,
    Ceil,
    /// To nearest, ties to even.
    RoundEven,
    Trunc,
}

/// What one C-like target differs in (see the module doc for each group).
pub trait Dialect {
    /// The dtype a value of `d` is computed in.
    fn compute_dtype(&self, d: DType) -> DType;
    /// The register type of a value of computed dtype `d`.
    fn reg_ty(&self, d: DType) -> &'static str;
    /// The dtype of index arithmetic: loop variables and `IExpr`s.
    fn index_dtype(&self) -> DType;
    /// The register value of `word`, read from a buffer of `d`.
    fn load_word(&self, d: DType, word: &str) -> String;
    /// The word to store for register value `v` of dtype `d`.
    fn store_word(&self, d: DType, v: &str) -> String;

    /// A float literal of computed dtype `d` with exactly the value `x` rounded to `d`.
    fn float_lit(&self, x: f64, d: DType) -> String;
    /// An integer literal of computed dtype `d` with the value `x` wrapped to `d`.
    fn int_lit(&self, x: i64, d: DType) -> String;
    fn bool_lit(&self, b: bool) -> String {
        b.to_string()
    }

    /// `t` where `c` holds, else `f`.
    fn select(&self, f: &str, t: &str, c: &str) -> String;
    /// The remainder of integers `x` and `y` of computed dtype `d`, truncated as C's `%` (the sign of `x`); `y` is
    /// never zero here.
    fn int_rem(&self, x: &str, y: &str, _d: DType) -> String {
        format!("{x} % {y}")
    }
    /// `v` converted to dtype `to`: ints to floats by value, between ints keeping the low bits.
    fn convert(&self, to: DType, v: &str) -> String;
    /// The bits of `v` read as dtype `to` (of the same width).
    fn bitcast(&self, to: DType, v: &str) -> String;
    /// The name of `f` on values of computed dtype `d`.
    fn builtin(&self, f: Builtin, d: DType) -> &'static str;

    /// `name = e`, immutable, of computed dtype `d`.
    fn let_value(&self, name: &str, d: DType, e: &str) -> String;
    /// `name = e`, immutable, of the index dtype.
    fn let_index(&self, name: &str, e: &str) -> String;
    /// `name = init`, mutable, of computed dtype `d`.
    fn var_value(&self, name: &str, d: DType, init: &str) -> String;
    /// Opens `for var in 0..extent` (the index dtype).
    fn for_open(&self, var: &str, extent: usize) -> String;
    /// Opens a function `name(params)` returning nothing, whose body may read and write the kernel's buffers.
    fn fn_open(&self, name: &str, params: &[(&str, DType)]) -> String;
    /// Closes what `fn_open` opened.
    fn fn_close(&self) -> &'static str;
    /// Opens `for (var = init; var < end; var += step)` (the index dtype).
    fn for_step_open(&self, var: &str, init: &str, end: &str, step: &str) -> String;

    /// Declares an array of `len` values of dtype `d` shared by a workgroup (a CUDA block).
    fn workgroup_array(&self, name: &str, d: DType, len: usize) -> String;
    /// Waits for every invocation of the workgroup, making their workgroup-memory writes visible.
    fn barrier(&self) -> &'static str;
    /// The workgroup's id along `axis` (0 = x, 1 = y), an unsigned value the entry point declares.
    fn group_id(&self, axis: usize) -> &'static str;
    /// The invocation's index inside its workgroup, an unsigned value the entry point declares.
    fn local_index(&self) -> &'static str;

    /// Four consecutive elements of a buffer of `d`, `first` and the three after it (`first` an element expression
    /// `in<b>[i]` with `i` a multiple of 4 in a buffer aligned to 4 elements), read as one vector load and assigned,
    /// widened to f32, to the mutable f32 values `<into>0` .. `<into>3`: statements for a block of their own (they
    /// may declare a value `w`). `None` where the target reads one element a load (WGSL: its storage buffers are
    /// arrays of scalars).
    fn load4(&self, _d: DType, _first: &str, _into: &str) -> Option<String> {
        None
    }

    /// The source of helper `h` (without its dependencies, which `Helper::deps` names).
    fn helper_source(&self, h: Helper) -> &'static str;
    /// The four Philox words of element `index` (an index expression) of rng slot `slot`.
    fn rand_words(&self, slot: usize, index: &str) -> String;
}

/// Renders one kernel's code in dialect `D`: what the table entries used (helpers, rng) is collected as they are
/// written, for the dialect to declare.
pub struct Emitter<'a, D: Dialect> {
    pub d: &'a D,
    pub k: &'a KernelIr,
    pub helpers: BTreeSet<Helper>,
    pub uses_rng: bool,
    /// Inputs read through `out` (a donated input: see `wgsl::render_aliased`).
    pub aliased: Vec<usize>,
}

impl<'a, D: Dialect> Emitter<'a, D> {
    pub fn new(d: &'a D, k: &'a KernelIr) -> Self {
        Emitter { d, k, helpers: BTreeSet::new(), uses_rng: false, aliased: Vec::new() }
    }

    /// The source of every helper used so far, dependencies first, each once (call after rendering the body).
    pub fn helpers_source(&self) -> String {
        let mut s = String::new();
        let mut done = BTreeSet::new();
        for h in &self.helpers {
            helpers::write(self.d, &mut s, *h, &mut done);
        }
        s
    }

    /// `element(flat)`: computes and stores output element `flat` (row-major over the output loops), with the
    /// whole reduction inside. A row kernel's element also takes its row's reductions (`row0`, `row1`, ..), which
    /// [`Emitter::row_fn`] folds.
    pub fn element_fn(&mut self) -> String {
        self.element_fn_with(false)
    }

    /// [`Emitter::element_fn`]; with `acc_param`, `element(flat, acc)` takes the finished reduction instead of
    /// folding it (a cooperative kernel folds it over the workgroup: `coop.rs`).
    fn element_fn_with(&mut self, acc_param: bool) -> String {
        let (d, k) = (self.d, self.k);
        let names: Vec<String> = (0..k.rows.len()).map(|j| format!("row{j}")).collect();
        let mut params = vec![("flat", d.index_dtype())];
        params.extend(names.iter().zip(&k.rows).map(|(n, r)| (n.as_str(), d.compute_dtype(r.dtype))));
        if let (true, Some(r)) = (acc_param, &k.reduce) {
            params.push(("acc", d.compute_dtype(r.dtype)));
        }
        let mut s = format!("\n{}\n", d.fn_open("element", &params));
        self.decompose(&mut s, "flat", &k.out_extents);
        if let (false, Some(r)) = (acc_param, &k.reduce) {
            self.fold_loop(&mut s, r, "acc", "r");
        }
        self.insts(&mut s, &k.outer, "v", "    ");
        let stored = d.store_word(k.output.dtype, &format!("v{}", k.result));
        let _ = writeln!(s, "    out[flat] = {stored};\n{}", d.fn_close());
        s
    }

    /// `row(r)`, for a row kernel: folds row `r`'s reductions (row-major over the first `row_rank` output loops),
    /// then computes each of its elements with [`Emitter::element_fn`]'s `element`.
    pub fn row_fn(&mut self) -> String {
        let (d, k) = (self.d, self.k);
        let mut s = format!("\n{}\n", d.fn_open("row", &[("r", d.index_dtype())]));
        self.decompose(&mut s, "r", &k.out_extents[..k.row_rank]);
        for (j, r) in k.rows.iter().enumerate() {
            self.fold_loop(&mut s, r, &format!("row{j}"), &format!("p{j}_"));
        }
        let per_row: usize = k.out_extents[k.row_rank..].iter().product();
        let rows: Vec<String> = (0..k.rows.len()).map(|j| format!(", row{j}")).collect();
        let _ = writeln!(s, "    {}", d.for_open("c", per_row));
        let _ = writeln!(s, "        element(r * {per_row} + c{});", rows.concat());
        let _ = writeln!(s, "    }}\n{}", d.fn_close());
        s
    }

    /// `let`s of the loop variables of `extents` (output loops 0..) that any instruction reads, from their row-major
    /// offset `flat`.
    fn decompose(&self, s: &mut String, flat: &str, extents: &[usize]) {
        let strides = crate::shape::contiguous_strides(extents);
        for (v, (&e, &st)) in extents.iter().zip(&strides).enumerate() {
            if !self.mentions(v) {
                continue;
            }
            let expr = match (v, st) {
                (0, 1) => flat.to_string(),
                (0, st) => format!("{flat} / {st}"),
                (_, 1) => format!("{flat} % {e}"),
                _ => format!("({flat} / {st}) % {e}"),
            };
            let _ = writeln!(s, "    {}", self.d.let_index(&format!("i{v}"), &expr));
        }
    }

    /// `var <acc> = identity;` and the loop nest folding `r`'s inner code (values named `<prefix><i>`) into it.
    fn fold_loop(&mut self, s: &mut String, r: &crate::kernel::Reduce, acc: &str, prefix: &str) {
        let d = self.d;
        let rank = self.k.out_rank();
        let rd = d.compute_dtype(r.dtype);
        let _ = writeln!(s, "    {}", d.var_value(acc, rd, &konst(d, r.op.identity(r.dtype), r.dtype)));
        let mut indent = String::from("    ");
        for (j, e) in r.extents.iter().enumerate() {
            let _ = writeln!(s, "{indent}{}", d.for_open(&format!("i{}", rank + j), *e));
            indent.push_str("    ");
        }
        self.insts(s, &r.inner, prefix, &indent);
        let folded = self.binary(r.op.fold(), r.dtype, acc, &format!("{prefix}{}", r.value));
        let _ = writeln!(s, "{indent}{acc} = {folded};");
        for _ in &r.extents {
            indent.truncate(indent.len() - 4);
            let _ = writeln!(s, "{indent}}}");
        }
    }

    /// Whether any instruction reads loop variable `v` (output variables only decomposed when used).
    fn mentions(&self, v: usize) -> bool {
        let k = self.k;
        let insts = k.outer.iter().chain(k.reduce.iter().chain(&k.rows).flat_map(|r| r.inner.iter()));
        insts.flat_map(Inst::indices).any(|e| mentions_var(e, v))
    }

    /// One `let` per instruction, named `<prefix><index>`.
    pub fn insts(&mut self, s: &mut String, insts: &[Inst], prefix: &str, indent: &str) {
        for (i, inst) in insts.iter().enumerate() {
            let e = self.inst(inst, insts, prefix);
            let line = self.d.let_value(&format!("{prefix}{i}"), self.d.compute_dtype(inst.dtype), &e);
            let _ = writeln!(s, "{indent}{line}");
        }
    }

    /// Notes that `h` is used; returns `e` (the call).
    pub(crate) fn helper(&mut self, h: Helper, e: String) -> String {
        self.helpers.insert(h);
        e
    }
}

/// Whether index expression `e` reads loop variable `v`.
pub fn mentions_var(e: &IExpr, v: usize) -> bool {
    match e {
        IExpr::Var(x) => *x == v,
        IExpr::Const(_) => false,
        IExpr::Add(ts) => ts.iter().any(|t| mentions_var(t, v)),
        IExpr::Mul(x, _) | IExpr::Div(x, _) | IExpr::Mod(x, _) | IExpr::Wrap(x, _) => mentions_var(x, v),
    }
}

/// Checks that a target computing 64-bit values in 32 bits (WGSL) can run `k`: no buffer or accumulator of f64, i64
/// or bf16, every 64-bit constant fits its narrowed type, and [`check_i32_indices`]. `target` names the language in
/// errors.
pub fn check_narrowed(k: &KernelIr, target: &str) -> Result<(), String> {
    let insts = k.outer.iter().chain(k.reduce.iter().chain(&k.rows).flat_map(|r| r.inner.iter()));
    let dtypes =
        k.inputs.iter().map(|b| b.dtype).chain([k.output.dtype]).chain(k.reduce.iter().chain(&k.rows).map(|r| r.dtype));
    for d in dtypes {
        if matches!(d, DType::F64 | DType::I64 | DType::BF16) {
            return Err(format!(
                "kernel {} uses {d}, which kiln's {target} kernels cannot hold (no 64-bit or bf16 types); run it on \
                 Device::cpu() or use {}",
                k.name,
                if d.is_float() { "f32" } else { "i32" }
            ));
        }
    }
    for inst in insts {
        if let (InstOp::Const(c), DType::I64) = (&inst.op, inst.dtype)
            && i32::try_from(c.as_i64()).is_err()
        {
            return Err(format!("kernel {}: the index constant {c} leaves the i32 range", k.name));
        }
    }
    check_i32_indices(k)
}

/// Checks that every buffer of `k` has fewer than 2^31 elements and every index expression stays in i32 (the index
/// dtype of the C-like dialects).
pub fn check_i32_indices(k: &KernelIr) -> Result<(), String> {
    let insts = k.outer.iter().chain(k.reduce.iter().chain(&k.rows).flat_map(|r| r.inner.iter()));
    let extents = k.extents();
    let total: usize = k.out_extents.iter().product();
    if total > i32::MAX as usize || k.inputs.iter().chain([&k.output]).any(|b| b.len > i32::MAX as usize) {
        return Err(format!("kernel {}: buffers of more than 2^31 elements", k.name));
    }
    for inst in insts {
        for e in inst.indices() {
            if !fits_i32(e, &extents) {
                return Err(format!("kernel {}: index expression {e} leaves the i32 range", k.name));
            }
        }
    }
    Ok(())
}

/// Whether `e` and every sub-expression stay within i32 over the loop ranges.
fn fits_i32(e: &IExpr, extents: &[usize]) -> bool {
    let (lo, hi) = e.bounds(extents);
    let ok = lo >= i32::MIN as i64 && hi <= i32::MAX as i64;
    ok && match e {
        IExpr::Var(_) | IExpr::Const(_) => true,
        IExpr::Add(ts) => ts.iter().all(|t| fits_i32(t, extents)),
        IExpr::Mul(x, _) | IExpr::Div(x, _) | IExpr::Mod(x, _) | IExpr::Wrap(x, _) => fits_i32(x, extents),
    }
}
