//! Element types, scalars and PyTorch's type-promotion rules.
//!
//! `DType` is the closed set of element types the graph IR knows. The two 16-bit floats, f16 and bf16, are storage
//! formats: every op computes in f32 and rounds its result once (reductions and matmuls accumulate in f32, as
//! PyTorch does); the interpreter computes in f64 and rounds per op ([`bf16_from_f64`] for bf16).

use std::fmt;

/// An element type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    Bool,
    U8,
    /// Unsigned 32-bit: C-like wrapping arithmetic; division, remainder, comparisons, min/max and conversions to
    /// and from floats are unsigned.
    U32,
    I32,
    I64,
    /// IEEE binary16. Every op's result is rounded to f16; reductions and matmuls accumulate in f32 (as PyTorch
    /// does) and round once.
    F16,
    F32,
    F64,
    /// bfloat16 (f32's exponent, 8 significant bits). As f16: results rounded to bf16 (ties to even, as PyTorch),
    /// reductions and matmuls accumulated in f32. Promotes with f16 to f32, as `torch.promote_types`.
    BF16,
}

/// The three promotion categories, ordered: a higher category always wins.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Category {
    Bool,
    Int,
    Float,
}

impl DType {
    pub const ALL: [DType; 9] =
        [DType::Bool, DType::U8, DType::U32, DType::I32, DType::I64, DType::F16, DType::F32, DType::F64, DType::BF16];

    pub fn size_of(self) -> usize {
        match self {
            DType::Bool | DType::U8 => 1,
            DType::F16 | DType::BF16 => 2,
            DType::U32 | DType::I32 | DType::F32 => 4,
            DType::I64 | DType::F64 => 8,
        }
    }

    pub fn category(self) -> Category {
        match self {
            DType::Bool => Category::Bool,
            DType::U8 | DType::U32 | DType::I32 | DType::I64 => Category::Int,
            DType::F16 | DType::BF16 | DType::F32 | DType::F64 => Category::Float,
        }
    }

    pub fn is_float(self) -> bool {
        self.category() == Category::Float
    }

    pub fn is_int(self) -> bool {
        self.category() == Category::Int
    }

    /// f16 or bf16: a 16-bit float stored as such and computed in f32, each result rounded once.
    pub fn is_half(self) -> bool {
        matches!(self, DType::F16 | DType::BF16)
    }

    /// Whether comparisons, division, min/max and float conversions of this dtype are unsigned (bool counts: it
    /// is 0 or 1).
    pub fn is_unsigned(self) -> bool {
        matches!(self, DType::Bool | DType::U8 | DType::U32)
    }

    /// The dtype PyTorch picks for a Python scalar of this category when it must widen a tensor's category
    /// (`int_tensor + 0.5` is f32, `bool_tensor + 1` is i64).
    pub fn default_for(cat: Category) -> DType {
        match cat {
            Category::Bool => DType::Bool,
            Category::Int => DType::I64,
            Category::Float => DType::F32,
        }
    }

    /// (min, max) of an integer or bool dtype, as i64: the identities of max and min reductions.
    pub fn int_range(self) -> (i64, i64) {
        match self {
            DType::Bool => (0, 1),
            DType::U8 => (0, u8::MAX as i64),
            DType::U32 => (0, u32::MAX as i64),
            DType::I32 => (i32::MIN as i64, i32::MAX as i64),
            _ => (i64::MIN, i64::MAX),
        }
    }

    /// Wraps an integer to this dtype's width as C does (bool: non-zero is 1), returned as i64.
    pub fn wrap_int(self, x: i64) -> i64 {
        match self {
            DType::Bool => (x != 0) as i64,
            DType::U8 => x as u8 as i64,
            DType::U32 => x as u32 as i64,
            DType::I32 => x as i32 as i64,
            _ => x,
        }
    }

    /// A stable small number for signatures and cache keys. Never reorder: keys on disk depend on it.
    pub fn code(self) -> u64 {
        match self {
            DType::Bool => 1,
            DType::U8 => 2,
            DType::I32 => 3,
            DType::I64 => 4,
            DType::F32 => 5,
            DType::F64 => 6,
            DType::U32 => 7,
            DType::F16 => 8,
            DType::BF16 => 9,
        }
    }

