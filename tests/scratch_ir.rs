use kiln::{DType, Device, Tensor};
#[test]
fn show() {
    let dev = Device::cpu();
    let m = |r: usize, c: usize| {
        Tensor::from_vec((0..r * c).map(|i| (i as f32).sin()).collect::<Vec<f32>>(), [r, c], &dev).unwrap()
    };
    let bias = m(1, 30).reshape([30]);
    let bf = |t: Tensor| t.to_dtype(DType::BF16);
    let cases = vec![
        m(7, 5).matmul(&m(5, 30)),
        m(7, 5).matmul(&m(5, 30)) + &bias,
        (m(7, 5).matmul(&m(30, 5).t()) + &bias).relu(),
        bf(m(7, 5)).matmul(&bf(m(5, 30))),
        (bf(m(7, 5)).matmul(&bf(m(5, 30))) + &bf(bias.clone())).relu(),
        kiln::nn::functional::gelu(
            &(bf(m(7, 5)).matmul(&bf(m(5, 30))) + &bias),
            kiln::nn::functional::Approximate::Tanh,
        ),
    ];
    for c in cases {
        let cap = kiln::capture(&[&c]).unwrap();
        let plan = kiln_backends::gpu_cache::schedule(&cap.graph);
        for l in &plan.launches {
            if let Some(v) = kiln_jit::kernel::gemm::GemmView::of(&l.kernel) {
                println!("{}\nview a={:?} b={:?} batch={:?}", l.kernel.to_text(), v.a, v.b, v.batch);
            }
        }
    }
}
