//! A graph's signature: the plan cache's key, written while `realize` walks the lazy DAG, and read back into the
//! graph it encodes when a persisted plan is rebuilt (`plan_store`).
//!
//! The layout, all u64 words: the device code; then each node in walk order (operands before their consumers):
//! its op ([`Op::encode`]), one header word (dtype code below 2^8, operand count in bits 8..16, rank from bit
//! 16), its dims, its operand ids (u32, two to a word); then [`END_OF_NODES`] and the ids of the output nodes.
//! Every op encoding starts with a small kind number, so the end marker cannot be mistaken for a node.
//!
//! The encoding is the whole graph, never a hash of it: the plan cache compares it word for word, and [`decode`]
//! gives back exactly the graph `realize` would build from the same walk (the same node order and indices).

use kiln_jit::DType;
// What `decode` builds (persisted plans, CPU only).
#[cfg(feature = "cpu")]
use kiln_jit::{Graph, NodeData, Op, Shape};
#[cfg(feature = "cpu")]
use petgraph::stable_graph::NodeIndex;

/// Separates the nodes from the output ids.
pub(crate) const END_OF_NODES: u64 = u64::MAX;

/// Appends a node's header, dims and operand ids (its op is written just before, by `Op::encode`).
pub(crate) fn push_node(sig: &mut Vec<u64>, dtype: DType, dims: &[usize], srcs: &[u32]) {
    // Packed, since every cache hit writes, hashes and compares the whole signature. The header says how many
    // words follow, so the encoding stays unambiguous (a rank of 2^48 could not be held in memory; ops take <= 3
    // operands).
    sig.push(dtype.code() | (srcs.len() as u64) << 8 | (dims.len() as u64) << 16);
    sig.extend(dims.iter().map(|&d| d as u64));
    sig.extend(srcs.chunks(2).map(|p| p[0] as u64 | (p.get(1).map_or(0, |&s| s as u64) << 32)));
}

/// The device code and the graph a signature encodes. An `Err` (never a panic) names what is wrong when the words
/// are not a well-formed signature of a valid graph (shapes and dtypes are checked as a new graph's are). Only
/// persisted plans are decoded, and those are CPU plans (`plan_store`).
#[cfg(feature = "cpu")]
pub(crate) fn decode(sig: &[u64]) -> Result<(u64, Graph), String> {
    let (&device, mut rest) = sig.split_first().ok_or("an empty signature")?;
    let mut g = Graph::new();
    let mut ids: Vec<NodeIndex> = Vec::new();
    let cut = || "the signature ends inside a node".to_string();
    while rest.first() != Some(&END_OF_NODES) {
        let n = ids.len();
        let (op, used) = Op::decode(rest).ok_or_else(|| format!("node {n}: not an op encoding"))?;
        rest = &rest[used..];
        let (&header, tail) = rest.split_first().ok_or_else(cut)?;
        let dtype = DType::from_code(header & 0xff).ok_or_else(|| format!("node {n}: unknown dtype"))?;
        let nsrcs = (header >> 8 & 0xff) as usize;
        let rank = usize::try_from(header >> 16).map_err(|_| cut())?;
        if nsrcs != op.arity() || rank > 64 {
            return Err(format!("node {n} ({op}): {nsrcs} operands and rank {rank}"));
        }
        let src_words = nsrcs.div_ceil(2);
        let body = tail.get(..rank + src_words).ok_or_else(cut)?;
        let dims: Vec<usize> =
            body[..rank].iter().map(|&d| usize::try_from(d).map_err(|_| cut())).collect::<Result<_, _>>()?;
        let mut srcs = Vec::with_capacity(nsrcs);
        for i in 0..nsrcs {
            let word = body[rank + i / 2];
            let id = (if i % 2 == 0 { word } else { word >> 32 } & 0xffff_ffff) as usize;
            srcs.push(*ids.get(id).ok_or_else(|| format!("node {n}: operand {id} is not an earlier node"))?);
        }
        dims.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d)).ok_or_else(|| format!("node {n}: too large"))?;
        ids.push(g.add(NodeData { op, shape: Shape::new(&dims), dtype }, &srcs));
        rest = &tail[rank + src_words..];
    }
    let outputs = &rest[1..];
    g.outputs = outputs
        .iter()
        .map(|&o| usize::try_from(o).ok().and_then(|o| ids.get(o).copied()).ok_or("an output is not a node"))
        .collect::<Result<_, _>>()?;
    if g.outputs.is_empty() {
        return Err("no outputs".into());
    }
    g.verify()?;
    Ok((device, g))
}

