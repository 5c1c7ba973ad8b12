//! Graph rewrites applied before scheduling. Each keeps every value bit for bit (same products, same sums, in the
//! same order) and only changes how kernels will read memory.
//!
//! - `(A @ B)^T -> B^T @ A^T` when the transpose is the product's only reader, also through a cast that is the
//!   product's only reader (`cast(A @ B)^T -> cast(B^T @ A^T)`: a bf16 or f16 matmul's rounding). Autograd produces
//!   this for every linear layer's weight gradient (the gradient of `w.t()` is a transposed product); rewritten, the
//!   GEMM writes the gradient in the weight's own layout, so the optimizer update reads it contiguously and can fuse
//!   into the GEMM's epilogue.
//! - A leaky ReLU's mask read from its output: `y = x * m` with `m = where(0 < x, 1, s)`, `s >= 0` (kiln's
//!   `leaky_relu`, any slope `>= 0`; `relu` is recorded as `where(x <= 0, 0, x)` and is not matched), whose mask is
//!   also read elsewhere (autograd's `g * m`): those other readers
//!   get `where(0 < y, 1, s)`, the same bits (`x > 0` gives `y = x * 1 = x > 0`; otherwise `y = x * s` is `<= 0`,
//!   a zero or NaN, so `0 < y` is false as `0 < x` was). Then `x` (a linear layer's GEMM output) is read only to
//!   make `y`, so the activation runs in the GEMM's epilogue and `x` is never stored: one kernel and one buffer less
//!   per layer of a training step (PyTorch's relu backward reads the output for the same reason). Done only where it
//!   leaves `x` read by nothing else.

use crate::graph::{Graph, NodeData};
use crate::op::{BinaryOp, Op};
use petgraph::Direction;
use petgraph::stable_graph::NodeIndex;
use petgraph::visit::EdgeRef;

/// Whether `perm` swaps the last two dims and keeps the rest.
fn swaps_last_two(perm: &[usize]) -> bool {
    let r = perm.len();
    r >= 2 && perm[r - 2] == r - 1 && perm[r - 1] == r - 2 && perm[..r - 2].iter().enumerate().all(|(i, &p)| i == p)
}

fn transposed(g: &mut Graph, n: NodeIndex) -> NodeIndex {
    let d = g.node(n).clone();
    let r = d.shape.rank();
    let mut perm: Vec<usize> = (0..r).collect();
    perm.swap(r - 2, r - 1);
    let mut dims = d.shape.to_vec();
    dims.swap(r - 2, r - 1);
    g.add(NodeData { op: Op::Permute(perm), shape: dims.into(), dtype: d.dtype }, &[n])
}

/// Applies the rewrites in place.
pub fn simplify(g: &mut Graph) {
    transpose_products(g);
    masks_from_outputs(g);
}

/// Whether `n` is a constant whose every element is exactly `want(value)`.
fn constant(g: &Graph, n: NodeIndex, want: impl Fn(f64) -> bool) -> bool {
    matches!(g.node(n).op, Op::Const(c) if want(c.as_f64()))
}

/// The readers of `n` (each once, whatever the operand position).
fn readers(g: &Graph, n: NodeIndex) -> Vec<NodeIndex> {
    let mut r: Vec<NodeIndex> = g.g.edges_directed(n, Direction::Outgoing).map(|e| e.target()).collect();
    r.sort_unstable();
    r.dedup();
    r
}

/// The leaky-ReLU mask rewrite (see the module doc).
fn masks_from_outputs(g: &mut Graph) {
    for w in g.topo_order() {
        if !matches!(g.node(w).op, Op::Where) || !g.node(w).dtype.is_float() {
            continue;
        }
        let [cond, one, slope] = g.srcs(w)[..] else { continue };
        if !matches!(g.node(cond).op, Op::Binary(BinaryOp::Lt)) {
            continue;
        }
        let [zero, x] = g.srcs(cond)[..] else { continue };
        // The slope test is false for NaN; `-0.0 >= 0.0` holds, and `x * -0.0` for `x < 0` is `+0.0`: fine.
        if !constant(g, zero, |z| z == 0.0) || !constant(g, one, |o| o == 1.0) || !constant(g, slope, |s| s >= 0.0) {
            continue;
        }
        let w_readers = readers(g, w);
        let y = w_readers.iter().copied().find(|&r| {
            matches!(g.node(r).op, Op::Binary(BinaryOp::Mul))
                && g.node(r).shape == g.node(x).shape
                && matches!(g.srcs(r)[..], [a, b] if (a, b) == (x, w) || (a, b) == (w, x))
        });
        let Some(y) = y else { continue };
        let others: Vec<NodeIndex> = w_readers.into_iter().filter(|&r| r != y).collect();
        // Worth it only if `x` is then read by the mask's comparison and `y` alone, and the mask has other readers.
        let x_alone = readers(g, x).iter().all(|&r| r == cond || r == y) && !g.outputs.contains(&x);
        if others.is_empty() || !x_alone || g.outputs.contains(&w) {
            continue;
        }
        let (cd, wd) = (g.node(cond).clone(), g.node(w).clone());
        let cond_y = g.add(NodeData { op: cd.op, shape: cd.shape, dtype: cd.dtype }, &[zero, y]);
        let w_y = g.add(NodeData { op: wd.op, shape: wd.shape, dtype: wd.dtype }, &[cond_y, one, slope]);
        for r in others {
            let edges: Vec<(petgraph::stable_graph::EdgeIndex, usize)> =
                g.g.edges_directed(w, Direction::Outgoing)
                    .filter(|e| e.target() == r)
                    .map(|e| (e.id(), *e.weight()))
                    .collect();
            for (e, pos) in edges {
                g.g.remove_edge(e);
                g.g.add_edge(w_y, r, pos);
            }
        }
    }
}

