//! The op table's promotion cases: mixed dtypes, zero-dim tensors, Rust scalars, and the operators.

use super::*;

/// u32: C-like wrapping, and unsigned compares, min/max, power and conversions on values above 2^31 (where a
/// signed instruction would read them as negative), and PyTorch's promotion with signed ints (u32 + i32 -> i64).
pub(super) fn unsigned32(t: &mut Table) {
    const M: f64 = u32::MAX as f64;
    const H: f64 = 2_147_483_648.0; // 2^31
    let rows: [Row2; 12] = [
        ("add", |a, b| a.add(b), v(U32, &[M, 5.0, H]), v(U32, &[1.0, 3.0, H]), U32, &[0.0, 8.0, 0.0]),
        ("sub", |a, b| a.sub(b), v(U32, &[0.0, 5.0, 1.0]), v(U32, &[1.0, 3.0, M]), U32, &[M, 2.0, 2.0]),
        ("mul", |a, b| a.mul(b), v(U32, &[65_536.0, 3.0, M]), v(U32, &[65_536.0, 5.0, M]), U32, &[0.0, 15.0, 1.0]),
        ("maximum", |a, b| a.maximum(b), v(U32, &[H, 1.0, 7.0]), v(U32, &[1.0, M, 7.0]), U32, &[H, M, 7.0]),
        ("minimum", |a, b| a.minimum(b), v(U32, &[H, 1.0, 7.0]), v(U32, &[1.0, M, 7.0]), U32, &[1.0, 1.0, 7.0]),
        ("lt", |a, b| a.lt(b), v(U32, &[3e9, 1.0, H]), v(U32, &[1.0, 3e9, H]), Bool, &[0.0, 1.0, 0.0]),
        ("le", |a, b| a.le(b), v(U32, &[3e9, 1.0, H]), v(U32, &[1.0, 3e9, H]), Bool, &[0.0, 1.0, 1.0]),
        ("pow", |a, b| a.pow(b), v(U32, &[2.0, 3.0, M]), v(U32, &[32.0, 2.0, 3e9]), U32, &[0.0, 9.0, 1.0]),
        ("div", |a, b| a.div(b), v(U32, &[3e9, 7.0, M]), v(U32, &[2.0, 2.0, 1.0]), F32, &[1.5e9, 3.5, M]),
        ("add", |a, b| a.add(b), v(U32, &[M, 0.0]), v(I32, &[1.0, -1.0]), I64, &[M + 1.0, -1.0]),
        ("sub", |a, b| a.sub(b), v(U32, &[0.0, M]), v(I64, &[1.0, -1.0]), I64, &[-1.0, M + 1.0]),
        ("add", |a, b| a.add(b), v(U32, &[M, 1.0]), v(U8, &[1.0, 255.0]), U32, &[0.0, 256.0]),
    ];
    for (op, f, a, b, d, want) in rows {
        let shape = a.shape.clone();
        t.check(op, "u32", vec![a, b], move |x| f(&x[0], &x[1]), Want::new(d, &shape, want, Kind::Exact));
    }
    let scalars: [Row1; 8] = [
        // Eight elements: the 4-lane vector loop, where bools are lane masks, not 0/1 bytes.
        (
            "to_dtype",
            "bool -> u32, vectorized",
            |a| a.to_dtype(U32),
            v(Bool, &[1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0, 0.0]),
            U32,
            &[1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0, 0.0],
        ),
        ("add", "u32 + (-1) wraps in u32", |a| a.add(-1), v(U32, &[0.0, 5.0]), U32, &[M, 4.0]),
        ("gt", "u32 > 2^31 - 1", |a| a.gt(2_147_483_647i64), v(U32, &[H, 5.0]), Bool, &[1.0, 0.0]),
        ("neg", "-(u32) wraps", |a| a.neg(), v(U32, &[1.0, 0.0, H]), U32, &[M, 0.0, H]),
        ("abs", "abs(u32) is the identity", |a| a.abs(), v(U32, &[M, H]), U32, &[M, H]),
        ("to_dtype", "u32 -> f32 above 2^31", |a| a.to_dtype(F32), v(U32, &[3e9, M]), F32, &[3e9, 4_294_967_296.0]),
        ("to_dtype", "u32 -> i32 wraps", |a| a.to_dtype(I32), v(U32, &[M, H]), I32, &[-1.0, -H]),
        ("max_all", "unsigned", |a| a.max_all(), v(U32, &[1.0, 3e9, H]), U32, &[3e9]),
    ];
    for (op, note, f, a, d, want) in scalars {
        let shape = if op == "max_all" { vec![] } else { a.shape.clone() };
        t.check(op, note, vec![a], move |x| f(&x[0]), Want::new(d, &shape, want, Kind::Exact));
    }
    // Sums of u32 are i64, as in PyTorch (no wrapping at 2^32).
    t.check(
        "sum_all",
        "u32 -> i64",
        vec![v(U32, &[M, M, 2.0])],
        |x| x[0].sum_all(),
        Want::new(I64, &[], &[2.0 * M + 2.0], Kind::Exact),
    );
}

