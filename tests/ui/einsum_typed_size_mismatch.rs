// The shared index `i` is 784 in `x` and 256 in `w`: both sizes are in the operands' types.
use kiln::{Tensor2, einsum};

fn layer(x: Tensor2<32, 784>, w: Tensor2<256, 784>) -> kiln::Tensor {
    einsum!((b, o) = x[b, i] * w[i, o])
}

fn main() {}
