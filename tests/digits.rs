//! The digits example as a test: `examples/train_digits.rs` is compiled in as a module (its `main` unused), so
//! this trains the example's model with the example's loader and loop, for real, and requires >= 95% test
//! accuracy. Also: the loader's error messages on malformed lines, and the split.
//!
//! Only `trains_to_95_percent` runs kiln (and seeds its global generator), so the plan-cache counters it reads
//! are not disturbed by the other tests of this file running in parallel.

// Trains the example on the CPU (cargo feature `cpu`).
#![cfg(feature = "cpu")]

mod test_cache;

#[path = "../examples/train_digits.rs"]
#[allow(dead_code)]
mod train_digits;

use kiln::Device;
use train_digits::{CLASSES, Config, Digits, DigitsError, PIXELS, SAMPLES, Split, load_digits, parse_digits};

fn data() -> Digits {
    load_digits(&train_digits::default_path()).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn trains_to_95_percent() {
    let (train, test) = data().split(Split::Interleaved);
    let cfg = Config::default();
    let mut compiles_after_first_epoch = None;
    let report = train_digits::train(&cfg, &train, &test, &Device::cpu(), |e| {
        if e.epoch == 1 {
            compiles_after_first_epoch = Some(kiln::stats().compiles);
        }
    })
    .unwrap_or_else(|e| panic!("{e}"));

    assert_eq!(report.epochs.len(), cfg.epochs);
    let first = &report.epochs[0];
    let last = report.epochs.last().unwrap();
    assert!(
        last.train_loss < first.train_loss / 5.0,
        "the training loss should fall: epoch 1 {:.4}, epoch {} {:.4}",
        first.train_loss,
        last.epoch,
        last.train_loss
    );
    assert!(
        report.test_accuracy >= 0.95,
        "test accuracy {:.2}% < 95% (per epoch: {:?})",
        report.test_accuracy * 100.0,
        report.epochs.iter().map(|e| format!("{:.2}", e.test_accuracy * 100.0)).collect::<Vec<_>>()
    );
    // Every shape (full batch, the smaller last batch, evaluation) compiled in epoch 1; later epochs only replay.
    assert_eq!(Some(kiln::stats().compiles), compiles_after_first_epoch, "epochs after the first compiled plans");
}

/// Sample `i`'s pixels.
fn row(d: &Digits, i: usize) -> &[f32] {
    &d.pixels[i * PIXELS..(i + 1) * PIXELS]
}

#[test]
fn loads_and_splits_the_data_set() {
    let d = data();
    assert_eq!((d.len(), d.pixels.len()), (SAMPLES, SAMPLES * PIXELS));
    assert!(d.pixels.iter().all(|&p| (0.0..=1.0).contains(&p)));
    assert!(d.pixels.contains(&1.0), "16 scales to 1");
    for c in 0..CLASSES as i64 {
        assert!(d.labels.iter().filter(|&&l| l == c).count() > 150, "class {c} is under-represented");
    }
    // The first line of digits.csv is a 0; its third pixel is 5.
    assert_eq!((d.labels[0], d.pixels[2]), (0, 5.0 / 16.0));

    for split in [Split::Interleaved, Split::Head] {
        let (train, test) = d.split(split);
        assert_eq!((train.len(), test.len()), (1437, 360), "{split:?}");
        assert_eq!(train.pixels.len() + test.pixels.len(), d.pixels.len());
    }
    let (train, test) = d.split(Split::Interleaved);
    assert_eq!((test.labels[1], row(&test, 1)), (d.labels[5], row(&d, 5)));
    assert_eq!((train.labels[4], row(&train, 4)), (d.labels[6], row(&d, 6)));
    let (train, test) = d.split(Split::Head);
    assert_eq!(train.labels[..], d.labels[..1437]);
    assert_eq!(test.labels[..], d.labels[1437..]);
}

/// The `Malformed` error for `text`, with its message.
fn malformed(text: &str) -> (usize, String) {
    match parse_digits(text, "mem.csv") {
        Err(e @ DigitsError::Malformed { line, .. }) => (line, e.to_string()),
        other => panic!("expected a malformed-line error, got {other:?}"),
    }
}

fn line(pixels: &[&str], label: &str) -> String {
    let mut fields: Vec<&str> = pixels.to_vec();
    fields.push(label);
    fields.join(",")
}

#[test]
fn parser_reports_malformed_lines() {
    let zeros = vec!["0"; PIXELS];
    let good = line(&zeros, "3");

    // Blank lines are skipped, CRLF and spaces around values are accepted; line numbers count every line.
    let mut sixteen = zeros.clone();
    sixteen[10] = " 16 ";
    let text = format!("{good}\r\n\n{}\r\n", line(&sixteen, "9"));
    let d = parse_digits(&text, "mem.csv").unwrap();
    assert_eq!(d.labels, vec![3, 9]);
    assert_eq!((d.pixels[PIXELS + 10], d.pixels[PIXELS + 11]), (1.0, 0.0));

    let (n, msg) = malformed(&format!("{good}\n{}", zeros.join(",")));
    assert_eq!(n, 2);
    assert_eq!(msg, "mem.csv:2: expected 65 comma-separated values (64 pixels and a label), found 64");

    let (n, msg) = malformed(&format!("{good}\n\n{good},1"));
    assert_eq!((n, msg.contains("found 66")), (3, true), "{msg}");

    let mut bad = zeros.clone();
    bad[6] = "17";
    assert_eq!(malformed(&line(&bad, "1")).1, "mem.csv:1: pixel 7 is \"17\"; expected an integer in 0..=16");
    bad[6] = "2.5";
    assert!(malformed(&line(&bad, "1")).1.contains("pixel 7 is \"2.5\""));
    bad[6] = "";
    assert!(malformed(&line(&bad, "1")).1.contains("pixel 7 is \"\""));
    bad[6] = "-1";
    assert!(malformed(&line(&bad, "1")).1.contains("pixel 7 is \"-1\""));

    assert_eq!(malformed(&line(&zeros, "10")).1, "mem.csv:1: the label is \"10\"; expected an integer in 0..=9");
    assert!(malformed(&line(&zeros, "x")).1.contains("the label is \"x\""));

    // A file that parses but is not the whole data set, and a missing file.
    let dir = std::env::temp_dir().join(format!("kiln-digits-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let short = dir.join("short.csv");
    std::fs::write(&short, format!("{good}\n{good}\n")).unwrap();
    let err = load_digits(&short).unwrap_err().to_string();
    assert!(err.ends_with("short.csv: 2 samples, expected 1797 (the scikit-learn digits data set)"), "{err}");
    let err = load_digits(&dir.join("missing.csv")).unwrap_err().to_string();
    assert!(err.starts_with("cannot read ") && err.contains("missing.csv"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}
