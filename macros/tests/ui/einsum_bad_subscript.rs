// A subscript that is not a letter.
use kiln_macros::einsum;

fn main() {
    einsum!("i1,1k->ik", a, b);
}
