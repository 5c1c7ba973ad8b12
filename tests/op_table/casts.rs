//! The op table's casts: `to_dtype` for every (source, target) pair.

use super::*;

/// The conversion of one value, as Rust's `as`: floats to ints truncate toward zero (NaN -> 0, out of range
/// saturates), ints wrap (two's complement, as PyTorch), anything to bool is `!= 0` (NaN is true), ints to floats
/// round to nearest. The table feeds float -> int casts only values in the target's range, NaN, and out-of-range
/// values for i64 (see `cast` for why).
pub(super) fn cast_ref(src: &HostBuffer, dst: DType) -> HostBuffer {
    let ints: Option<Vec<i64>> = match src {
        HostBuffer::Bool(v) => Some(v.iter().map(|&x| x as i64).collect()),
        HostBuffer::U8(v) => Some(v.iter().map(|&x| x as i64).collect()),
        HostBuffer::U32(v) => Some(v.iter().map(|&x| x as i64).collect()),
        HostBuffer::I32(v) => Some(v.iter().map(|&x| x as i64).collect()),
        HostBuffer::I64(v) => Some(v.to_vec()),
        _ => None,
    };
    if let Some(v) = ints {
        return match dst {
            Bool => HostBuffer::Bool(v.iter().map(|&x| x != 0).collect()),
            U8 => HostBuffer::U8(v.iter().map(|&x| x as u8).collect()),
            U32 => HostBuffer::U32(v.iter().map(|&x| x as u32).collect()),
            I32 => HostBuffer::I32(v.iter().map(|&x| x as i32).collect()),
            I64 => HostBuffer::I64(v.into()),
            F16 => HostBuffer::F16(v.iter().map(|&x| f16::from_f64(x as f64)).collect()),
            F32 => HostBuffer::F32(v.iter().map(|&x| x as f32).collect()),
            F64 => HostBuffer::F64(v.iter().map(|&x| x as f64).collect()),
            // PyTorch's int -> bf16: to f32 (nearest), then to bf16.
            BF16 => HostBuffer::BF16(v.iter().map(|&x| kiln::bf16::from_f32(x as f32)).collect()),
        };
    }
    let v = values(src);
    match dst {
        Bool => HostBuffer::Bool(v.iter().map(|&x| x != 0.0).collect()),
        U8 => HostBuffer::U8(v.iter().map(|&x| x as u8).collect()),
        U32 => HostBuffer::U32(v.iter().map(|&x| x as u32).collect()),
        I32 => HostBuffer::I32(v.iter().map(|&x| x as i32).collect()),
        I64 => HostBuffer::I64(v.iter().map(|&x| x as i64).collect()),
        F16 => HostBuffer::F16(v.iter().map(|&x| f16::from_f64(x)).collect()),
        F32 => HostBuffer::F32(v.iter().map(|&x| x as f32).collect()),
        F64 => HostBuffer::F64(v.into()),
        BF16 => HostBuffer::BF16(v.iter().map(|&x| kiln_jit::dtype::bf16_from_f64(x)).collect()),
    }
}

/// Float values to cast to `dst`: all in `dst`'s range (a float outside an int type's range is undefined in
/// PyTorch, and kiln's engines and docs disagree there, see the report in `cast`).
pub(super) fn float_cast_values(src: DType, dst: DType) -> Vec<f64> {
    let mut v = vec![0.0, -0.0, 0.4, 1.5, 2.7, 100.9, 255.99];
    if !dst.is_unsigned() {
        v.extend([-0.4, -2.7, -100.9, 1e5, -1e5]);
    }
    if dst == U32 {
        v.extend([1e5, 65535.5, 2_147_483_648.0, 4_000_000_000.0, 4_294_967_040.0]);
    }
    if src.is_half() && dst.is_int() {
        // In f16, 255.99 is 256 and 1e5 is inf (in bf16, 255.99 is 256 too): outside the target's range once the
        // input is rounded.
        let (lo, hi) = match dst {
            U8 => (0.0, 255.0),
            U32 => (0.0, u32::MAX as f64),
            I32 => (i32::MIN as f64, i32::MAX as f64),
            _ => (f64::MIN, f64::MAX),
        };
        let rounded =
            |x: f64| if src == F16 { f16::from_f64(x).to_f64() } else { kiln_jit::dtype::bf16_from_f64(x).to_f64() };
        v.retain(|&x| (lo..=hi).contains(&rounded(x)));
    }
    if dst.is_float() || dst == Bool {
        v.extend([INF, -INF, NAN, 0.1, 1e-40, 16_777_217.0, 3.4e38]);
        if src == F64 {
            v.extend([1e300, -1e-50, 1e-50, 0.1 + 0.2, -1e300]);
        }
    }
    v
}

