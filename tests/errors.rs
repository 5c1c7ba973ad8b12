//! Error reporting: programmer errors panic at the op with a message that names the op, the shapes or dtypes
//! involved and the *user's* file:line (this file's, never kiln's internals); errors that depend on data return
//! `Err` with a message that says what was given and what was expected; and a caught panic leaves kiln usable.

mod test_cache;

mod common_props;

use kiln::{DType, Device, Tensor};
// The op-misuse checks make their operands on the CPU.
#[cfg(feature = "cpu")]
use common_props::{Caught, catch_panic};
#[cfg(feature = "cpu")]
use kiln::Error;

const THIS_FILE: &str = "tests/errors.rs";

#[cfg(feature = "cpu")]
/// Runs the expression, which must panic; gives what was caught and the line the macro was invoked on (the
/// expression's tokens keep that line, so it is the line `#[track_caller]` must report).
macro_rules! panic_of {
    ($e:expr) => {{
        let caught = catch_panic(|| $e);
        (caught.unwrap_or_else(|| panic!("expected `{}` to panic", stringify!($e))), line!())
    }};
}

#[cfg(feature = "cpu")]
/// Checks a caught op panic: `kiln: <op>: ...` naming every needle, located at `line` of this file both in the
/// message and in the panic's own location.
#[track_caller]
fn assert_op_panic((caught, line): (Caught, u32), op: &str, needles: &[&str]) {
    let msg = &caught.message;
    assert!(msg.starts_with(&format!("kiln: {op}: ")), "message does not start with `kiln: {op}: `: {msg}");
    for n in needles {
        assert!(msg.contains(n), "message does not name `{n}`: {msg}");
    }
    let at = format!("(at {THIS_FILE}:{line}:");
    let tail = msg.split(&at).nth(1).unwrap_or_else(|| panic!("message is not located at {THIS_FILE}:{line}: {msg}"));
    let column = tail.strip_suffix(')').unwrap_or_else(|| panic!("message does not end with the location: {msg}"));
    assert!(column.parse::<u32>().is_ok_and(|c| c > 0), "bad column `{column}` in: {msg}");
    let (file, l, c) = caught.location.clone().expect("the panic hook saw a location");
    assert_eq!((file.as_str(), l), (THIS_FILE, line), "the panic's own location should be the caller's: {msg}");
    assert_eq!(c.to_string(), column, "message and panic location disagree on the column: {msg}");
}

#[cfg(feature = "cpu")]
fn dev() -> Device {
    Device::cpu()
}

#[cfg(feature = "cpu")]
fn f32s(dims: &[usize]) -> Tensor {
    let n = dims.iter().product::<usize>();
    Tensor::from_vec((0..n).map(|i| i as f32).collect::<Vec<_>>(), dims.to_vec(), &dev()).unwrap()
}

#[test]
fn this_file_is_where_we_think() {
    assert_eq!(file!(), THIS_FILE);
}

#[cfg(feature = "cpu")]
#[test]
fn add_with_incompatible_shapes() {
    let (a, b) = (f32s(&[2, 3]), f32s(&[4]));
    assert_op_panic(panic_of!(a.add(&b)), "add", &["[2, 3]", "[4]", "broadcast"]);
    // The operator forms report the user's line too.
    assert_op_panic(panic_of!(&a + &b), "add", &["[2, 3]", "[4]"]);
    assert_op_panic(panic_of!(a.clone() * b.clone()), "mul", &["[2, 3]", "[4]"]);
    assert_op_panic(panic_of!(&b - &a), "sub", &["[4]", "[2, 3]"]);
    assert_op_panic(panic_of!(a.maximum(&b)), "maximum", &["[2, 3]", "[4]"]);
    // A composite op reports at the user's call, not at the primitive inside it.
    assert_op_panic(panic_of!(a.clamp(&b, 1.0)), "clamp", &["[2, 3]", "[4]"]);
}

#[cfg(feature = "cpu")]
#[test]
fn matmul_inner_dim_mismatch() {
    let (a, b) = (f32s(&[2, 3]), f32s(&[4, 5]));
    assert_op_panic(panic_of!(a.matmul(&b)), "matmul", &["[2, 3]", "[4, 5]", "inner"]);
    let (v, m) = (f32s(&[3]), f32s(&[2, 2]));
    assert_op_panic(panic_of!(v.matmul(&m)), "matmul", &["[3]", "[2, 2]"]);
    let (x, y) = (f32s(&[2, 2, 3]), f32s(&[3, 3, 4]));
    assert_op_panic(panic_of!(x.matmul(&y)), "matmul", &["[2, 2, 3]", "[3, 3, 4]", "batch"]);
}

