//! `Tensor::einsum`, PyTorch's `torch.einsum`: an equation of subscripts over any number of operands, lowered to
//! the graph kiln already fuses and tunes (diagonals as strided slices, sums, permutes, and one batched `matmul`
//! per pair of operands), so gradients come from those ops and every device runs it.
//!
//! Semantics as PyTorch's: subscripts are letters (`A-Z` before `a-z`), `...` stands for the dims no letter names
//! (right-aligned, broadcast across operands); without `->` the output is the ellipsis dims then every letter that
//! appears once, in that order; a letter repeated in one operand takes its diagonal; a letter in no output is summed;
//! dims of size 1 broadcast against the same letter's size elsewhere. Operands are contracted two at a time, the
//! pair whose result is smallest first (opt_einsum's greedy order), after summing out every letter only one
//! operand has. Deliberately not done: searching contraction orders beyond the greedy one.

use crate::args::fail;
use crate::tensor::Tensor;

/// A subscript label: `A-Z` are 0-25, `a-z` 26-51, the ellipsis dims 52 and up (right-aligned).
type Label = u8;
const ELLIPSIS: Label = 52;

/// An operand or intermediate with the label of each dim.
struct Term {
    t: Tensor,
    labels: Vec<Label>,
}

fn letter(c: char) -> Option<Label> {
    match c {
        'A'..='Z' => Some(c as u8 - b'A'),
        'a'..='z' => Some(c as u8 - b'a' + 26),
        _ => None,
    }
}

fn show(l: Label) -> String {
    match l {
        0..=25 => ((b'A' + l) as char).to_string(),
        26..=51 => ((b'a' + l - 26) as char).to_string(),
        _ => format!("...[{}]", l - ELLIPSIS),
    }
}

/// One side's subscripts: the letters before the ellipsis, whether there is one, and the letters after it.
#[track_caller]
fn parse_term(s: &str, what: &str) -> (Vec<Label>, bool, Vec<Label>) {
    let (before, after, ellipsis) = match s.find("...") {
        Some(i) => (&s[..i], &s[i + 3..], true),
        None => (s, "", false),
    };
    if after.contains("...") {
        fail!("einsum", "{what} '{s}' has more than one '...'");
    }
    let mut parts = (Vec::new(), Vec::new());
    for (part, out) in [(before, &mut parts.0), (after, &mut parts.1)] {
        for c in part.chars() {
            match letter(c) {
                Some(l) => out.push(l),
                None => fail!("einsum", "{what} '{s}' has '{c}': subscripts are letters a-z, A-Z and one '...'"),
            }
        }
    }
    (parts.0, ellipsis, parts.1)
}

