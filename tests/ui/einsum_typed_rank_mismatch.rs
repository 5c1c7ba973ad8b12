// `m` is a matrix by its type, given three indices.
use kiln::{Tensor2, einsum};

fn trace(m: Tensor2<3, 3>) -> kiln::Tensor {
    einsum!(() = m[i, i, i])
}

fn main() {}