#[cfg(feature = "cpu")]
#[test]
fn reshape_to_a_wrong_element_count() {
    let a = f32s(&[2, 3]);
    assert_op_panic(panic_of!(a.reshape([4, 2])), "reshape", &["[2, 3]", "[4, 2]", "6", "8"]);
    assert_op_panic(panic_of!(a.reshape([4, -1])), "reshape", &["[2, 3]", "[4, -1]"]);
    assert_op_panic(panic_of!(a.reshape([-1, -1])), "reshape", &["[-1, -1]"]);
    assert_op_panic(panic_of!(a.view([7])), "view", &["[2, 3]", "[7]"]);
}

#[cfg(feature = "cpu")]
#[test]
fn bad_dim_index() {
    let a = f32s(&[2, 3]);
    assert_op_panic(panic_of!(a.sum(2, false)), "sum", &["dim 2", "rank 2"]);
    assert_op_panic(panic_of!(a.sum([-3], true)), "sum", &["dim -3", "rank 2"]);
    assert_op_panic(panic_of!(a.sum([0, -2], false)), "sum", &["more than once"]);
    assert_op_panic(panic_of!(a.mean(5, false)), "mean", &["dim 5", "rank 2"]);
    assert_op_panic(panic_of!(a.transpose(0, 5)), "transpose", &["dim 5", "rank 2"]);
    assert_op_panic(panic_of!(a.t().transpose(-3, 0)), "transpose", &["dim -3", "rank 2"]);
    assert_op_panic(panic_of!(a.permute([0, 7])), "permute", &["dim 7", "rank 2"]);
    assert_op_panic(panic_of!(a.permute([0])), "permute", &["[0]", "rank 2"]);
    assert_op_panic(panic_of!(a.permute([1, 1])), "permute", &["[1, 1]"]);
    assert_op_panic(panic_of!(a.unsqueeze(4)), "unsqueeze", &["dim 4"]);
    assert_op_panic(panic_of!(a.flip([0, 2])), "flip", &["dim 2"]);
    assert_op_panic(panic_of!(a.softmax(2)), "softmax", &["dim 2"]);
}

#[cfg(feature = "cpu")]
#[test]
fn cat_and_stack_with_mismatched_shapes() {
    let (a, b) = (f32s(&[2, 3]), f32s(&[3, 4]));
    assert_op_panic(panic_of!(Tensor::cat(&[&a, &b], 0)), "cat", &["[2, 3]", "[3, 4]", "dim 0"]);
    let c = f32s(&[2, 3, 1]);
    assert_op_panic(panic_of!(Tensor::cat(&[&a, &c], 1)), "cat", &["[2, 3]", "[2, 3, 1]"]);
    assert_op_panic(panic_of!(Tensor::cat(&[&a, &a], 2)), "cat", &["dim 2", "rank 2"]);
    assert_op_panic(panic_of!(Tensor::cat(&[], 0)), "cat", &["at least one"]);
    let s = f32s(&[]);
    assert_op_panic(panic_of!(Tensor::cat(&[&s, &s], 0)), "cat", &["zero-dim"]);
    assert_op_panic(panic_of!(Tensor::stack(&[&a, &b], 0)), "stack", &["[2, 3]", "[3, 4]"]);
}

#[cfg(feature = "cpu")]
#[test]
fn where_with_a_non_bool_condition() {
    let (a, b) = (f32s(&[2, 3]), f32s(&[3]));
    assert_op_panic(panic_of!(a.where_(&a, &b)), "where_", &["bool", "f32"]);
    let i = a.to_dtype(DType::I64);
    assert_op_panic(panic_of!(i.where_(1.0, 0.0)), "where_", &["bool", "i64"]);
    // And with a bool condition whose shape does not broadcast, all three shapes are named.
    let cond = f32s(&[4]).gt(1.0);
    assert_op_panic(panic_of!(cond.where_(&a, &b)), "where_", &["[4]", "[2, 3]", "[3]"]);
}

