// The string form checks typed operands the same way: `j` is 4 in `a` and 5 in `b`.
use kiln::{Tensor2, einsum};

fn product(a: &Tensor2<3, 4>, b: &Tensor2<5, 6>) -> kiln::Tensor {
    einsum!("ij,jk->ik", a, b)
}

fn main() {}