    /// The dtype of a [`DType::code`] (`None` for a code no dtype has).
    pub fn from_code(code: u64) -> Option<DType> {
        DType::ALL.into_iter().find(|d| d.code() == code)
    }

    pub fn name(self) -> &'static str {
        match self {
            DType::Bool => "bool",
            DType::U8 => "u8",
            DType::U32 => "u32",
            DType::I32 => "i32",
            DType::I64 => "i64",
            DType::F16 => "f16",
            DType::F32 => "f32",
            DType::F64 => "f64",
            DType::BF16 => "bf16",
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Promotion of two dtypes of equal priority (both dimensioned tensors, say), as `torch.promote_types`.
pub fn promote(a: DType, b: DType) -> DType {
    use DType::*;
    if a == b {
        return a;
    }
    match (a.category(), b.category()) {
        (ca, cb) if ca != cb => {
            if ca > cb {
                a
            } else {
                b
            }
        }
        // Same category, different types: the wider one. An unsigned int with a signed one widens to the smallest
        // signed type that holds both, which is PyTorch's rule: u8 + i32 -> i32, u32 + i32 -> i64, u32 + i64 -> i64
        // (there is no i8/i16 here, so no u8 + i8 -> i16 case).
        _ => match (a, b) {
            (F32, F64) | (F64, F32) | (F16, F64) | (F64, F16) | (BF16, F64) | (F64, BF16) => F64,
            // f16 and bf16 hold each other's values in neither direction: both widen to f32.
            (F16, F32) | (F32, F16) | (BF16, F32) | (F32, BF16) | (F16, BF16) | (BF16, F16) => F32,
            (U8, x) | (x, U8) => x,
            (U32, I32) | (I32, U32) | (U32, I64) | (I64, U32) => I64,
            (I32, I64) | (I64, I32) => I64,
            _ => unreachable!("promote: {a} {b}"),
        },
    }
}

/// How strongly an operand's dtype takes part in promotion, as PyTorch's `result_type`: dimensioned tensors beat
/// zero-dimensional tensors, which beat Rust scalars ("wrapped numbers"). A lower priority operand only matters when
/// its category is higher than every higher-priority operand's.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Priority {
    Scalar,
    ZeroDim,
    Tensor,
}

/// PyTorch's `result_type` over operands given as (dtype, priority).
pub fn result_type(operands: &[(DType, Priority)]) -> DType {
    let best =
        |p: Priority| -> Option<DType> { operands.iter().filter(|(_, q)| *q == p).map(|(d, _)| *d).reduce(promote) };
    let mut result: Option<DType> = None;
    for p in [Priority::Tensor, Priority::ZeroDim, Priority::Scalar] {
        let Some(d) = best(p) else { continue };
        result = Some(match result {
            None => d,
            Some(r) if d.category() > r.category() => {
                // A wrapped number widens the category to the default dtype of that category; a zero-dim tensor
                // widens to its own dtype.
                if p == Priority::Scalar { DType::default_for(d.category()) } else { d }
            }
            Some(r) => r,
        });
    }
    // A lone scalar: Rust f64 literal -> the default float dtype, as a Python float would.
    match result {
        Some(r) if operands.iter().all(|(_, p)| *p == Priority::Scalar) => DType::default_for(r.category()),
        Some(r) => r,
        None => DType::F32,
    }
}

/// A scalar value. Floats are carried as f64 and ints as i64 whatever the node dtype; the node's dtype says how
/// the value is rounded or wrapped.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Scalar {
    Bool(bool),
    Int(i64),
    Float(f64),
}

impl Scalar {
    /// The dtype a Rust literal of this kind has on its own (f64 -> f32 as Python floats do in PyTorch).
    pub fn natural_dtype(self) -> DType {
        match self {
            Scalar::Bool(_) => DType::Bool,
            Scalar::Int(_) => DType::I64,
            Scalar::Float(_) => DType::F32,
        }
    }

    pub fn as_f64(self) -> f64 {
        match self {
            Scalar::Bool(b) => b as i64 as f64,
            Scalar::Int(i) => i as f64,
            Scalar::Float(f) => f,
        }
    }

    /// Integer value with C-like conversion from float (saturating, NaN -> 0, as Rust's `as`).
    pub fn as_i64(self) -> i64 {
        match self {
            Scalar::Bool(b) => b as i64,
            Scalar::Int(i) => i,
            Scalar::Float(f) => f as i64,
        }
    }

