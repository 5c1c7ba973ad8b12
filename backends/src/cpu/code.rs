//! Compiled Cranelift kernels as relocatable bytes: what the kernel cache stores on disk and in bundles, and how a
//! process maps them back without compiling.
//!
//! Cranelift compiles a kernel into position-independent machine code plus relocations; the only relocations a
//! kiln kernel has are absolute addresses of its libcalls (`Abs8`, the host is compiled non-PIC). Loading copies the
//! code into fresh anonymous memory, writes this process's libcall addresses into it, and maps it read + execute
//! (never writable and executable at once). So a kernel compiled in one process runs in another of the same kiln
//! version on the same CPU (the cache's namespace guarantees both) without Cranelift running at all.
//!
//! Deliberately not done: sharing one mapping between kernels (each takes at least a page) and freeing code (kernels
//! live as long as the process's plan cache, which has no eviction either).

use super::libcalls;
use dynasmrt::ExecutableBuffer;
use kiln_jit::render::clif::Libcall;

/// Machine code of one kernel and the libcall relocations to apply when loading it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RelocatableCode {
    pub code: Vec<u8>,
    /// `(offset, libcall index, addend)`: write `address(Libcall::ALL[index]) + addend` as 8 bytes at `offset`.
    pub relocs: Vec<(u32, u32, i64)>,
}

const MAGIC: &[u8; 8] = b"KCLIFv1\n";

impl RelocatableCode {
    pub fn to_artifact(&self) -> Vec<u8> {
        let mut out = MAGIC.to_vec();
        out.extend((self.relocs.len() as u32).to_le_bytes());
        for &(off, idx, add) in &self.relocs {
            out.extend(off.to_le_bytes());
            out.extend(idx.to_le_bytes());
            out.extend(add.to_le_bytes());
        }
        out.extend(&self.code);
        out
    }

    /// Parses an artifact; the store already checked its checksum and key, this checks its framing and that every
    /// relocation names a known libcall inside the code.
    pub fn from_artifact(a: &[u8]) -> Result<RelocatableCode, String> {
        let bad = || "malformed kernel artifact".to_string();
        let rest = a.strip_prefix(&MAGIC[..]).ok_or_else(bad)?;
        let u32_at = |i: usize| -> Option<u32> { Some(u32::from_le_bytes(rest.get(i..i + 4)?.try_into().ok()?)) };
        let n = u32_at(0).ok_or_else(bad)? as usize;
        let mut relocs = Vec::with_capacity(n.min(1024));
        let mut at = 4;
        for _ in 0..n {
            let off = u32_at(at).ok_or_else(bad)?;
            let idx = u32_at(at + 4).ok_or_else(bad)?;
            let add = i64::from_le_bytes(rest.get(at + 8..at + 16).ok_or_else(bad)?.try_into().map_err(|_| bad())?);
            relocs.push((off, idx, add));
            at += 16;
        }
        let code = rest.get(at..).ok_or_else(bad)?.to_vec();
        let ok = !code.is_empty()
            && relocs
                .iter()
                .all(|&(off, idx, _)| off as usize + 8 <= code.len() && (idx as usize) < Libcall::ALL.len());
        if !ok {
            return Err(bad());
        }
        Ok(RelocatableCode { code, relocs })
    }

    /// Maps the code executable with this process's libcall addresses patched in.
    pub fn load(&self) -> Result<ExecutableBuffer, String> {
        let mut buf = dynasmrt::mmap::MutableBuffer::new(self.code.len()).map_err(|e| e.to_string())?;
        buf.set_len(self.code.len());
        buf[..].copy_from_slice(&self.code);
        for &(off, idx, add) in &self.relocs {
            let l = *Libcall::ALL.get(idx as usize).ok_or("relocation to an unknown libcall")?;
            let addr = (libcalls::address(l) as i64).wrapping_add(add) as u64;
            let at = off as usize;
            buf.get_mut(at..at + 8).ok_or("relocation outside the code")?.copy_from_slice(&addr.to_le_bytes());
        }
        buf.make_exec().map_err(|e| e.to_string())
    }
}