pub(super) fn cast(t: &mut Table) {
    let int_sources: [HostBuffer; 5] = [
        HostBuffer::Bool(vec![true, false, true].into()),
        HostBuffer::U8(vec![0, 1, 7, 128, 200, 255].into()),
        // Above 2^31 (negative as i32) and above 2^24 (rounded as f32), to catch signed conversions.
        HostBuffer::U32(vec![0, 1, 7, 255, 256, 65_535, 16_777_217, 1 << 31, 3_000_000_001, u32::MAX].into()),
        HostBuffer::I32(vec![0, 1, -1, 7, 300, -300, 100_000, i32::MIN, i32::MAX].into()),
        HostBuffer::I64(vec![0, 1, -1, 300, -3, (1 << 33) + 5, 16_777_217, i64::MIN, i64::MAX].into()),
    ];
    for src_dtype in ALL_DTYPES {
        for dst in ALL_DTYPES {
            let src = match src_dtype {
                F16 | BF16 | F32 | F64 => buffer(src_dtype, &float_cast_values(src_dtype, dst)),
                d => int_sources.iter().find(|b| b.dtype() == d).expect("an int source").clone(),
            };
            let n = src.len();
            let want = cast_ref(&src, dst);
            t.check(
                "to_dtype",
                &format!("-> {dst}"),
                vec![In::buf(&[n], src)],
                move |a| a[0].to_dtype(dst),
                Want::buf(&[n], want, Kind::Exact),
            );
            // Zero-dim and size-0 tensors, for every pair.
            let one = cast_ref(&buffer(src_dtype, &[1.0]), dst);
            t.check(
                "to_dtype",
                &format!("-> {dst}"),
                vec![In::new(src_dtype, &[], &[1.0])],
                move |a| a[0].to_dtype(dst),
                Want::buf(&[], one.clone(), Kind::Exact),
            );
            t.check(
                "to_dtype",
                &format!("-> {dst}"),
                vec![In::new(src_dtype, &[2, 0], &[])],
                move |a| a[0].to_dtype(dst),
                Want::new(dst, &[2, 0], &[], Kind::Exact),
            );
        }
    }
    // kiln-defined (PyTorch leaves these undefined): NaN -> 0 for every int type, and float -> i64 saturates.
    // Out-of-range floats to u8/i32 are not asserted: to_dtype's doc says "saturates", but the interpreter and the
    // CPU JIT both go through i64 and wrap (3e9 -> i32 is -1294967296), so the spec itself is unsettled.
    for src in FLOATS {
        for dst in [U8, U32, I32, I64] {
            let x: &[f64] = if dst == I64 { &[NAN, INF, -INF, 1e19, -1e19, -1.5] } else { &[NAN, -0.0, 0.99] };
            let b = buffer(src, x);
            let want = cast_ref(&b, dst);
            let n = x.len();
            t.check(
                "to_dtype",
                &format!("-> {dst}: NaN -> 0, saturating to i64 (kiln-defined)"),
                vec![In::buf(&[n], b)],
                move |a| a[0].to_dtype(dst),
                Want::buf(&[n], want, Kind::Exact),
            );
        }
    }
}