#[cfg(feature = "cpu")]
#[test]
fn dtype_misuse() {
    let mask = f32s(&[3]).gt(0.5);
    assert_op_panic(panic_of!(mask.neg()), "neg", &["bool"]);
    assert_op_panic(panic_of!(-&mask), "neg", &["bool"]);
    assert_op_panic(panic_of!(&mask - &mask), "sub", &["bool"]);
    let ints = f32s(&[2, 3]).to_dtype(DType::I64);
    assert_op_panic(panic_of!(ints.mean(0, false)), "mean", &["float", "i64"]);
    assert_op_panic(panic_of!(ints.mean_all()), "mean", &["i64"]);
    assert_op_panic(panic_of!(mask.matmul(&mask)), "matmul", &["bool"]);
}

#[cfg(feature = "cpu")]
#[test]
fn max_over_an_empty_dim() {
    let e = f32s(&[0, 3]);
    assert_op_panic(panic_of!(e.max(0, false)), "max", &["dim 0", "[0, 3]", "empty"]);
    assert_op_panic(panic_of!(e.min([-2], true)), "min", &["[0, 3]", "empty"]);
    assert_op_panic(panic_of!(e.max_all()), "max", &["[0, 3]", "empty"]);
    assert_op_panic(panic_of!(e.argmax(0, false)), "argmax", &["[0, 3]", "empty"]);
    // Over the non-empty dim it is fine, and so is a sum over the empty one.
    assert_eq!(e.max(1, false).dims(), &[0]);
    assert_eq!(e.sum(0, false).to_vec::<f32>().unwrap(), vec![0.0; 3]);
}

#[cfg(feature = "cpu")]
#[test]
fn other_movement_misuse() {
    let a = f32s(&[2, 3]);
    assert_op_panic(panic_of!(a.expand([4, 3, 2])), "expand", &["[2, 3]", "[4, 3, 2]"]);
    assert_op_panic(panic_of!(a.expand([3])), "expand", &["[3]", "[2, 3]"]);
    assert_op_panic(panic_of!(a.narrow(1, 2, 2)), "narrow", &["[2, 3]"]);
    assert_op_panic(panic_of!(a.slice(0, 0, 2, 0)), "slice", &["step"]);
    assert_op_panic(panic_of!(a.pad(&[(1, 1), (1, 1), (1, 1)], 0.0)), "pad", &["rank 2"]);
    assert_op_panic(panic_of!(f32s(&[2, 2, 2]).t()), "t", &["[2, 2, 2]"]);
    let s = f32s(&[]);
    assert_op_panic(panic_of!(s.narrow(0, 0, 1)), "narrow", &["zero-dim"]);
    assert_op_panic(panic_of!(s.slice(0, 0, 1, 1)), "slice", &["zero-dim"]);
    // The border modes name the mode, the pad and the dim it does not fit.
    assert_op_panic(
        panic_of!(a.pad_with(&[(3, 0)], kiln::PadMode::Reflect)),
        "pad",
        &["Reflect", "(3, 0)", "length 3"],
    );
    assert_op_panic(panic_of!(a.pad_with(&[(0, 4)], kiln::PadMode::Circular)), "pad", &["Circular", "(0, 4)"]);
    assert_op_panic(panic_of!(a.roll(&[1, 2], &[0])), "roll", &["2 shifts for 1 dims"]);
    assert_op_panic(panic_of!(a.repeat(&[2])), "repeat", &["1 repeats", "2 dims"]);
    assert_op_panic(panic_of!(a.split_sizes(&[1, 1], 1)), "split", &["add up to 2", "length 3"]);
    assert_op_panic(panic_of!(f32s(&[3]).tril(0)), "tril", &["at least 2 dims"]);
}

#[cfg(feature = "cpu")]
#[test]
fn from_vec_with_a_wrong_length_is_an_err() {
    let err = Tensor::from_vec(vec![1.0f32; 5], [2, 3], &dev()).unwrap_err();
    assert!(matches!(err, Error::DataLength { len: 5, expected: 6, .. }), "{err:?}");
    let msg = err.to_string();
    for needle in ["from_vec", "5", "[2, 3]", "6"] {
        assert!(msg.contains(needle), "`{needle}` missing from: {msg}");
    }
    let err = Tensor::from_slice(&[1i64, 2], [3], &dev()).unwrap_err();
    assert!(err.to_string().contains("from_slice") && err.to_string().contains("[3]"), "{err}");
    // Zero elements for a zero-dim shape (which holds one) is wrong too; zero for an empty shape is right.
    assert!(Tensor::from_vec(Vec::<f64>::new(), Vec::<usize>::new(), &dev()).is_err());
    assert_eq!(Tensor::from_vec(Vec::<f64>::new(), [3, 0], &dev()).unwrap().dims(), &[3, 0]);
}