pub(super) fn promotion(t: &mut Table) {
    // Tensor op tensor, both dimensioned: torch.promote_types.
    let pairs: [Row2; 14] = [
        ("add", |a, b| a.add(b), v(I32, &[1.0, 2.0, 3.0]), v(F32, &[0.5; 3]), F32, &[1.5, 2.5, 3.5]),
        ("add", |a, b| a.add(b), v(U8, &[200.0, 1.0, 255.0]), v(I32, &[100.0, -2.0, 1.0]), I32, &[300.0, -1.0, 256.0]),
        ("add", |a, b| a.add(b), v(Bool, &[1.0, 0.0, 1.0]), v(U8, &[255.0, 3.0, 4.0]), U8, &[0.0, 3.0, 5.0]),
        ("mul", |a, b| a.mul(b), v(I32, &[3.0, -4.0]), v(I64, &[1e10, 2.0]), I64, &[3e10, -8.0]),
        ("add", |a, b| a.add(b), v(F32, &[0.1]), v(F64, &[0.2]), F64, &[0.1f32 as f64 + 0.2]),
        ("sub", |a, b| a.sub(b), v(U8, &[3.0, 200.0]), v(I64, &[5.0, 1.0]), I64, &[-2.0, 199.0]),
        ("add", |a, b| a.add(b), v(Bool, &[1.0, 0.0]), v(F64, &[0.25, 0.25]), F64, &[1.25, 0.25]),
        ("mul", |a, b| a.mul(b), v(I64, &[3.0, -1.0]), v(F32, &[0.5, 2.0]), F32, &[1.5, -2.0]),
        ("maximum", |a, b| a.maximum(b), v(I32, &[1.0, 5.0, -2.0]), v(F32, &[1.5, 2.5, NAN]), F32, &[1.5, 5.0, NAN]),
        ("minimum", |a, b| a.minimum(b), v(U8, &[1.0, 200.0]), v(I32, &[-1.0, 300.0]), I32, &[-1.0, 200.0]),
        ("div", |a, b| a.div(b), v(I32, &[1.0, 3.0]), v(F64, &[3.0, 2.0]), F64, &[1.0 / 3.0, 1.5]),
        ("pow", |a, b| a.pow(b), v(F32, &[2.0, 9.0]), v(I64, &[3.0, 2.0]), F32, &[8.0, 81.0]),
        ("pow", |a, b| a.pow(b), v(I32, &[4.0, 2.0]), v(F32, &[0.5, -1.0]), F32, &[2.0, 0.5]),
        (
            "logical_and",
            |a, b| a.logical_and(b),
            v(F32, &[0.5, 0.0, NAN]),
            v(I32, &[2.0, 1.0, 3.0]),
            Bool,
            &[1.0, 0.0, 1.0],
        ),
    ];
    for (op, f, a, b, d, want) in pairs {
        let shape = a.shape.clone();
        t.check(
            op,
            "promote_types",
            vec![a, b],
            move |x| f(&x[0], &x[1]),
            Want::new(d, &shape, want, Kind::Elementwise),
        );
    }
    // Zero-dim tensors count only when they raise the category (then with their own dtype).
    let zero_dim: [(In, In, DType, &[f64]); 7] = [
        (v(F32, &[1.0, 2.0, 3.0]), In::new(F64, &[], &[0.5]), F32, &[1.5, 2.5, 3.5]),
        (v(I32, &[1.0, 2.0, 3.0]), In::new(F64, &[], &[0.5]), F64, &[1.5, 2.5, 3.5]),
        (In::new(I32, &[], &[7.0]), In::new(I64, &[], &[1e10]), I64, &[1e10 + 7.0]),
        (v(U8, &[1.0, 2.0, 250.0]), In::new(I64, &[], &[10.0]), U8, &[11.0, 12.0, 4.0]),
        (v(Bool, &[1.0, 0.0]), In::new(I32, &[], &[5.0]), I32, &[6.0, 5.0]),
        (In::new(F64, &[], &[0.1]), In::new(F32, &[], &[0.5]), F64, &[0.6]),
        (v(I64, &[1.0, 2.0]), In::new(Bool, &[], &[1.0]), I64, &[2.0, 3.0]),
    ];
    for (a, b, d, want) in zero_dim {
        let shape = broadcast_shape(&a.shape, &b.shape).unwrap();
        t.check(
            "add",
            "zero-dim operand",
            vec![a, b],
            |x| x[0].add(&x[1]),
            Want::new(d, &shape, want, Kind::Elementwise),
        );
    }
    t.check(
        "add",
        "size-0 with a zero-dim",
        vec![In::new(I32, &[0, 2], &[]), In::new(F64, &[], &[1.0])],
        |x| x[0].add(&x[1]),
        Want::new(F64, &[0, 2], &[], Kind::Exact),
    );

    // Rust scalars ("wrapped numbers") widen only the category, to i64 or f32.
    let scalars: [Row1; 20] = [
        ("add", "i32 + 2.5", |a| a.add(2.5), v(I32, &[1.0, 2.0]), F32, &[3.5, 4.5]),
        ("add", "bool + 1", |a| a.add(1), v(Bool, &[1.0, 0.0]), I64, &[2.0, 1.0]),
        ("add", "bool + true", |a| a.add(true), v(Bool, &[1.0, 0.0]), Bool, &[1.0, 1.0]),
        ("add", "u8 + 10 wraps", |a| a.add(10), v(U8, &[1.0, 250.0]), U8, &[11.0, 4.0]),
        ("mul", "u8 * 2 wraps", |a| a.mul(2), v(U8, &[200.0, 3.0]), U8, &[144.0, 6.0]),
        ("sub", "u8 - 3 wraps", |a| a.sub(3), v(U8, &[1.0, 3.0]), U8, &[254.0, 0.0]),
        ("mul", "i64 * 2.5", |a| a.mul(2.5), v(I64, &[2.0, -3.0]), F32, &[5.0, -7.5]),
        ("add", "f64 + 0.1 stays f64", |a| a.add(0.1), v(F64, &[1.0]), F64, &[1.1]),
        ("add", "f32 + 0.1", |a| a.add(0.1), v(F32, &[1.0]), F32, &[1.1]),
        ("div", "i32 / 2", |a| a.div(2), v(I32, &[7.0, -7.0]), F32, &[3.5, -3.5]),
        ("mul", "bool * 2.5", |a| a.mul(2.5), v(Bool, &[1.0, 0.0]), F32, &[2.5, 0.0]),
        ("add", "i32 + 2.5f32", |a| a.add(2.5f32), v(I32, &[1.0]), F32, &[3.5]),
        ("add", "i32 + i64 scalar wraps in i32", |a| a.add(1i64), v(I32, &[2147483647.0]), I32, &[-2147483648.0]),
        ("mul", "f32 * 3", |a| a.mul(3), v(F32, &[0.5, -1.0]), F32, &[1.5, -3.0]),
        ("lt", "i32 < 2.5 compares as f32", |a| a.lt(2.5), v(I32, &[1.0, 2.0, 3.0]), Bool, &[1.0, 1.0, 0.0]),
        ("gt", "u8 > 100", |a| a.gt(100), v(U8, &[0.0, 200.0]), Bool, &[0.0, 1.0]),
        ("eq", "f32 == 0.1 (scalar rounded to f32)", |a| a.eq(0.1), v(F32, &[0.1]), Bool, &[1.0]),
        ("eq", "f64 == 0.1 (not rounded)", |a| a.eq(0.1), v(F64, &[0.1f32 as f64]), Bool, &[0.0]),
        ("ge", "i64 >= 3.0", |a| a.ge(3.0), v(I64, &[3.0, 2.0]), Bool, &[1.0, 0.0]),
        ("maximum", "i32 max 0.5", |a| a.maximum(0.5), v(I32, &[0.0, 2.0]), F32, &[0.5, 2.0]),
    ];
    for (op, note, f, a, d, want) in scalars {
        let shape = a.shape.clone();
        t.check(op, note, vec![a], move |x| f(&x[0]), Want::new(d, &shape, want, Kind::Elementwise));
    }
    let more: [Row1; 8] = [
        ("ne", "bool != 1 (as i64)", |a| a.ne(1), v(Bool, &[1.0, 0.0]), Bool, &[0.0, 1.0]),
        ("le", "f32 <= 1 (int scalar)", |a| a.le(1), v(F32, &[1.0, 1.5]), Bool, &[1.0, 0.0]),
        ("pow", "f32 ** 2", |a| a.pow(2), v(F32, &[1.5, -3.0]), F32, &[2.25, 9.0]),
        ("pow", "i32 ** 2.0 -> f32", |a| a.pow(2.0), v(I32, &[3.0, -2.0]), F32, &[9.0, 4.0]),
        ("pow", "u8 ** 2 wraps", |a| a.pow(2), v(U8, &[16.0, 3.0]), U8, &[0.0, 9.0]),
        (
            "clamp",
            "i32 into [0.5, 2.5] -> f32",
            |a| a.clamp(0.5, 2.5),
            v(I32, &[-1.0, 1.0, 3.0]),
            F32,
            &[0.5, 1.0, 2.5],
        ),
        ("logical_or", "i32 or false", |a| a.logical_or(false), v(I32, &[0.0, -3.0]), Bool, &[0.0, 1.0]),
        ("logical_and", "f64 and 2.5", |a| a.logical_and(2.5), v(F64, &[0.0, NAN]), Bool, &[0.0, 1.0]),
    ];
    for (op, note, f, a, d, want) in more {
        let shape = a.shape.clone();
        t.check(op, note, vec![a], move |x| f(&x[0]), Want::new(d, &shape, want, Kind::Elementwise));
    }

    // The operators, with Rust scalars on both sides (operators take f64 and i64; f32/i32 go through the methods).
    let ops: [Row1; 24] = [
        ("operator +", "x + 1.5", |a| a + 1.5, v(F32, &[1.0, -2.0]), F32, &[2.5, -0.5]),
        ("operator +", "1.5 + x", |a| 1.5 + a, v(F32, &[1.0, -2.0]), F32, &[2.5, -0.5]),
        ("operator +", "2.5 + i32", |a| 2.5 + a, v(I32, &[1.0, -2.0]), F32, &[3.5, 0.5]),
        ("operator +", "i64 + 3", |a| a + 3, v(I64, &[1.0, -2.0]), I64, &[4.0, 1.0]),
        ("operator +", "owned u8 + 6", |a| a.clone() + 6, v(U8, &[1.0, 250.0]), U8, &[7.0, 0.0]),
        ("operator -", "2.0 - x", |a| 2.0 - a, v(F32, &[0.5, 3.0]), F32, &[1.5, -1.0]),
        ("operator -", "10 - i32", |a| 10 - a, v(I32, &[3.0, 12.0]), I32, &[7.0, -2.0]),
        ("operator -", "10i64 - u8 wraps", |a| 10i64 - a, v(U8, &[3.0, 12.0]), U8, &[7.0, 254.0]),
        ("operator -", "2.0 - i64", |a| 2.0 - a, v(I64, &[5.0]), F32, &[-3.0]),
        ("operator -", "x - 1.0 (f64)", |a| a - 1.0, v(F64, &[0.5, 3.0]), F64, &[-0.5, 2.0]),
        ("operator -", "owned x - 1i64", |a| a.clone() - 1i64, v(I32, &[0.0]), I32, &[-1.0]),
        ("operator *", "3 * x", |a| 3 * a, v(I32, &[2.0, -5.0]), I32, &[6.0, -15.0]),
        ("operator *", "2.5 * i32", |a| 2.5 * a, v(I32, &[2.0, -5.0]), F32, &[5.0, -12.5]),
        ("operator *", "x * 0.5 (f64 scalar, f64 x)", |a| a * 0.5, v(F64, &[3.0]), F64, &[1.5]),
        ("operator *", "2i64 * bool -> i64", |a| 2i64 * a, v(Bool, &[1.0, 0.0]), I64, &[2.0, 0.0]),
        ("mul", "f64 x * 2.0f32", |a| a.mul(2.0f32), v(F64, &[0.1]), F64, &[0.2]),
        ("operator /", "2.0 / i64 -> f32", |a| 2.0 / a, v(I64, &[4.0, -1.0, 0.0]), F32, &[0.5, -2.0, INF]),
        ("operator /", "x / 2 (i32 -> f32)", |a| a / 2, v(I32, &[7.0, -1.0]), F32, &[3.5, -0.5]),
        ("operator /", "1i64 / u8 -> f32", |a| 1i64 / a, v(U8, &[4.0, 0.0]), F32, &[0.25, INF]),
        ("operator /", "3 / f64", |a| 3 / a, v(F64, &[4.0]), F64, &[0.75]),
        ("operator /", "owned x / 4.0", |a| a.clone() / 4.0, v(F32, &[1.0]), F32, &[0.25]),
        ("operator -x", "-(f32)", |a| -a, v(F32, &[1.0, -0.0, INF]), F32, &[-1.0, 0.0, -INF]),
        ("operator -x", "-(owned i64)", |a| -(a.clone()), v(I64, &[5.0, -3.0]), I64, &[-5.0, 3.0]),
        ("operator -x", "-(u8) wraps", |a| -a, v(U8, &[1.0, 0.0]), U8, &[255.0, 0.0]),
    ];
    for (op, note, f, a, d, want) in ops {
        let shape = a.shape.clone();
        t.check(op, note, vec![a], move |x| f(&x[0]), Want::new(d, &shape, want, Kind::Elementwise));
    }
    // Tensor operators on owned and borrowed operands, mixed dtypes.
    let tensor_ops: [(&str, &str, BinOp, DType, &[f64]); 8] = [
        ("operator +", "&a + &b", |a, b| a + b, F32, &[1.5, 0.5]),
        ("operator +", "a + b owned", |a, b| a.clone() + b.clone(), F32, &[1.5, 0.5]),
        ("operator -", "&a - b", |a, b| a - b.clone(), F32, &[0.5, -4.5]),
        ("operator -", "a - &b", |a, b| a.clone() - b, F32, &[0.5, -4.5]),
        ("operator *", "a * &b", |a, b| a.clone() * b, F32, &[0.5, -5.0]),
        ("operator *", "&a * b", |a, b| a * b.clone(), F32, &[0.5, -5.0]),
        ("operator /", "&a / &b", |a, b| a / b, F32, &[2.0, -0.8]),
        ("operator /", "a / b owned", |a, b| a.clone() / b.clone(), F32, &[2.0, -0.8]),
    ];
    for (op, note, f, d, want) in tensor_ops {
        let ins = vec![v(I32, &[1.0, -2.0]), v(F32, &[0.5, 2.5])];
        t.check(op, note, ins, move |x| f(&x[0], &x[1]), Want::new(d, &[2], want, Kind::Elementwise));
    }

    // where_ promotes its two branches like a binary op (the condition takes no part).
    let c = || v(Bool, &[1.0, 0.0, 1.0]);
    let wheres: [WhereRow; 7] = [
        ("i32 | f32", |c, a, b| c.where_(a, b), v(I32, &[1.0, 2.0, 3.0]), v(F32, &[0.5; 3]), F32, &[1.0, 0.5, 3.0]),
        ("u8 | i64", |c, a, b| c.where_(a, b), v(U8, &[200.0; 3]), v(I64, &[-1.0; 3]), I64, &[200.0, -1.0, 200.0]),
        ("i32 | 2.5", |c, a, _| c.where_(a, 2.5), v(I32, &[1.0, 2.0, 3.0]), v(I32, &[]), F32, &[1.0, 2.5, 3.0]),
        ("1.0 | 0.0", |c, _, _| c.where_(1.0, 0.0), v(I32, &[]), v(I32, &[]), F32, &[1.0, 0.0, 1.0]),
        ("1 | 0", |c, _, _| c.where_(1, 0), v(I32, &[]), v(I32, &[]), I64, &[1.0, 0.0, 1.0]),
        ("false | true", |c, _, _| c.where_(false, true), v(I32, &[]), v(I32, &[]), Bool, &[0.0, 1.0, 0.0]),
        (
            "f32 | f64 zero-dim",
            |c, a, b| c.where_(a, b),
            v(F32, &[1.0; 3]),
            In::new(F64, &[], &[0.1]),
            F32,
            &[1.0, 0.1, 1.0],
        ),
    ];
    for (note, f, a, b, d, want) in wheres {
        t.check(
            "where_",
            note,
            vec![c(), a, b],
            move |x| f(&x[0], &x[1], &x[2]),
            Want::new(d, &[3], want, Kind::Elementwise),
        );
    }
    t.check(
        "cat",
        "i32 with f32 -> f32",
        vec![v(I32, &[1.0, -2.0]), v(F32, &[0.5])],
        |x| Tensor::cat(&[&x[0], &x[1]], 0),
        Want::new(F32, &[3], &[1.0, -2.0, 0.5], Kind::Exact),
    );
    t.check(
        "cat",
        "u8 with bool -> u8, i64 -> i64",
        vec![v(U8, &[255.0, 1.0]), v(Bool, &[1.0]), v(I64, &[-7.0])],
        |x| Tensor::cat(&[&Tensor::cat(&[&x[0], &x[1]], 0), &x[2]], 0),
        Want::new(I64, &[4], &[255.0, 1.0, 1.0, -7.0], Kind::Exact),
    );
    t.check(
        "matmul",
        "i32 x f32 -> f32",
        vec![In::new(I32, &[1, 2], &[1.0, 2.0]), In::new(F32, &[2, 1], &[0.5, 0.25])],
        |x| x[0].matmul(&x[1]),
        Want::new(F32, &[1, 1], &[1.0], Kind::Accumulate),
    );
}