impl Tensor {
    /// Einstein summation over `operands` (`torch.einsum`): `Tensor::einsum("bij,bjk->bik", &[&a, &b])` is a
    /// batched matmul, `"ii->i"` a diagonal, `"ii"` a trace, `"i,j->ij"` an outer product, `"...ij->...ji"` a
    /// transpose of the last two dims. See the module doc for the rules. Panics at the caller's line on an equation
    /// that does not fit the operands, naming the subscript and the sizes.
    #[track_caller]
    pub fn einsum(equation: &str, operands: &[&Tensor]) -> Tensor {
        let eq: String = equation.chars().filter(|c| !c.is_whitespace()).collect();
        let (lhs, rhs) = match eq.split_once("->") {
            Some((l, r)) => (l, Some(r)),
            None => (eq.as_str(), None),
        };
        let terms: Vec<&str> = lhs.split(',').collect();
        if terms.len() != operands.len() {
            fail!("einsum", "'{equation}' has subscripts for {} operands, {} were given", terms.len(), operands.len());
        }
        let parsed: Vec<_> = terms.iter().enumerate().map(|(i, s)| parse_term(s, &format!("operand {i}"))).collect();
        // The ellipsis's rank: the most dims any operand leaves to it.
        let mut ell = 0usize;
        for (i, ((b, has, a), t)) in parsed.iter().zip(operands).enumerate() {
            let named = b.len() + a.len();
            if (*has && t.rank() < named) || (!*has && t.rank() != named) {
                fail!(
                    "einsum",
                    "operand {i} has {} dims {:?}, its subscripts '{}' name {named}",
                    t.rank(),
                    t.dims(),
                    terms[i]
                );
            }
            if *has {
                ell = ell.max(t.rank() - named);
            }
        }
        if ell > 64 {
            fail!("einsum", "'...' stands for {ell} dims; at most 64 are supported");
        }
        let ell_labels = |n: usize| -> Vec<Label> { (ell - n..ell).map(|e| ELLIPSIS + e as Label).collect() };
        let mut inputs: Vec<Term> = parsed
            .iter()
            .zip(operands)
            .map(|((b, has, a), t)| {
                let mut labels = b.clone();
                if *has {
                    labels.extend(ell_labels(t.rank() - b.len() - a.len()));
                }
                labels.extend(a);
                Term { t: (*t).clone(), labels }
            })
            .collect();
        // Each label's size: one that is not 1 wins; two that differ and are not 1 are an error.
        let mut size = vec![1usize; ELLIPSIS as usize + ell];
        let mut seen = vec![false; ELLIPSIS as usize + ell];
        for (i, term) in inputs.iter().enumerate() {
            for (&l, &n) in term.labels.iter().zip(term.t.dims()) {
                let s = &mut size[l as usize];
                if seen[l as usize] && n != *s && n != 1 && *s != 1 {
                    fail!(
                        "einsum",
                        "subscript {} has size {n} in operand {i}, which does not broadcast with size {} seen before",
                        show(l),
                        *s
                    );
                }
                if !seen[l as usize] || *s == 1 {
                    *s = n;
                }
                seen[l as usize] = true;
            }
        }
        let output: Vec<Label> = match rhs {
            Some(r) => {
                let (b, has, a) = parse_term(r, "the output");
                let mut out = b;
                if has {
                    out.extend(ell_labels(ell));
                }
                out.extend(a);
                for (j, &l) in out.iter().enumerate() {
                    if out[..j].contains(&l) {
                        fail!("einsum", "output subscript {} appears more than once", show(l));
                    }
                    if !seen[l as usize] {
                        fail!("einsum", "output subscript {} appears in no operand", show(l));
                    }
                }
                out
            }
            None => {
                let mut out = ell_labels(ell);
                let count =
                    |l: Label| inputs.iter().map(|t| t.labels.iter().filter(|&&x| x == l).count()).sum::<usize>();
                out.extend((0..ELLIPSIS).filter(|&l| count(l) == 1));
                out
            }
        };
        for term in &mut inputs {
            diagonals(term);
        }
        let dtype = inputs.iter().skip(1).fold(inputs[0].t.dtype(), |d, t| {
            kiln_jit::dtype::result_type(&[(d, kiln_jit::Priority::Tensor), (t.t.dtype(), kiln_jit::Priority::Tensor)])
        });
        for term in &mut inputs {
            term.t = term.t.to_dtype(dtype);
        }
        // Contract pairwise, the pair with the smallest result first.
        while inputs.len() > 1 {
            let needed = |skip: [usize; 2], inputs: &[Term]| -> Vec<Label> {
                let mut n = output.clone();
                for (i, t) in inputs.iter().enumerate() {
                    if !skip.contains(&i) {
                        n.extend(&t.labels);
                    }
                }
                n
            };
            let mut best: Option<(usize, usize, usize)> = None;
            for i in 0..inputs.len() {
                for j in i + 1..inputs.len() {
                    let keep = needed([i, j], &inputs);
                    let mut labels: Vec<Label> = inputs[i].labels.clone();
                    labels.extend(&inputs[j].labels);
                    labels.sort_unstable();
                    labels.dedup();
                    let numel: usize = labels.iter().filter(|l| keep.contains(l)).map(|&l| size[l as usize]).product();
                    if best.is_none_or(|(n, _, _)| numel < n) {
                        best = Some((numel, i, j));
                    }
                }
            }
            let (_, i, j) = best.unwrap_or_else(|| unreachable!("two operands or more"));
            let keep = needed([i, j], &inputs);
            let b = inputs.remove(j);
            let a = inputs.remove(i);
            inputs.push(contract(a, b, &keep, &size));
        }
        let mut last = inputs.pop().unwrap_or_else(|| unreachable!("one operand at least"));
        sum_out(&mut last, &output);
        arrange(&last, &output, &size)
    }
}

