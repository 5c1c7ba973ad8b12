use kiln::{
    DType, Device, Tensor, nn,
    optim::{Optimizer, Sgd},
};

fn main() -> kiln::Result<()> {
    let dev = Device::cpu();
    let x = Tensor::randn([64, 3], DType::F32, &dev);
    let y = x.matmul(&Tensor::from_vec(vec![1.0f32, -2.0, 0.5], [3, 1], &dev)?);
    let w = nn::Param::new("w", Tensor::randn([3, 1], DType::F32, &dev));
    kiln::realize(&[&x, &y, &w.get()])?; // the data: one plan
    let mut opt = Sgd::new(vec![w.clone()], 0.1);
    for _ in 0..100 {
        let loss = (x.matmul(&w.get()) - &y).square().mean_all(); // nothing runs yet
        opt.step(loss.backward()?, &[&loss])?; // forward, backward, update in place: one plan
    }
    let s = kiln::stats(); // the step's plan compiled once, in the first step, and replayed 99 times
    println!("w = {:?}", w.get().to_vec::<f32>()?);
    println!("{} plans compiled, {} replayed", s.plan_misses, s.plan_hits);
    Ok(())
}
