//! The on-disk envelope of one cache entry, and the little-endian byte helpers the bundle format shares.
//!
//! Owns: encoding an entry and decoding it back with every structural check (magic, format, lengths, checksum).
//! Deliberately not: judging whether a well-formed entry belongs to this store (version, fingerprint, key): that
//! is [`Store`](crate::Store)'s call, since only it knows what it asked for.
//!
//! Layout (integers little-endian; strings are a u32 byte length then UTF-8):
//! ```text
//! magic         8 bytes   "KILNENT\0"
//! format        u32       1
//! kind          u8        1 = tuning record (JSON payload), 2 = artifact (opaque bytes)
//! version       string    kiln-autotune version that wrote it
//! fingerprint   string    device fingerprint id
//! key           string    TuneKey::canonical() or the artifact's name
//! payload_len   u64
//! checksum      u64       FNV-1a 64 over every byte above, then the payload
//! payload       payload_len bytes, and nothing after it
//! ```

use crate::hash::Fnv64;

pub(crate) const ENTRY_MAGIC: [u8; 8] = *b"KILNENT\0";
pub(crate) const ENTRY_FORMAT: u32 = 1;

/// What a cache entry holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum EntryKind {
    /// A [`TuneRecord`](crate::TuneRecord).
    Record,
    /// Opaque compiled bytes (machine code, PTX, a code object).
    Artifact,
}

impl EntryKind {
    pub fn as_str(self) -> &'static str {
        match self {
            EntryKind::Record => "record",
            EntryKind::Artifact => "artifact",
        }
    }

    pub(crate) fn tag(self) -> u8 {
        match self {
            EntryKind::Record => 1,
            EntryKind::Artifact => 2,
        }
    }

    pub(crate) fn from_tag(tag: u8) -> Option<Self> {
        match tag {
            1 => Some(EntryKind::Record),
            2 => Some(EntryKind::Artifact),
            _ => None,
        }
    }

    /// The namespace subdirectory holding this kind.
    pub(crate) fn dir(self) -> &'static str {
        match self {
            EntryKind::Record => "tune",
            EntryKind::Artifact => "artifacts",
        }
    }

    pub(crate) fn extension(self) -> &'static str {
        match self {
            EntryKind::Record => "rec",
            EntryKind::Artifact => "bin",
        }
    }

    pub(crate) fn from_extension(ext: &str) -> Option<Self> {
        [EntryKind::Record, EntryKind::Artifact].into_iter().find(|k| k.extension() == ext)
    }
}

/// One entry, borrowed from the bytes it was decoded from (or to be encoded).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Entry<'a> {
    pub kind: EntryKind,
    pub version: &'a str,
    pub fingerprint: &'a str,
    pub key: &'a str,
    pub payload: &'a [u8],
}

pub(crate) fn encode(entry: &Entry<'_>) -> Vec<u8> {
    let mut out = Vec::with_capacity(64 + entry.key.len() + entry.payload.len());
    out.extend_from_slice(&ENTRY_MAGIC);
    out.extend_from_slice(&ENTRY_FORMAT.to_le_bytes());
    out.push(entry.kind.tag());
    put_str(&mut out, entry.version);
    put_str(&mut out, entry.fingerprint);
    put_str(&mut out, entry.key);
    out.extend_from_slice(&(entry.payload.len() as u64).to_le_bytes());
    let checksum = Fnv64::new().write(&out).write(entry.payload).finish();
    out.extend_from_slice(&checksum.to_le_bytes());
    out.extend_from_slice(entry.payload);
    out
}

/// Decodes and checks structure and checksum. The error is a reason fit for "ignoring cache entry ...: <reason>".
pub(crate) fn decode(bytes: &[u8]) -> Result<Entry<'_>, String> {
    let mut r = Reader::new(bytes);
    if r.take(ENTRY_MAGIC.len() as u64, "magic").ok() != Some(&ENTRY_MAGIC[..]) {
        return Err("not a kiln cache entry (bad magic)".to_string());
    }
    let format = r.u32("format")?;
    if format != ENTRY_FORMAT {
        return Err(format!("entry format {format} (this kiln reads format {ENTRY_FORMAT})"));
    }
    let tag = r.u8("kind")?;
    let kind = EntryKind::from_tag(tag).ok_or_else(|| format!("unknown entry kind {tag}"))?;
    let version = r.str("version")?;
    let fingerprint = r.str("fingerprint")?;
    let key = r.str("key")?;
    let payload_len = r.u64("payload length")?;
    let header_end = r.pos();
    let checksum = r.u64("checksum")?;
    let rest = r.rest();
    if (rest.len() as u64) < payload_len {
        return Err(format!("truncated: payload has {} of {payload_len} bytes", rest.len()));
    }
    if rest.len() as u64 > payload_len {
        return Err(format!("{} unexpected bytes after the payload", rest.len() as u64 - payload_len));
    }
    if Fnv64::new().write(&bytes[..header_end]).write(rest).finish() != checksum {
        return Err("checksum mismatch (the file is corrupt)".to_string());
    }
    Ok(Entry { kind, version, fingerprint, key, payload: rest })
}

