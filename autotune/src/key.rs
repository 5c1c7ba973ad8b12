//! Tuning keys: everything a tuning result depends on, in one comparable, hashable value.
//!
//! Owns: the key's fields, its canonical text (stored inside every cache entry and compared on read, so a file can
//! never answer for a different key), its digest (the file name), shape bucketing, and the checksum of a candidate
//! set. Deliberately not: which dims an op has or how they are bucketed per op (the caller decides which dims go
//! through [`bucket`]), nor the candidates themselves.

use serde::{Deserialize, Serialize};

use crate::hash::{Fnv64, fnv1a64, hex16};

/// What a tuning result is valid for. Two keys are equal exactly when the result of one may be used for the other.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TuneKey {
    /// Op kind, e.g. `gemm`.
    pub op: String,
    /// Named dims, already bucketed where the op tunes per bucket (e.g. `[("m", 1024), ("n", 512), ("k", 256)]`).
    pub dims: Vec<(String, u64)>,
    /// Operand and result dtypes, e.g. `f32,f32->f32`.
    pub dtypes: String,
    /// Operand layouts, e.g. `row,col`.
    pub layout: String,
    /// Fused epilogue, e.g. `bias+relu` or `none`.
    pub epilogue: String,
    /// [`DeviceFingerprint::id`](crate::DeviceFingerprint::id) of the device the result was measured on.
    pub device: String,
    /// [`checksum_of`] the candidate config names: a changed search space invalidates old winners.
    pub candidates: u64,
}

/// The value of the dim named `name` in a `(name, value)` list such as [`TuneKey::dims`].
pub fn dim_named(dims: &[(String, u64)], name: &str) -> Option<u64> {
    dims.iter().find(|(n, _)| n == name).map(|&(_, v)| v)
}

impl TuneKey {
    /// A deterministic one-line text of every field, e.g.
    /// `op=gemm;dims=m:1024,n:512;dtypes=f32;layout=row,row;epilogue=none;device=0123456789abcdef;candidates=...`.
    /// Separators inside values are backslash-escaped, so two different keys never share a canonical text.
    pub fn canonical(&self) -> String {
        let dims: Vec<String> = self.dims.iter().map(|(name, size)| format!("{}:{size}", escape(name))).collect();
        format!(
            "op={};dims={};dtypes={};layout={};epilogue={};device={};candidates={}",
            escape(&self.op),
            dims.join(","),
            escape(&self.dtypes),
            escape(&self.layout),
            escape(&self.epilogue),
            escape(&self.device),
            hex16(self.candidates),
        )
    }

    /// 16 hex digits of the canonical text: the entry's file name. A collision cannot return a wrong result, since
    /// the entry stores the canonical text and a mismatch is rejected.
    pub fn digest(&self) -> String {
        hex16(fnv1a64(self.canonical().as_bytes()))
    }
}

/// The bucket a dim is tuned for: the next power of two (`0 -> 1`, `1000 -> 1024`, `1024 -> 1024`). Every size in a
/// bucket shares one tuning result, measured at the bucket's upper bound, so a new batch size inside a known
/// bucket never triggers a search. Sizes above 2^63 saturate to `u64::MAX` (no power of two is left to round to).
pub fn bucket(x: u64) -> u64 {
    x.max(1).checked_next_power_of_two().unwrap_or(u64::MAX)
}

/// A stable, order-sensitive checksum of candidate config names. Each name is length-prefixed, so `["ab", "c"]`
/// and `["a", "bc"]` differ.
pub fn checksum_of<I: IntoIterator<Item = S>, S: AsRef<str>>(items: I) -> u64 {
    let mut h = Fnv64::new();
    h.field(b"kiln-candidates/1");
    for item in items {
        h.field(item.as_ref().as_bytes());
    }
    h.finish()
}

/// [`checksum_of`] the texts `write` puts in a buffer for each item, without a string per item: the same value as
/// `checksum_of` of those texts.
pub fn checksum_of_each<T>(items: &[T], mut write: impl FnMut(&T, &mut String)) -> u64 {
    let mut h = Fnv64::new();
    h.field(b"kiln-candidates/1");
    let mut buf = String::new();
    for item in items {
        buf.clear();
        write(item, &mut buf);
        h.field(buf.as_bytes());
    }
    h.finish()
}