// On the CPU: the encoding does not depend on the device, and the CPU needs nothing installed.
#[cfg(all(test, feature = "cpu"))]
mod tests {
    use super::*;
    use crate::{Device, Tensor};

    /// A graph with every kind of op: inputs, constants, iota, both random distributions, unary, binary, where,
    /// cast, reductions, every movement op, matmul, and a backward pass through most of them.
    fn model() -> Vec<Tensor> {
        let dev = Device::cpu();
        let x = Tensor::from_vec((0..24).map(|i| i as f32 * 0.1 - 1.0).collect(), [4, 6], &dev).unwrap();
        let w = Tensor::from_vec((0..18).map(|i| (i as f32).sin()).collect(), [3, 6], &dev).unwrap().requires_grad();
        let h = crate::nn::functional::dropout(&x.matmul(&w.t()), 0.25, true).tanh()
            + Tensor::randn([4, 3], DType::F32, &dev);
        let h = crate::nn::functional::leaky_relu(&h, 0.01).pad(&[(1, 0), (0, 2)], -0.0).flip([0]).slice(1, 0, 5, 2);
        let labels = Tensor::arange(0i64, 5i64, 1i64, &dev).reshape([5]);
        let loss = crate::nn::functional::cross_entropy(
            &h.softmax(-1).log().narrow(0, 0, 5),
            &labels.to_dtype(DType::I64).minimum(4i64),
            crate::nn::functional::Reduction::Mean,
        );
        let g = loss.backward().unwrap();
        let gw = g.get(&w).unwrap().clone();
        vec![loss, gw, h.max([1], false).to_dtype(DType::F64), Tensor::cat(&[&x, &x.exp()], 0).permute([1, 0])]
    }

    #[test]
    fn a_signature_decodes_to_the_graph_realize_would_compile() {
        let outs = model();
        let refs: Vec<&Tensor> = outs.iter().collect();
        let (sig, graph) = crate::realize::signature_and_graph(Device::cpu(), &refs);
        let (device, decoded) = decode(&sig).unwrap();
        assert_eq!(device, Device::cpu().code());
        assert_eq!(decoded.to_text(), graph.to_text());
        assert_eq!(decoded.outputs, graph.outputs);
        assert!(graph.g.node_count() > 40, "the model is a real graph: {}", graph.to_text());
        let kinds: std::collections::BTreeSet<String> = graph
            .g
            .node_weights()
            .map(|n| format!("{:?}", n.op).chars().take_while(|c| c.is_alphabetic()).collect())
            .collect();
        for kind in [
            "Input", "Const", "Iota", "Rand", "Unary", "Binary", "Where", "Cast", "Reduce", "Reshape", "Permute",
            "Expand", "Slice", "Pad", "Matmul",
        ] {
            assert!(kinds.contains(kind), "no {kind} node in the test graph: {kinds:?}");
        }
    }

    #[test]
    fn a_damaged_signature_is_refused_or_decodes_to_a_valid_graph_never_a_panic() {
        let outs = model();
        let refs: Vec<&Tensor> = outs.iter().collect();
        let (sig, _) = crate::realize::signature_and_graph(Device::cpu(), &refs);
        // Cut before the first output: refused (a cut among the outputs is a valid graph with fewer outputs).
        let end = sig.iter().rposition(|&w| w == END_OF_NODES).unwrap();
        for cut in 0..=end + 1 {
            assert!(decode(&sig[..cut]).is_err(), "cut at {cut}");
        }
        // Every word replaced by a few values each (the decoded graph, if any, passed `Graph::verify`).
        let mut accepted = 0;
        for i in 0..sig.len() {
            for v in [0, 1, 2, 3, 5, 16, 17, 1 << 16, u64::MAX, sig[i] ^ 1, sig[i].wrapping_add(1 << 32)] {
                let mut bad = sig.clone();
                bad[i] = v;
                accepted += usize::from(decode(&bad).is_ok());
            }
        }
        assert!(accepted < sig.len() * 11, "most damage is refused ({accepted})");
    }
}
