//! Weights on disk: safetensors round trips for every dtype, the byte layout PyTorch's `safetensors.torch` reads
//! and writes (checked by hand-parsing and hand-building files), module save/load, and every error case.

// Weights are saved from and loaded to the CPU (cargo feature `cpu`).
#![cfg(feature = "cpu")]

mod test_cache;

use kiln::nn::{Linear, Module, ReLU, Sequential};
use kiln::{DType, Device, Error, Tensor, f16, load_module, load_safetensors, save_module, save_safetensors};
use std::path::PathBuf;

fn dev() -> Device {
    Device::cpu()
}

/// A fresh path in the temp dir, unique to this process and `tag`.
fn temp_path(tag: &str) -> PathBuf {
    std::env::temp_dir().join(format!("kiln-io-test-{}-{tag}.safetensors", std::process::id()))
}

/// Removes the file when the test ends, passed or not.
struct Cleanup(PathBuf);
impl Drop for Cleanup {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A safetensors file built by hand: `(name, dtype name, shape, little-endian bytes)`, laid out as the format says
/// (and as `safetensors.torch.save_file` writes it).
fn handmade(tensors: &[(&str, &str, &[usize], Vec<u8>)]) -> Vec<u8> {
    let mut header = String::from("{");
    let mut offset = 0;
    let mut body = Vec::new();
    for (i, (name, dtype, shape, bytes)) in tensors.iter().enumerate() {
        let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
        if i > 0 {
            header.push(',');
        }
        header.push_str(&format!(
            "\"{name}\":{{\"dtype\":\"{dtype}\",\"shape\":[{}],\"data_offsets\":[{offset},{}]}}",
            dims.join(","),
            offset + bytes.len()
        ));
        offset += bytes.len();
        body.extend_from_slice(bytes);
    }
    header.push('}');
    while header.len() % 8 != 0 {
        header.push(' ');
    }
    let mut file = (header.len() as u64).to_le_bytes().to_vec();
    file.extend_from_slice(header.as_bytes());
    file.extend_from_slice(&body);
    file
}

#[test]
fn every_dtype_round_trips() {
    let path = temp_path("roundtrip");
    let _c = Cleanup(path.clone());
    let f32s =
        Tensor::from_vec(vec![1.5f32, -0.0, f32::INFINITY, f32::MIN_POSITIVE, 3.25, -7.0], [2, 3], &dev()).unwrap();
    let f64s = Tensor::from_vec(vec![std::f64::consts::PI, -1e300, 5e-324], [3], &dev()).unwrap();
    let i32s = Tensor::from_vec(vec![i32::MIN, -1, 0, i32::MAX], [2, 1, 2], &dev()).unwrap();
    let i64s = Tensor::from_vec(vec![i64::MIN, 42, i64::MAX], [3, 1], &dev()).unwrap();
    let u8s = Tensor::from_vec(vec![0u8, 127, 255], [3], &dev()).unwrap();
    let u32s = Tensor::from_vec(vec![0u32, 1 << 31, u32::MAX, 7], [2, 2], &dev()).unwrap();
    let f16s =
        Tensor::from_vec([-0.0f32, 65504.0, 6e-8, f32::NEG_INFINITY].map(f16::from_f32).to_vec(), [4], &dev()).unwrap();
    let bools = Tensor::from_vec(vec![true, false, false, true], [4], &dev()).unwrap();
    let scalar = Tensor::from_vec(vec![2.5f32], [], &dev()).unwrap();
    let empty = Tensor::from_vec(Vec::<f32>::new(), [0, 3], &dev()).unwrap();
    let lazy = Tensor::arange(0, 6, 1, &dev()).reshape([2, 3]).mul(2); // realized by the save
    let tensors = [
        ("f32", &f32s),
        ("f64", &f64s),
        ("i32", &i32s),
        ("i64", &i64s),
        ("u8", &u8s),
        ("u32", &u32s),
        ("f16", &f16s),
        ("bool", &bools),
        ("scalar", &scalar),
        ("empty", &empty),
        ("lazy.times_two", &lazy),
    ];
    save_safetensors(&path, &tensors).unwrap();
    let loaded = load_safetensors(&path, &dev()).unwrap();
    assert_eq!(loaded.len(), tensors.len());
    for (name, want) in tensors {
        let (_, got) = loaded.iter().find(|(n, _)| n == name).unwrap_or_else(|| panic!("{name} missing"));
        assert_eq!((got.dtype(), got.dims()), (want.dtype(), want.dims()), "{name}");
        assert_eq!(got.to_host().unwrap(), want.to_host().unwrap(), "{name}");
    }
    // Bit-exact floats, including -0.0 and subnormals.
    let got = &loaded.iter().find(|(n, _)| n == "f32").unwrap().1;
    assert_eq!(got.to_vec::<f32>().unwrap()[1].to_bits(), (-0.0f32).to_bits());
    let got = &loaded.iter().find(|(n, _)| n == "f64").unwrap().1;
    assert_eq!(got.to_vec::<f64>().unwrap()[2], 5e-324);
    // Names given as owned strings and owned tensors work too.
    let owned = vec![("a".to_string(), Tensor::ones([2], DType::F64, &dev()))];
    save_safetensors(&path, &owned).unwrap();
    assert_eq!(load_safetensors(&path, &dev()).unwrap()[0].1.to_vec::<f64>().unwrap(), [1.0, 1.0]);
}

#[test]
fn the_file_layout_is_what_pytorch_reads() {
    let path = temp_path("layout");
    let _c = Cleanup(path.clone());
    let w = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], [2, 3], &dev()).unwrap();
    let b = Tensor::from_vec(vec![-1i64, 7], [2], &dev()).unwrap();
    save_safetensors(&path, &[("weight", &w), ("bias", &b)]).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    assert_eq!(n % 8, 0, "the header is padded to 8 bytes");
    let header = std::str::from_utf8(&bytes[8..8 + n]).unwrap();
    assert!(header.contains(r#""format":"pt""#), "{header}");
    assert!(header.contains(r#""weight":{"dtype":"F32","shape":[2,3],"data_offsets":["#), "{header}");
    assert!(header.contains(r#""bias":{"dtype":"I64","shape":[2],"data_offsets":["#), "{header}");
    let data = &bytes[8 + n..];
    assert_eq!(data.len(), 6 * 4 + 2 * 8);
    // Little-endian, row-major. The larger-alignment dtype comes first (the crate orders by dtype, then name).
    let want_b: Vec<u8> = [-1i64, 7].iter().flat_map(|v| v.to_le_bytes()).collect();
    let want_w: Vec<u8> = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0].iter().flat_map(|v| v.to_le_bytes()).collect();
    assert_eq!(&data[..16], &want_b[..]);
    assert_eq!(&data[16..], &want_w[..]);
}

#[test]
fn a_file_written_the_way_pytorch_writes_it_loads() {
    let path = temp_path("handmade");
    let _c = Cleanup(path.clone());
    let f64s: Vec<u8> = [0.5f64, -2.0].iter().flat_map(|v| v.to_le_bytes()).collect();
    let i32s: Vec<u8> = [3i32, -4, 5, -6].iter().flat_map(|v| v.to_le_bytes()).collect();
    let file = handmade(&[
        ("layer.bias", "F64", &[2], f64s),
        ("idx", "I32", &[2, 2], i32s),
        ("mask", "BOOL", &[3], vec![1, 0, 1]),
        ("bytes", "U8", &[2], vec![9, 200]),
        ("counts", "U32", &[2], [3_000_000_000u32, 5].iter().flat_map(|v| v.to_le_bytes()).collect()),
        // PyTorch's half: 1.0 and -2.0.
        ("h", "F16", &[2], vec![0x00, 0x3c, 0x00, 0xc0]),
    ]);
    std::fs::write(&path, file).unwrap();
    let loaded = load_safetensors(&path, &dev()).unwrap();
    let names: Vec<&str> = loaded.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["layer.bias", "idx", "mask", "bytes", "counts", "h"], "the file's order");
    assert_eq!(loaded[0].1.to_vec::<f64>().unwrap(), [0.5, -2.0]);
    assert_eq!((loaded[1].1.dims(), loaded[1].1.to_vec::<i32>().unwrap()), (&[2, 2][..], vec![3, -4, 5, -6]));
    assert_eq!(loaded[2].1.to_vec::<bool>().unwrap(), [true, false, true]);
    assert_eq!(loaded[3].1.to_vec::<u8>().unwrap(), [9, 200]);
    assert_eq!((loaded[4].1.dtype(), loaded[4].1.to_vec::<u32>().unwrap()), (DType::U32, vec![3_000_000_000, 5]));
    assert_eq!(loaded[5].1.to_vec::<f16>().unwrap(), [f16::ONE, f16::from_f32(-2.0)]);
}

#[test]
fn errors_name_the_file_and_the_problem() {
    let path = temp_path("errors");
    let _c = Cleanup(path.clone());
    // Missing file.
    let missing = std::env::temp_dir().join("kiln-io-test-no-such-file.safetensors");
    let err = load_safetensors(&missing, &dev()).unwrap_err();
    assert!(matches!(err, Error::Io { .. }), "{err:?}");
    assert!(err.to_string().contains("no-such-file"), "{err}");
    // Not a safetensors file: a header length far past the end, then garbage JSON.
    std::fs::write(&path, b"\xff\xff\xff\xff\x00\x00\x00\x00garbage").unwrap();
    let err = load_safetensors(&path, &dev()).unwrap_err();
    assert!(matches!(err, Error::SafeTensors { .. }), "{err:?}");
    assert!(err.to_string().contains("not a valid safetensors file"), "{err}");
    let mut bad_json = 8u64.to_le_bytes().to_vec();
    bad_json.extend_from_slice(b"{nope:1}");
    std::fs::write(&path, bad_json).unwrap();
    assert!(matches!(load_safetensors(&path, &dev()), Err(Error::SafeTensors { .. })));
    // Too short to hold a header length.
    std::fs::write(&path, b"abc").unwrap();
    assert!(matches!(load_safetensors(&path, &dev()), Err(Error::SafeTensors { .. })));
    // An unsupported dtype (int8) is refused by name, not converted.
    std::fs::write(&path, handmade(&[("h", "I8", &[2], vec![0x80, 0x3f])])).unwrap();
    let err = load_safetensors(&path, &dev()).unwrap_err();
    assert!(matches!(&err, Error::UnsupportedDType { name, dtype, .. } if name == "h" && dtype == "I8"), "{err:?}");
    assert!(err.to_string().contains("I8") && err.to_string().contains("`h`"), "{err}");
    // Shape and byte range disagree: 3 f32 declared, 8 bytes given.
    std::fs::write(&path, handmade(&[("w", "F32", &[3], vec![0; 8])])).unwrap();
    assert!(matches!(load_safetensors(&path, &dev()), Err(Error::SafeTensors { .. })));
    // Truncated data: the header promises more bytes than the file has.
    let mut truncated = handmade(&[("w", "F32", &[4], vec![0; 16])]);
    truncated.truncate(truncated.len() - 4);
    std::fs::write(&path, truncated).unwrap();
    assert!(matches!(load_safetensors(&path, &dev()), Err(Error::SafeTensors { .. })));
    // Saving one name twice.
    let t = Tensor::ones([1], DType::F32, &dev());
    let err = save_safetensors(&path, &[("x", &t), ("x", &t)]).unwrap_err();
    assert!(matches!(&err, Error::DuplicateName(n) if n == "x"), "{err:?}");
    // Saving into a folder that does not exist.
    let nowhere = std::env::temp_dir().join("kiln-io-test-no-such-dir").join("w.safetensors");
    assert!(matches!(save_safetensors(&nowhere, &[("x", &t)]), Err(Error::Io { .. })));
}

fn mlp(dev: &Device) -> Sequential {
    Sequential::new().add(Linear::new(3, 4, true, dev)).add(ReLU).add(Linear::new(4, 2, true, dev))
}

#[test]
fn modules_save_and_load_their_named_params() {
    let path = temp_path("module");
    let _c = Cleanup(path.clone());
    let dev = dev();
    let a = mlp(&dev);
    save_module(&a, &path).unwrap();
    let names: Vec<String> = load_safetensors(&path, &dev).unwrap().into_iter().map(|(n, _)| n).collect();
    let mut sorted = names.clone();
    sorted.sort();
    assert_eq!(sorted, ["0.bias", "0.weight", "2.bias", "2.weight"]);
    // Another init, then load: the same function.
    let b = mlp(&dev);
    let x = Tensor::from_vec(vec![0.5f32, -1.0, 2.0, 1.5, 0.0, -0.5], [2, 3], &dev).unwrap();
    assert_ne!(a.forward(&x).to_vec::<f32>().unwrap(), b.forward(&x).to_vec::<f32>().unwrap());
    load_module(&b, &path, true).unwrap();
    assert_eq!(a.forward(&x).to_vec::<f32>().unwrap(), b.forward(&x).to_vec::<f32>().unwrap());
    for p in b.params() {
        assert!(p.get().is_requires_grad(), "loaded parameters are trainable leaves");
    }
    // An f64 file loads into f32 parameters, converted (as PyTorch's copy_).
    let w64 = Linear::from_weight(Tensor::ones([2, 3], DType::F64, &dev), None);
    save_module(&w64, &path).unwrap();
    let w32 = Linear::from_weight(Tensor::zeros([2, 3], DType::F32, &dev), None);
    load_module(&w32, &path, true).unwrap();
    assert_eq!(w32.weight().get().to_vec::<f32>().unwrap(), [1.0; 6]);
}

#[test]
fn a_file_that_does_not_fit_the_module_changes_nothing() {
    let path = temp_path("mismatch");
    let _c = Cleanup(path.clone());
    let dev = dev();
    let model = mlp(&dev);
    let before: Vec<Vec<f32>> = model.params().iter().map(|p| p.get().to_vec::<f32>().unwrap()).collect();
    let w = Tensor::zeros([4, 3], DType::F32, &dev);
    let wrong = Tensor::zeros([5, 3], DType::F32, &dev);
    let b = Tensor::zeros([4], DType::F32, &dev);
    // Missing `2.*`, a wrong shape for `0.weight`, and an unexpected name: all three reported.
    save_safetensors(&path, &[("0.weight", &wrong), ("0.bias", &b), ("extra", &b)]).unwrap();
    let err = load_module(&model, &path, true).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, Error::StateDict { .. }), "{err:?}");
    for part in
        ["missing `2.weight`", "missing `2.bias`", "size mismatch for `0.weight`", "[5, 3]", "unexpected `extra`"]
    {
        assert!(msg.contains(part), "{part:?} not in {msg}");
    }
    let after: Vec<Vec<f32>> = model.params().iter().map(|p| p.get().to_vec::<f32>().unwrap()).collect();
    assert_eq!(before, after, "nothing was loaded");
    // Non-strict loading ignores unexpected names but still needs every parameter.
    let first = Linear::from_weight(Tensor::ones([4, 3], DType::F32, &dev), Some(Tensor::ones([4], DType::F32, &dev)));
    save_safetensors(&path, &[("weight", &w), ("bias", &b), ("extra", &b)]).unwrap();
    assert!(matches!(load_module(&first, &path, true), Err(Error::StateDict { .. })));
    load_module(&first, &path, false).unwrap();
    assert_eq!(first.weight().get().to_vec::<f32>().unwrap(), [0.0; 12]);
}

/// A saved file gets the mode `File::create` gives a new file under the process's umask (the serializer's own
/// temporary file was 0600), an existing file keeps its mode, and no temporary file is left beside it.
#[cfg(unix)]
#[test]
fn saved_files_get_the_usual_mode_and_an_overwritten_file_keeps_its_own() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    let plain = dir.path().join("plain");
    std::fs::File::create(&plain).unwrap();
    let saved = dir.path().join("w.safetensors");
    let t = Tensor::ones([3], DType::F32, &dev());
    save_safetensors(&saved, &[("t", &t)]).unwrap();
    assert_eq!(mode(&saved), mode(&plain), "a new file: File::create's mode");
    std::fs::set_permissions(&saved, std::fs::Permissions::from_mode(0o640)).unwrap();
    save_safetensors(&saved, &[("t", &t)]).unwrap();
    assert_eq!(mode(&saved), 0o640, "an overwritten file keeps its mode");
    let mut names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    names.sort();
    assert_eq!(names, ["plain", "w.safetensors"], "no temporary file is left");
    assert_eq!(load_safetensors(&saved, &dev()).unwrap()[0].1.to_vec::<f32>().unwrap(), vec![1.0; 3]);
}
