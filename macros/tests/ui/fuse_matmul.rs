// A matmul inside fuse! is refused at its span.
use kiln_macros::fuse;

fn main() {
    fuse!(a.sin().matmul(&b) * 2.0);
}