/// Backslash-escapes the canonical text's separators and control characters (keeps it on one line).
fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '\\' | ';' | '=' | ',' | ':' => {
                out.push('\\');
                out.push(c);
            }
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checksum_of_each_equals_checksum_of_the_texts() {
        // Keys on disk hold `checksum_of` of the candidate names; writing them into one buffer must not move them.
        let items = [3u32, 17, 170];
        let texts: Vec<String> = items.iter().map(|i| format!("cand:{i}")).collect();
        let each = checksum_of_each(&items, |i, out| out.push_str(&format!("cand:{i}")));
        assert_eq!(each, checksum_of(&texts));
        assert_ne!(each, checksum_of(&texts[..2]));
    }

    fn key() -> TuneKey {
        TuneKey {
            op: "gemm".into(),
            dims: vec![("m".into(), 1024), ("n".into(), 512), ("k".into(), 256)],
            dtypes: "f32,f32->f32".into(),
            layout: "row,row".into(),
            epilogue: "none".into(),
            device: "0123456789abcdef".into(),
            candidates: 42,
        }
    }

    #[test]
    fn canonical_names_every_field() {
        assert_eq!(
            key().canonical(),
            "op=gemm;dims=m:1024,n:512,k:256;dtypes=f32\\,f32->f32;layout=row\\,row;epilogue=none;\
             device=0123456789abcdef;candidates=000000000000002a"
        );
        assert_eq!(key().digest().len(), 16);
        assert_eq!(key().digest(), key().digest());
    }

    #[test]
    fn every_field_changes_the_digest() {
        let base = key();
        let variants = [
            TuneKey { op: "bmm".into(), ..base.clone() },
            TuneKey { dims: vec![("m".into(), 2048), ("n".into(), 512), ("k".into(), 256)], ..base.clone() },
            TuneKey { dtypes: "f16".into(), ..base.clone() },
            TuneKey { layout: "row,col".into(), ..base.clone() },
            TuneKey { epilogue: "relu".into(), ..base.clone() },
            TuneKey { device: "fedcba9876543210".into(), ..base.clone() },
            TuneKey { candidates: 43, ..base.clone() },
        ];
        for v in variants {
            assert_ne!(v.digest(), base.digest(), "{}", v.canonical());
        }
    }

    #[test]
    fn escaping_keeps_canonical_injective_and_on_one_line() {
        let a = TuneKey { op: "a;dims=".into(), dims: vec![], ..key() };
        let b = TuneKey { op: "a".into(), dims: vec![], ..key() };
        assert_ne!(a.canonical(), b.canonical());
        let c = TuneKey { epilogue: "x\ny".into(), ..key() };
        assert!(!c.canonical().contains('\n'));
        let d = TuneKey { dims: vec![("m:1".into(), 2)], ..key() };
        let e = TuneKey { dims: vec![("m".into(), 12)], ..key() };
        assert_ne!(d.canonical(), e.canonical());
    }

    #[test]
    fn buckets_are_powers_of_two() {
        assert_eq!(bucket(0), 1);
        assert_eq!(bucket(1), 1);
        assert_eq!(bucket(3), 4);
        assert_eq!(bucket(1000), 1024);
        assert_eq!(bucket(1000), bucket(1024));
        assert_eq!(bucket(1025), 2048);
        assert_eq!(bucket(u64::MAX), u64::MAX);
    }

    #[test]
    fn checksum_is_order_sensitive_and_length_prefixed() {
        assert_eq!(checksum_of(["a", "b"]), checksum_of(vec!["a".to_string(), "b".to_string()]));
        assert_ne!(checksum_of(["a", "b"]), checksum_of(["b", "a"]));
        assert_ne!(checksum_of(["ab", "c"]), checksum_of(["a", "bc"]));
        assert_ne!(checksum_of(["a"]), checksum_of(["a", "b"]));
    }
}