#[cfg(feature = "cpu")]
#[test]
fn to_vec_with_the_wrong_type_is_an_err() {
    let a = f32s(&[2]);
    let err = a.to_vec::<f64>().unwrap_err();
    assert!(matches!(err, Error::DType { actual: DType::F32, requested: DType::F64, .. }), "{err:?}");
    let msg = err.to_string();
    assert!(msg.contains("to_vec") && msg.contains("f32") && msg.contains("f64"), "{msg}");
    // It fails before computing anything, on a lazy tensor too, and the right type still works afterwards.
    let lazy = &a * 2.0;
    assert!(lazy.to_vec::<i64>().is_err());
    assert!(!lazy.is_realized());
    assert_eq!(lazy.to_vec::<f32>().unwrap(), vec![0.0, 2.0]);
    assert!(a.gt(0.0).to_vec::<u8>().is_err());
}

#[cfg(feature = "cpu")]
#[test]
fn item_on_a_multi_element_tensor_is_an_err() {
    let a = f32s(&[2, 2]);
    let err = a.item::<f32>().unwrap_err();
    assert!(matches!(err, Error::NotOneElement { numel: 4, .. }), "{err:?}");
    let msg = err.to_string();
    assert!(msg.contains("item") && msg.contains("[2, 2]") && msg.contains('4'), "{msg}");
    assert!(f32s(&[0]).item::<f32>().is_err());
    assert!(a.sum_all().item::<f64>().is_err(), "item with the wrong type");
    assert_eq!(a.sum_all().item::<f32>().unwrap(), 6.0);
    assert_eq!(f32s(&[1, 1]).add(7.0).item::<f32>().unwrap(), 7.0);
}

#[cfg(feature = "cpu")]
#[test]
fn kiln_is_usable_after_a_caught_panic() {
    let (a, b) = (f32s(&[2, 3]), f32s(&[4]));
    let lazy = (&a + 1.0).exp(); // a lazy graph that exists while the panics happen
    assert_op_panic(panic_of!(&lazy + &b), "add", &["[2, 3]", "[4]"]);
    assert_op_panic(panic_of!(lazy.matmul(&b)), "matmul", &["[2, 3]", "[4]"]);
    assert_op_panic(panic_of!(Tensor::cat(&[&lazy, &b], 0)), "cat", &["[2, 3]", "[4]"]);
    // The operands, the lazy graph and new work all still compute, alone and together.
    let c = lazy.sum(1, false) + b.narrow(0, 0, 2);
    let d = a.t().matmul(&a);
    kiln::realize(&[&c, &d]).unwrap();
    let want0 = (1.0f64.exp() + 2.0f64.exp() + 3.0f64.exp()) as f32; // row 0 of exp(a + 1), plus b[0] == 0
    let got = c.to_vec::<f32>().unwrap();
    assert!((got[0] - want0).abs() <= 1e-3 * want0, "{got:?}");
    assert_eq!(d.to_vec::<f32>().unwrap(), vec![9.0, 12.0, 15.0, 12.0, 17.0, 22.0, 15.0, 22.0, 29.0]);
    // Realizing on another thread works too (no lock was left poisoned or held).
    let b2 = b.clone();
    let total = std::thread::spawn(move || b2.square().sum_all().item::<f32>().unwrap()).join().unwrap();
    assert_eq!(total, 14.0);
}

/// The wgpu device, if this machine has an adapter (`KILN_REQUIRE_WGPU=1` makes a missing one fail, as in CI).
fn wgpu() -> Option<Device> {
    match "wgpu".parse::<Device>() {
        Ok(d) => Some(d),
        Err(e) if std::env::var("KILN_REQUIRE_WGPU").is_ok_and(|v| v == "1") => panic!("KILN_REQUIRE_WGPU=1: {e}"),
        Err(_) => {
            eprintln!("skipping wgpu: no adapter (apt-get install mesa-vulkan-drivers libvulkan1)");
            None
        }
    }
}

