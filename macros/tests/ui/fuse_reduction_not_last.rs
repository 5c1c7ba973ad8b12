// A reduction that feeds more work is refused: fuse! takes one, as the last op.
use kiln_macros::fuse;

fn main() {
    fuse!(a.sum(1, true).exp().sum_all());
}
