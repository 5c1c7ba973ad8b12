// A function call is opaque to fuse!.
use kiln_macros::fuse;

fn main() {
    fuse!(gelu(&a) + 1.0);
}