/// Replaces each label repeated within `term` by its diagonal (the two dims read where their indices agree), as a
/// last dim: a strided slice of the two dims flattened.
#[track_caller]
fn diagonals(term: &mut Term) {
    while let Some((p, q)) = (0..term.labels.len())
        .find_map(|p| term.labels[p + 1..].iter().position(|&l| l == term.labels[p]).map(|d| (p, p + 1 + d)))
    {
        let (dims, l) = (term.t.dims().to_vec(), term.labels[p]);
        if dims[p] != dims[q] {
            fail!("einsum", "subscript {} is repeated over dims of sizes {} and {}", show(l), dims[p], dims[q]);
        }
        let n = dims[p];
        let rest: Vec<usize> = (0..dims.len()).filter(|&a| a != p && a != q).collect();
        let mut perm = rest.clone();
        perm.extend([p, q]);
        let mut flat: Vec<usize> = rest.iter().map(|&a| dims[a]).collect();
        flat.push(n * n);
        let t = term.t.permute(perm).reshape(flat);
        term.t = t.slice(-1, 0, (n * n) as isize, n + 1);
        term.labels = rest.iter().map(|&a| term.labels[a]).chain([l]).collect();
    }
}

/// Sums out every label of `term` not in `keep`.
fn sum_out(term: &mut Term, keep: &[Label]) {
    let axes: Vec<usize> = (0..term.labels.len()).filter(|&a| !keep.contains(&term.labels[a])).collect();
    if !axes.is_empty() {
        term.t = term.t.sum(axes.clone(), false);
        term.labels = term.labels.iter().enumerate().filter(|(a, _)| !axes.contains(a)).map(|(_, &l)| l).collect();
    }
}

/// `term`'s dims reordered as `order` (labels it has), each broadcast to `size` where it is 1.
fn arrange(term: &Term, order: &[Label], size: &[usize]) -> Tensor {
    let perm: Vec<usize> = order
        .iter()
        .map(|l| term.labels.iter().position(|x| x == l).unwrap_or_else(|| unreachable!("label present")))
        .collect();
    let t = term.t.permute(perm);
    let want: Vec<usize> = order.iter().map(|&l| size[l as usize]).collect();
    if t.dims() == want.as_slice() { t } else { t.expand(want) }
}

/// The product of `a` and `b` summed over the labels they share that are not in `keep`: labels in both and kept
/// are batch dims, one batched `matmul` over the shared summed ones (a broadcast product where there are none).
fn contract(mut a: Term, mut b: Term, keep: &[Label], size: &[usize]) -> Term {
    // A label only one side has and nothing later needs is summed first.
    let (la, lb) = (a.labels.clone(), b.labels.clone());
    sum_out(&mut a, &[keep, &lb].concat());
    sum_out(&mut b, &[keep, &la].concat());
    let batch: Vec<Label> = a.labels.iter().copied().filter(|l| b.labels.contains(l) && keep.contains(l)).collect();
    let summed: Vec<Label> = a.labels.iter().copied().filter(|l| b.labels.contains(l) && !keep.contains(l)).collect();
    let a_only: Vec<Label> = a.labels.iter().copied().filter(|l| !b.labels.contains(l)).collect();
    let b_only: Vec<Label> = b.labels.iter().copied().filter(|l| !a.labels.contains(l)).collect();
    let dims = |ls: &[Label]| -> Vec<usize> { ls.iter().map(|&l| size[l as usize]).collect() };
    let numel = |ls: &[Label]| -> usize { dims(ls).iter().product() };
    let labels: Vec<Label> = [batch.as_slice(), &a_only, &b_only].concat();
    let t = if summed.is_empty() {
        // [batch, a_only, 1..] * [batch, 1.., b_only]
        let x = arrange(&a, &[batch.as_slice(), &a_only].concat(), size);
        let y = arrange(&b, &[batch.as_slice(), &b_only].concat(), size);
        let mut xs = dims(&[batch.as_slice(), &a_only].concat());
        xs.extend(std::iter::repeat_n(1, b_only.len()));
        let mut ys = dims(&batch);
        ys.extend(std::iter::repeat_n(1, a_only.len()));
        ys.extend(dims(&b_only));
        x.reshape(xs).mul(y.reshape(ys))
    } else {
        let x = arrange(&a, &[batch.as_slice(), &a_only, &summed].concat(), size);
        let y = arrange(&b, &[batch.as_slice(), &summed, &b_only].concat(), size);
        let (nb, m, k, n) = (numel(&batch), numel(&a_only), numel(&summed), numel(&b_only));
        x.reshape(vec![nb, m, k]).matmul(&y.reshape(vec![nb, k, n])).reshape(dims(&labels))
    };
    Term { t, labels }
}