    /// Whether every bit of the value is zero (`+0.0`, `0`, `false`): what a masked load yields outside its
    /// ranges, so a padding with it needs no select (`-0.0` is not: its sign would be lost).
    pub fn is_zero_bits(self) -> bool {
        match self {
            Scalar::Bool(b) => !b,
            Scalar::Int(i) => i == 0,
            Scalar::Float(f) => f.to_bits() == 0,
        }
    }

    /// A stable 64-bit encoding for signatures (the value's bits, with its kind).
    pub fn key(self) -> [u64; 2] {
        match self {
            Scalar::Bool(b) => [1, b as u64],
            Scalar::Int(i) => [2, i as u64],
            Scalar::Float(f) => [3, f.to_bits()],
        }
    }

    /// The scalar of a [`Scalar::key`] (`None` for a kind no scalar has).
    pub fn from_key([kind, bits]: [u64; 2]) -> Option<Scalar> {
        match kind {
            1 if bits <= 1 => Some(Scalar::Bool(bits == 1)),
            2 => Some(Scalar::Int(bits as i64)),
            3 => Some(Scalar::Float(f64::from_bits(bits))),
            _ => None,
        }
    }
}

impl fmt::Display for Scalar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Scalar::Bool(b) => write!(f, "{b}"),
            Scalar::Int(i) => write!(f, "{i}"),
            Scalar::Float(x) => write!(f, "{x:?}"),
        }
    }
}

macro_rules! scalar_from {
    ($($t:ty => $v:ident as $c:ty),*) => {$(
        impl From<$t> for Scalar {
            fn from(x: $t) -> Self { Scalar::$v(x as $c) }
        }
    )*};
}
scalar_from!(f64 => Float as f64, f32 => Float as f64, i64 => Int as i64, i32 => Int as i64, u8 => Int as i64,
    u32 => Int as i64, usize => Int as i64);
impl From<half::f16> for Scalar {
    fn from(x: half::f16) -> Self {
        Scalar::Float(x.to_f64())
    }
}
impl From<half::bf16> for Scalar {
    fn from(x: half::bf16) -> Self {
        Scalar::Float(x.to_f64())
    }
}

/// `x` as bf16 the way PyTorch converts an f64: to f32 (nearest, ties to even), then to bf16 (nearest, ties to even;
/// NaN stays NaN, overflow is infinity). Two roundings, so a value just past a bf16 tie can land on the tie and go
/// to even (`1 + 2^-8 + 2^-52` becomes 1.0), which is what `torch.tensor(x, dtype=float64).to(bfloat16)` gives. For
/// `+ - * /` and `sqrt` of bf16 operands the f64 result rounds to the same bf16 as the f32 one the kernels compute
/// (f64 has more than 2 * 24 + 2 bits and f32 more than 2 * 8 + 2).
pub fn bf16_from_f64(x: f64) -> half::bf16 {
    half::bf16::from_f32(x as f32)
}

impl From<bool> for Scalar {
    fn from(b: bool) -> Self {
        Scalar::Bool(b)
    }
}

#[cfg(test)]
mod tests {
    use super::DType::*;
    use super::*;

    /// f64 -> bf16 against `torch.tensor([x], dtype=torch.float64).to(torch.bfloat16)` printed as bits in
    /// PyTorch 2.15.
    #[test]
    fn bf16_rounding_matches_pytorch() {
        let cases: [(f64, u16); 14] = [
            (1.0, 0x3f80),
            (1.00390625, 0x3f80),         // exactly halfway 1 and 1 + 2^-7: ties to even (down)
            (1.01171875, 0x3f82),         // halfway 1 + 2^-7 and 1 + 2^-6: ties to even (up)
            (1.0039062500000002, 0x3f80), // just past a tie: f32 lands on it, then ties to even
            (-1.0039062500000002, 0xbf80),
            (3.3895313892515355e38, 0x7f7f), // bf16 max
            (3.3961775292304547e38, 0x7f80), // past max + half an ulp: inf
            (f64::INFINITY, 0x7f80),
            (f64::NEG_INFINITY, 0xff80),
            (-0.0, 0x8000),
            (9.183549615799121e-41, 0x0001), // smallest bf16 subnormal
            (4.591774807899561e-41, 0x0000), // half of it: ties to even, zero
            (4.591774807899562e-41, 0x0000), // just past that tie: through f32, as above
            (1e-50, 0x0000),
        ];
        for (x, bits) in cases {
            assert_eq!(bf16_from_f64(x).to_bits(), bits, "{x:e}");
        }
        assert!(bf16_from_f64(f64::NAN).is_nan());
    }

