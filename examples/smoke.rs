use kiln::{DType, Device, Tensor};
fn main() -> kiln::Result<()> {
    let dev = Device::cpu();
    let x = Tensor::from_vec(vec![1.0f32, -2.0, 3.0, -4.0, 5.0, 6.0], [2, 3], &dev)?;
    println!("{:?}", x.t().contiguous().to_vec::<f32>()?);
    println!("{:?}", x.softmax(-1).to_vec::<f32>()?);
    println!("{:?}", x.argmax(1, false).to_vec::<i64>()?);
    println!("{:?}", Tensor::cat(&[&x, &x.flip(1)], 0).to_vec::<f32>()?);
    println!("{:?}", Tensor::linspace(0.0, 1.0, 5, DType::F32, &dev).to_vec::<f32>()?);
    println!("{:?}", Tensor::eye(3, DType::I32, &dev).to_vec::<i32>()?);
    println!("{:?}", Tensor::arange(0, 10, 3, &dev).to_vec::<i64>()?);
    kiln::manual_seed(0);
    println!("{:?}", Tensor::randn([4], DType::F32, &dev).to_vec::<f32>()?);
    println!("{:?}", x.matmul(&x.t()).to_vec::<f32>()?);
    println!("{:?}", x.pad(&[(1, 0)], 9.0).to_vec::<f32>()?);
    println!("{:?}", kiln::stats());
    let y = x.sum(0, false);
    println!("{:?} {:?}", y, y.to_vec::<f32>());
    println!("{:?}", y.to_vec::<f64>());
    Ok(())
}