#[cfg(feature = "cpu")]
/// On wgpu, 64-bit dtypes are refused clearly: an op whose result would be f64 or i64 panics at the op (naming the
/// dtype and the device, at the user's line), and data of those dtypes is an `Err` at upload.
#[test]
fn wgpu_refuses_64_bit_dtypes_at_the_op_and_at_upload() {
    let Some(w) = wgpu() else { return };
    let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0], [3], &w).unwrap();
    assert_op_panic(panic_of!(x.to_dtype(DType::F64)), "cast", &["f64", "wgpu", "no 64-bit types", "Device::cpu()"]);
    // argmax and argmin give i32 indices there (i64 on the CPU, as PyTorch).
    let y = Tensor::from_vec(vec![1.0f32, 5.0, 3.0, 7.0, -1.0, 2.0], [2, 3], &w).unwrap();
    assert_eq!(y.argmax(1, false).dtype(), DType::I32);
    assert_eq!(y.argmax(1, false).to_vec::<i32>().unwrap(), vec![1, 0]);
    assert_eq!(y.argmin(0, false).to_vec::<i32>().unwrap(), vec![0, 1, 1]);
    assert_eq!(y.argmax_all().to_vec::<i32>().unwrap(), vec![3]);
    assert_op_panic(panic_of!(x.to_dtype(DType::I64)), "cast", &["i64", "wgpu"]);
    assert_op_panic(panic_of!(Tensor::zeros([2], DType::I64, &w)), "const(0)", &["i64", "wgpu"]);
    let e = Tensor::from_vec(vec![1.0f64], [1], &w).unwrap_err().to_string();
    assert!(e.contains("f64") && e.contains("wgpu") && e.contains("Device::cpu()"), "{e}");
    let e = Tensor::from_vec(vec![1i64], [1], &Device::cpu()).unwrap().to_device(&w).unwrap_err().to_string();
    assert!(e.contains("i64") && e.contains("wgpu"), "{e}");
    // f32, i32, u8 and bool round-trip, and moving back to the CPU is the only way data comes back.
    let b = Tensor::from_vec(vec![true, false], [2], &w).unwrap();
    assert_eq!(b.logical_not().to_device(&Device::cpu()).unwrap().to_vec::<bool>().unwrap(), vec![false, true]);
}

#[cfg(feature = "cpu")]
/// Operands on two devices are a programmer error at the op, naming both devices.
#[test]
fn ops_across_devices_panic_naming_both() {
    let Some(w) = wgpu() else { return };
    let a = Tensor::from_vec(vec![1.0f32], [1], &w).unwrap();
    let c = f32s(&[1]);
    assert_op_panic(panic_of!(a.add(&c)), "add", &["wgpu", "cpu", "to_device"]);
}

/// An unknown device name is an error listing the devices this build knows.
#[test]
fn unknown_device_name_is_an_error() {
    let e = "tpu".parse::<Device>().unwrap_err().to_string();
    let known = if cfg!(feature = "cpu") { "cpu" } else { "wgpu" };
    assert!(e.contains("tpu") && e.contains(known), "{e}");
}

#[cfg(feature = "cpu")]
/// Not a test on its own (ignored, so it never counts as a pass): the body of the child process of
/// `wgpu_without_shader_f16_refuses_f16_naming_the_feature`, which runs with the feature declined.
#[test]
#[ignore = "the child process of wgpu_without_shader_f16_refuses_f16_naming_the_feature"]
fn f16_refusal_child() {
    if std::env::var("KILN_WGPU_F16").as_deref() != Ok("off") {
        return;
    }
    let Some(w) = wgpu() else { return };
    assert!(!w.supports(DType::F16), "KILN_WGPU_F16=off still gave f16");
    let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0], [3], &w).unwrap();
    assert_op_panic(panic_of!(x.to_dtype(DType::F16)), "cast", &["f16", "wgpu", "SHADER_F16", "Device::cpu()"]);
    assert_op_panic(panic_of!(Tensor::zeros([2], DType::F16, &w)), "const(0)", &["f16", "SHADER_F16"]);
    let h = vec![kiln::f16::ONE; 3];
    let e = Tensor::from_vec(h.clone(), [3], &w).unwrap_err().to_string();
    assert!(e.contains("f16") && e.contains("SHADER_F16") && e.contains("KILN_WGPU_F16=off"), "{e}");
    let e = Tensor::from_vec(h, [3], &Device::cpu()).unwrap().to_device(&w).unwrap_err().to_string();
    assert!(e.contains("SHADER_F16"), "{e}");
    // Everything else still runs there.
    assert_eq!(x.mul(2.0).to_vec::<f32>().unwrap(), [2.0, 4.0, 6.0]);
    println!("F16_REFUSED_OK");
}