    #[test]
    fn promotion_matches_pytorch() {
        assert_eq!(promote(U8, I32), I32);
        assert_eq!(promote(Bool, U8), U8);
        assert_eq!(promote(I64, F32), F32);
        assert_eq!(promote(F32, F64), F64);
        // torch.promote_types: uint32 with int32 or int64 -> int64; with uint8 or bool -> uint32; with a float ->
        // the float.
        assert_eq!(promote(U32, I32), I64);
        assert_eq!(promote(I32, U32), I64);
        assert_eq!(promote(U32, I64), I64);
        assert_eq!(promote(U8, U32), U32);
        assert_eq!(promote(Bool, U32), U32);
        assert_eq!(promote(U32, F32), F32);
        // u32 tensor + int scalar stays u32; i32 0-dim with a u32 tensor: same category, the tensor wins.
        assert_eq!(result_type(&[(U32, Priority::Tensor), (I64, Priority::Scalar)]), U32);
        assert_eq!(result_type(&[(U32, Priority::Tensor), (I32, Priority::ZeroDim)]), U32);
        assert_eq!(result_type(&[(U32, Priority::Tensor), (F32, Priority::Scalar)]), F32);
        // f16: the wider float wins; an f16 tensor keeps its dtype with a Python float, an int tensor, or a
        // 0-dim f32.
        assert_eq!(promote(F16, F32), F32);
        assert_eq!(promote(F64, F16), F64);
        assert_eq!(promote(I64, F16), F16);
        assert_eq!(result_type(&[(F16, Priority::Tensor), (F32, Priority::Scalar)]), F16);
        assert_eq!(result_type(&[(F16, Priority::Tensor), (F32, Priority::ZeroDim)]), F16);
        assert_eq!(result_type(&[(I32, Priority::Tensor), (F16, Priority::ZeroDim)]), F16);
        // bf16: with f16 -> f32 (torch.promote_types(bfloat16, float16)), with f32 or f64 the wider, ints keep it.
        assert_eq!(promote(BF16, F16), F32);
        assert_eq!(promote(F16, BF16), F32);
        assert_eq!(promote(BF16, F32), F32);
        assert_eq!(promote(F64, BF16), F64);
        assert_eq!(promote(I64, BF16), BF16);
        assert_eq!(promote(Bool, BF16), BF16);
        assert_eq!(result_type(&[(BF16, Priority::Tensor), (F32, Priority::Scalar)]), BF16);
        assert_eq!(result_type(&[(BF16, Priority::Tensor), (F16, Priority::ZeroDim)]), BF16);
        assert_eq!(result_type(&[(BF16, Priority::Tensor), (F16, Priority::Tensor)]), F32);
        // torch.ones(2, dtype=int32) + 2.5 -> float32; bool + 1 -> int64; u8 + 1000 stays u8.
        assert_eq!(result_type(&[(I32, Priority::Tensor), (F32, Priority::Scalar)]), F32);
        assert_eq!(result_type(&[(Bool, Priority::Tensor), (I64, Priority::Scalar)]), I64);
        assert_eq!(result_type(&[(U8, Priority::Tensor), (I64, Priority::Scalar)]), U8);
        assert_eq!(result_type(&[(F64, Priority::Tensor), (F32, Priority::Scalar)]), F64);
        // Zero-dim tensors: f32 [2] + f64 0-dim -> f32; i32 [2] + f64 0-dim -> f64.
        assert_eq!(result_type(&[(F32, Priority::Tensor), (F64, Priority::ZeroDim)]), F32);
        assert_eq!(result_type(&[(I32, Priority::Tensor), (F64, Priority::ZeroDim)]), F64);
        assert_eq!(result_type(&[(I32, Priority::ZeroDim), (I64, Priority::ZeroDim)]), I64);
    }
}
