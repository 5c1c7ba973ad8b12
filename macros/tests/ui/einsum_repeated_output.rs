// An index twice in the output.
use kiln_macros::einsum;

fn main() {
    einsum!((i, i) = a[i, k] * b[k, i]);
}
