// An output index that no operand has.
use kiln_macros::einsum;

fn main() {
    einsum!((i, z) = a[i, k] * b[k, j]);
}