#[cfg(feature = "cpu")]
/// wgpu refuses bf16 (WGSL has no such type; kiln does not emulate it): at the op, at upload and at a move from the
/// CPU, each naming bf16 and the way out; nothing falls back to the CPU.
#[test]
fn wgpu_refuses_bf16_at_the_op_and_at_upload() {
    let Some(w) = wgpu() else { return };
    assert!(!w.supports(DType::BF16));
    let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0], [3], &w).unwrap();
    assert_op_panic(panic_of!(x.to_dtype(DType::BF16)), "cast", &["bf16", "wgpu", "Device::cpu()"]);
    assert_op_panic(panic_of!(Tensor::zeros([2], DType::BF16, &w)), "const(0)", &["bf16", "wgpu"]);
    let h = vec![kiln::bf16::ONE; 3];
    let e = Tensor::from_vec(h.clone(), [3], &w).unwrap_err().to_string();
    assert!(e.contains("bf16") && e.contains("Device::cpu()"), "{e}");
    let e = Tensor::from_vec(h, [3], &Device::cpu()).unwrap().to_device(&w).unwrap_err().to_string();
    assert!(e.contains("bf16"), "{e}");
}

#[cfg(feature = "cpu")]
/// On a wgpu device without `SHADER_F16` (simulated by declining it, `KILN_WGPU_F16=off`, in a child process: the
/// device is opened once per process), f16 is refused at the op and at upload, naming the missing feature; nothing
/// falls back to the CPU.
#[test]
fn wgpu_without_shader_f16_refuses_f16_naming_the_feature() {
    if wgpu().is_none() {
        return;
    }
    let (ok, text, stderr) = run_child("f16_refusal_child", &[("KILN_WGPU_F16", Some("off"))]);
    assert!(ok && text.contains("F16_REFUSED_OK"), "child failed:\n{text}\n{stderr}");
}

/// Runs this binary's ignored test `child` alone in a child process, the environment changed by `env` (`Some`:
/// set, `None`: removed), for what a process decides once (the wgpu device is opened once per process). Returns
/// whether it passed, its stdout and its stderr.
fn run_child(child: &str, env: &[(&str, Option<&str>)]) -> (bool, String, String) {
    let mut cmd = std::process::Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", child, "--ignored", "--nocapture", "--test-threads=1"]);
    for (name, value) in env {
        match value {
            Some(v) => cmd.env(name, v),
            None => cmd.env_remove(name),
        };
    }
    let out = cmd.output().unwrap();
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (out.status.success(), text(&out.stdout), text(&out.stderr))
}

/// `WGPU_BACKEND` with a name wgpu does not know is an error naming the valid ones (wgpu skipped it silently, and
/// the error then said to install a driver). Checked in a child: the wgpu device is opened once per process.
#[cfg(feature = "wgpu")]
#[test]
fn an_unknown_wgpu_backend_name_is_refused_with_the_valid_ones() {
    let (ok, stdout, stderr) = run_child("wgpu_backend_child", &[("WGPU_BACKEND", Some("bogus"))]);
    assert!(ok, "{stdout}\n{stderr}");
    assert!(stdout.contains("unknown backend \"bogus\"") && stdout.contains("vulkan, vk, gl"), "{stdout}");
}

#[cfg(feature = "wgpu")]
#[test]
#[ignore = "run by an_unknown_wgpu_backend_name_is_refused_with_the_valid_ones"]
fn wgpu_backend_child() {
    match Device::wgpu() {
        Ok(_) => panic!("WGPU_BACKEND=bogus opened a device"),
        Err(e) => println!("ERROR {e}"),
    }
}

/// Opening wgpu without `XDG_RUNTIME_DIR` (root, containers, CI) prints nothing: kiln gives Mesa a private runtime
/// dir, where Mesa printed `error: XDG_RUNTIME_DIR is invalid or not set` per device opened.
#[cfg(feature = "wgpu")]
#[test]
fn opening_wgpu_without_a_runtime_dir_prints_no_driver_noise() {
    if wgpu().is_none() {
        return;
    }
    let (ok, stdout, stderr) = run_child("wgpu_open_child", &[("XDG_RUNTIME_DIR", None), ("WGPU_BACKEND", None)]);
    assert!(ok, "{stdout}\n{stderr}");
    assert!(!stderr.contains("XDG_RUNTIME_DIR"), "{stderr}");
}

#[cfg(feature = "wgpu")]
#[test]
#[ignore = "run by opening_wgpu_without_a_runtime_dir_prints_no_driver_noise"]
fn wgpu_open_child() {
    let dev = Device::wgpu().expect("the parent found an adapter");
    assert_eq!(Tensor::ones([4], DType::F32, &dev).sum_all().item::<f32>().unwrap(), 4.0);
}