/// Appends a u32-length-prefixed string.
pub(crate) fn put_str(out: &mut Vec<u8>, s: &str) {
    put_bytes32(out, s.as_bytes());
}

/// Appends u32-length-prefixed bytes. Lengths past u32 are not representable; the strings stored this way (versions,
/// ids, key texts, names) are far shorter, and payloads use a u64 length instead.
pub(crate) fn put_bytes32(out: &mut Vec<u8>, bytes: &[u8]) {
    let len = u32::try_from(bytes.len()).unwrap_or(u32::MAX);
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&bytes[..len as usize]);
}

/// A bounds-checked cursor: every read names the field, so a truncated file says where it ends.
pub(crate) struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(bytes: &'a [u8]) -> Self {
        Self { bytes, pos: 0 }
    }

    pub(crate) fn pos(&self) -> usize {
        self.pos
    }

    pub(crate) fn rest(&self) -> &'a [u8] {
        &self.bytes[self.pos..]
    }

    pub(crate) fn take(&mut self, n: u64, what: &str) -> Result<&'a [u8], String> {
        let available = (self.bytes.len() - self.pos) as u64;
        if n > available {
            return Err(format!("truncated: {what} needs {n} bytes at offset {}, {available} left", self.pos));
        }
        let start = self.pos;
        self.pos += n as usize;
        Ok(&self.bytes[start..self.pos])
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], String> {
        let mut out = [0; N];
        out.copy_from_slice(self.take(N as u64, what)?);
        Ok(out)
    }

    pub(crate) fn u8(&mut self, what: &str) -> Result<u8, String> {
        Ok(self.array::<1>(what)?[0])
    }

    pub(crate) fn u32(&mut self, what: &str) -> Result<u32, String> {
        self.array(what).map(u32::from_le_bytes)
    }

    pub(crate) fn u64(&mut self, what: &str) -> Result<u64, String> {
        self.array(what).map(u64::from_le_bytes)
    }

    pub(crate) fn bytes32(&mut self, what: &str) -> Result<&'a [u8], String> {
        let len = self.u32(what)?;
        self.take(u64::from(len), what)
    }

    pub(crate) fn str(&mut self, what: &str) -> Result<&'a str, String> {
        std::str::from_utf8(self.bytes32(what)?).map_err(|_| format!("{what} is not UTF-8"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Vec<u8> {
        encode(&Entry {
            kind: EntryKind::Artifact,
            version: "0.1.0",
            fingerprint: "0123456789abcdef",
            key: "G_gemm_f32",
            payload: b"\x90\x90\xc3",
        })
    }

    #[test]
    fn round_trips() {
        let bytes = sample();
        let e = decode(&bytes).expect("a fresh entry decodes");
        assert_eq!(
            (e.kind, e.version, e.fingerprint, e.key),
            (EntryKind::Artifact, "0.1.0", "0123456789abcdef", "G_gemm_f32")
        );
        assert_eq!(e.payload, b"\x90\x90\xc3");
    }

    #[test]
    fn every_truncation_and_every_flipped_bit_is_rejected() {
        let bytes = sample();
        for len in 0..bytes.len() {
            assert!(decode(&bytes[..len]).is_err(), "truncated to {len} bytes");
        }
        for i in 0..bytes.len() {
            for bit in 0..8 {
                let mut bad = bytes.clone();
                bad[i] ^= 1 << bit;
                assert!(decode(&bad).is_err(), "byte {i} bit {bit}");
            }
        }
        let mut long = bytes.clone();
        long.push(0);
        assert!(decode(&long).unwrap_err().contains("after the payload"));
        assert!(decode(b"garbage!garbage!").unwrap_err().contains("magic"));
    }
}
