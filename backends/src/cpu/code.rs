//! Compiled Cranelift kernels as relocatable bytes: what the kernel cache stores on disk and in bundles, and how a
//! process maps them back without compiling.
//!
//! Cranelift compiles a kernel into position-independent machine code plus relocations; the only relocations a
//! kiln kernel has are absolute addresses of its libcalls (`Abs8`, the host is compiled non-PIC). Loading copies the
//! code into fresh anonymous memory, writes this process's libcall addresses into it, and maps it read + execute
//! (never writable and executable at once). So a kernel compiled in one process runs in another of the same kiln
//! version on the same CPU (the cache's namespace guarantees both) without Cranelift running at all.
//!
//! A kernel compiled or loaded on demand gets a mapping of its own. The cached code a warm process will need (every
//! kernel of an imported bundle) is mapped together instead, by [`map_together`]: one `mmap` and one `mprotect` for
//! all of them. A mapping per kernel is two system calls and a page fault (and the `mprotect` of a process whose
//! pool threads run shoots down their TLBs), which about doubled the cost of finding a cached kernel in a warm
//! process's first step.
//!
//! Deliberately not done: freeing code. Kernels live as long as the process: a plan the plan cache drops past its
//! limit (`kiln::set_plan_cache_limit`) frees its arena but not its kernels, which are small, shared by other plans
//! of the same kernel IR, and what a later compile of the same graph maps again instead of compiling.

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
        let (buf, _) = map_together(&[&self.patched()?])?;
        Ok(buf)
    }

    /// The code with this process's libcall addresses written in: position independent otherwise, so it can be
    /// mapped anywhere.
    pub fn patched(&self) -> Result<Vec<u8>, String> {
        let mut code = self.code.clone();
        for &(off, idx, add) in &self.relocs {
            let l = *Libcall::ALL.get(idx as usize).ok_or("relocation to an unknown libcall")?;
            let addr = (libcalls::address(l) as i64).wrapping_add(add) as u64;
            let at = off as usize;
            code.get_mut(at..at + 8).ok_or("relocation outside the code")?.copy_from_slice(&addr.to_le_bytes());
        }
        Ok(code)
    }
}

/// Executable mappings made by [`map_together`] since the process started.
pub(crate) static MAPPINGS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Maps position-independent code blobs into one read + execute mapping (never writable and executable at once),
/// each at a 64-byte aligned offset; returns the mapping and each blob's offset in it.
pub fn map_together(blobs: &[&[u8]]) -> Result<(ExecutableBuffer, Vec<usize>), String> {
    let mut offsets = Vec::with_capacity(blobs.len());
    let mut len = 0usize;
    for b in blobs {
        offsets.push(len);
        len = (len + b.len()).next_multiple_of(64);
    }
    if len == 0 {
        return Err("no code to map".into());
    }
    let mut buf = dynasmrt::mmap::MutableBuffer::new(len).map_err(|e| e.to_string())?;
    buf.set_len(len);
    for (b, &at) in blobs.iter().zip(&offsets) {
        buf[at..at + b.len()].copy_from_slice(b);
    }
    let code = buf.make_exec().map_err(|e| e.to_string())?;
    MAPPINGS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    Ok((code, offsets))
}
