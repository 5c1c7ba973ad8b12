use kiln::{DType, Device, Tensor};
fn main() {
    let dev = Device::cpu();
    let a = Tensor::rand([1024, 1024], DType::F32, &dev); a.realize().unwrap();
    let b = Tensor::rand([1024, 1024], DType::F32, &dev); b.realize().unwrap();
    a.matmul(&b).realize().unwrap();
}
