// Three subscript groups, two operands.
use kiln_macros::einsum;

fn main() {
    einsum!("ij,jk,kl->il", a, b);
}