/// The `(A @ B)^T -> B^T @ A^T` rewrite (see the module doc).
fn transpose_products(g: &mut Graph) {
    for p in g.topo_order() {
        let Op::Permute(perm) = &g.node(p).op else { continue };
        if !swaps_last_two(perm) {
            continue;
        }
        let only_reader = |g: &Graph, n: NodeIndex| {
            g.g.edges_directed(n, Direction::Outgoing).count() == 1 && !g.outputs.contains(&n)
        };
        // Through a cast the transpose commutes with (a half matmul's rounding of its f32 product).
        let src = g.srcs(p)[0];
        let cast = (matches!(g.node(src).op, Op::Cast) && only_reader(g, src)).then_some(src);
        let m = cast.map_or(src, |c| g.srcs(c)[0]);
        if !matches!(g.node(m).op, Op::Matmul) || !only_reader(g, m) {
            continue;
        }
        let [a, b] = g.srcs(m)[..] else { continue };
        let (at, bt) = (transposed(g, a), transposed(g, b));
        let incoming: Vec<_> = g.g.edges_directed(p, Direction::Incoming).map(|e| e.id()).collect();
        for e in incoming {
            g.g.remove_edge(e);
        }
        match cast {
            None => {
                g.g[p].op = Op::Matmul;
                g.g.add_edge(bt, p, 0);
                g.g.add_edge(at, p, 1);
            }
            Some(c) => {
                let product = NodeData { op: Op::Matmul, shape: g.node(p).shape.clone(), dtype: g.node(m).dtype };
                let t = g.add(product, &[bt, at]);
                g.g[p].op = Op::Cast;
                g.g.add_edge(t, p, 0);
                g.g.remove_node(c);
            }
        }
        g.g.remove_node(m);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::{DType, Scalar};
    use crate::{HostBuffer, interp};

    /// `y = x * where(0 < x, one, slope)` and a second reader of the mask (`g * m`, as autograd makes); returns the
    /// graph and the mask, the product and x.
    fn leaky(one: f64, slope: f64, x_read_elsewhere: bool) -> (Graph, NodeIndex, NodeIndex, NodeIndex) {
        let mut g = Graph::new();
        let f32 = |op: Op, dims: &[usize]| NodeData { op, shape: dims.into(), dtype: DType::F32 };
        let x = g.add(f32(Op::Input { slot: 0 }, &[2, 4]), &[]);
        let gr = g.add(f32(Op::Input { slot: 1 }, &[2, 4]), &[]);
        let zero = g.add(f32(Op::Const(Scalar::Int(0)), &[2, 4]), &[]);
        let one = g.add(f32(Op::Const(Scalar::Float(one)), &[2, 4]), &[]);
        let slope = g.add(f32(Op::Const(Scalar::Float(slope)), &[2, 4]), &[]);
        let cond =
            g.add(NodeData { op: Op::Binary(BinaryOp::Lt), shape: [2, 4].into(), dtype: DType::Bool }, &[zero, x]);
        let m = g.add(f32(Op::Where, &[2, 4]), &[cond, one, slope]);
        let y = g.add(f32(Op::Binary(BinaryOp::Mul), &[2, 4]), &[x, m]);
        let back = g.add(f32(Op::Binary(BinaryOp::Mul), &[2, 4]), &[gr, m]);
        g.outputs = vec![y, back];
        if x_read_elsewhere {
            let e = g.add(f32(Op::Unary(crate::op::UnaryOp::Exp), &[2, 4]), &[x]);
            g.outputs.push(e);
        }
        (g, m, y, x)
    }

    /// The values the rewrite must keep bit for bit: signed zeros, infinities, NaN, subnormals, both signs.
    fn run(g: &Graph) -> Vec<u32> {
        let x =
            HostBuffer::F32(vec![-0.0, f32::INFINITY, f32::NEG_INFINITY, f32::NAN, 1e-40, -1e-40, 0.0, -3.0].into());
        let gr = HostBuffer::F32((0..8).map(|i| i as f32 - 3.5).collect());
        let out = interp::run(g, &[&x, &gr], &[]).expect("runs");
        out.iter()
            .flat_map(|o| match o {
                HostBuffer::F32(v) => v.iter().map(|x| x.to_bits()).collect::<Vec<u32>>(),
                other => panic!("f32 outputs, got {:?}", other.dtype()),
            })
            .collect()
    }

    #[test]
    fn a_leaky_relu_mask_is_read_from_its_output_bit_for_bit() {
        for slope in [0.01, 0.0, -0.0, 0.2] {
            let (mut g, m, y, x) = leaky(1.0, slope, false);
            let before = run(&g);
            simplify(&mut g);
            g.verify().expect("a valid graph");
            assert_eq!(run(&g), before, "slope {slope}: the same bits");
            // The mask now feeds only the product; x only the comparison and the product.
            assert_eq!(readers(&g, m), vec![y], "slope {slope}");
            assert_eq!(readers(&g, x).len(), 2);
            let back = g.outputs[1];
            let new_mask = g.srcs(back)[1];
            assert_ne!(new_mask, m);
            assert_eq!(g.srcs(g.srcs(new_mask)[0])[1], y, "the backward's mask compares the output");
        }
    }

    #[test]
    fn the_mask_rewrite_leaves_what_it_cannot_prove_alone() {
        // A negative slope (y > 0 for x < 0), a first branch other than 1, and an x read elsewhere (nothing to gain).
        for (one, slope, elsewhere) in
            [(1.0, -0.01, false), (2.0, 0.01, false), (1.0, f64::NAN, false), (1.0, 0.01, true)]
        {
            let (mut g, m, y, _) = leaky(one, slope, elsewhere);
            let n = g.g.node_count();
            simplify(&mut g);
            assert_eq!(g.g.node_count(), n, "({one}, {slope}, {elsewhere}): unchanged");
            assert_eq!(readers(&g, m).len(), 2);
            assert!(readers(&g, m).contains(&y));
        }
    }

    /// `(A @ B)^T`, directly or through a cast to bf16 (a half matmul's rounding): rewritten to the transposed
    /// product (and its cast) with the same bits, unless the product or the cast has another reader.
    #[test]
    fn a_transposed_product_is_computed_transposed_bit_for_bit() {
        for (through_cast, shared) in [(false, false), (true, false), (true, true)] {
            let mut g = Graph::new();
            let f32 = |op: Op, dims: &[usize]| NodeData { op, shape: dims.into(), dtype: DType::F32 };
            let a = g.add(f32(Op::Input { slot: 0 }, &[3, 5]), &[]);
            let b = g.add(f32(Op::Input { slot: 1 }, &[5, 4]), &[]);
            let m = g.add(f32(Op::Matmul, &[3, 4]), &[a, b]);
            let dtype = if through_cast { DType::BF16 } else { DType::F32 };
            let top =
                if through_cast { g.add(NodeData { op: Op::Cast, shape: [3, 4].into(), dtype }, &[m]) } else { m };
            let p = g.add(NodeData { op: Op::Permute(vec![1, 0]), shape: [4, 3].into(), dtype }, &[top]);
            g.outputs = vec![p];
            if shared {
                g.outputs.push(top);
            }
            let inputs = [
                HostBuffer::F32((0..15).map(|i| (i as f32 - 7.3) * 0.37).collect()),
                HostBuffer::F32((0..20).map(|i| (i as f32 * 1.7).sin()).collect()),
            ];
            let eval = |g: &Graph| interp::run(g, &[&inputs[0], &inputs[1]], &[]).expect("runs");
            let before = eval(&g);
            simplify(&mut g);
            g.verify().expect("a valid graph");
            assert_eq!(eval(&g), before, "cast {through_cast}, shared {shared}: the same values");
            let out = g.outputs[0];
            let product = if through_cast { g.srcs(out)[0] } else { out };
            let rewritten = matches!(g.node(product).op, Op::Matmul) && g.node(product).shape.dims() == [4, 3];
            assert_eq!(rewritten, !shared, "cast {through_cast}, shared {shared}");
        }
    }
}
