//! EVEX encodings of the few AVX-512F instructions the 16-lane kernels (`asm512`) use, written as bytes.
//!
//! Why by hand: `dynasmrt` assembles every x86 extension except AVX-512 (no EVEX prefix), and the generated kernels
//! need run-time register numbers, displacements and epilogues, which ahead-of-time intrinsics cannot give (a fused
//! epilogue would become an interpreter over spilled accumulators). EVEX is regular: a 4-byte prefix, the opcode,
//! ModRM (+ SIB) and a displacement that is scaled by the memory operand's size (`disp8*N`). The legacy and VEX
//! instructions around these (loops, GPR moves, prefetches, `vzeroupper`) still come from `dynasm!`; both write
//! into the same assembler, so labels and offsets stay `dynasmrt`'s.
//!
//! AVX-512F only (no DQ/BW/VL instructions); the bf16 kernels add `vdpbf16ps` (AVX512-BF16), their bf16 store `vpmovdw`
//! and load `vpmovzxwd` (`Enc` also takes EVEX.W and the vector length for forms that need them).
//! `vpandd`/`vpord`/`vpxord` stand in for `vandps`..., a compare's lane mask materialised with `vpternlogd` under the
//! compare's opmask, and a select's mask tested with `vptestmd`. The tests pin every form against GNU `as` output.

/// A general-purpose register by its x86 number (rax 0 .. r15 15).
pub(crate) type Gpr = u8;

/// A memory operand: `[base + index*scale + disp]` (`scale` 1, 2, 4 or 8; ignored without an index).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Mem {
    pub base: Gpr,
    pub index: Option<Gpr>,
    pub scale: u8,
    pub disp: i32,
}

/// `[base + disp]`.
pub(crate) fn mem(base: Gpr, disp: i32) -> Mem {
    Mem { base, index: None, scale: 1, disp }
}

/// `[base + index*scale + disp]`.
pub(crate) fn mem_indexed(base: Gpr, index: Gpr, scale: u8, disp: i32) -> Mem {
    Mem { base, index: Some(index), scale, disp }
}

/// The register-or-memory operand (ModRM.rm) of an instruction.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Rm {
    /// zmm0..31 (or an opmask for the k forms).
    Reg(u8),
    /// A full 64-byte vector in memory.
    Full(Mem),
    /// One dword broadcast to 16 lanes (`{1to16}`).
    Bcst(Mem),
    /// One dword, not broadcast by the prefix (`vbroadcastss`'s source: Tuple1 Scalar, disp scaled by 4).
    Dword(Mem),
    /// Half a 512-bit vector in memory (a narrowing store's destination: disp scaled by 32).
    Half(Mem),
    /// One word (`vpbroadcastw`'s source: Tuple1 Scalar, disp scaled by 2).
    Word(Mem),
}

/// Opcode map (EVEX.mmm) and mandatory prefix (EVEX.pp) of an instruction, with its opcode byte.
#[derive(Clone, Copy)]
pub(crate) struct Opc {
    map: u8,
    pp: u8,
    op: u8,
}

const fn ps(op: u8) -> Opc {
    Opc { map: 1, pp: 0, op }
}
const fn pd66(op: u8) -> Opc {
    Opc { map: 1, pp: 1, op }
}
const fn x38(op: u8) -> Opc {
    Opc { map: 2, pp: 1, op }
}
const fn x3a(op: u8) -> Opc {
    Opc { map: 3, pp: 1, op }
}

pub(crate) const VADDPS: Opc = ps(0x58);
pub(crate) const VMULPS: Opc = ps(0x59);
pub(crate) const VSUBPS: Opc = ps(0x5c);
pub(crate) const VMINPS: Opc = ps(0x5d);
pub(crate) const VDIVPS: Opc = ps(0x5e);
pub(crate) const VMAXPS: Opc = ps(0x5f);
pub(crate) const VPANDD: Opc = pd66(0xdb);
pub(crate) const VPORD: Opc = pd66(0xeb);
pub(crate) const VPXORD: Opc = pd66(0xef);
pub(crate) const VPADDD: Opc = pd66(0xfe);
pub(crate) const VPSUBD: Opc = pd66(0xfa);
pub(crate) const VFMADD231PS: Opc = x38(0xb8);
pub(crate) const VFMADD213PS: Opc = x38(0xa8);
pub(crate) const VBLENDMPS: Opc = x38(0x65);
/// `d = x * 2^floor(src)`, rounded once (an exponent's scaling: `gemm::program_math`).
pub(crate) const VSCALEFPS: Opc = x38(0x2c);
const VRNDSCALEPS: Opc = x3a(0x08);
const VSQRTPS: Opc = ps(0x51);
const VMOVAPS: Opc = ps(0x28);
const VMOVUPS_LOAD: Opc = ps(0x10);
const VMOVUPS_STORE: Opc = ps(0x11);
const VBROADCASTSS: Opc = x38(0x18);
const VCMPPS: Opc = ps(0xc2);
const VPCMPEQD: Opc = pd66(0x76);
const VPBROADCASTD_GPR: Opc = x38(0x7c);
const VPTERNLOGD: Opc = x3a(0x25);
const VPTESTMD: Opc = x38(0x27);
const SHIFT_IMM: Opc = pd66(0x72);
const VSHUFF32X4: Opc = x3a(0x23);
const VPMOVDW: Opc = Opc { map: 2, pp: 2, op: 0x33 };
const VPMOVZXWD: Opc = x38(0x33);
const VPBROADCASTW: Opc = x38(0x79);
const VDPBF16PS: Opc = Opc { map: 2, pp: 2, op: 0x52 };

/// Bytes of EVEX instructions, appended to the assembler by the caller.
#[derive(Default)]
pub(crate) struct Enc {
    pub bytes: Vec<u8>,
}

impl Enc {
    /// One 512-bit instruction: `reg` is ModRM.reg (a zmm, an opmask or an opcode extension), `v` EVEX.vvvv (0 when
    /// unused: its inverted encoding is all ones), `k` the opmask (0: none), `z` zeroing-masking.
    #[allow(clippy::too_many_arguments)]
    fn insn(&mut self, o: Opc, reg: u8, v: u8, rm: Rm, k: u8, z: bool, imm: Option<u8>) {
        self.insn_wl(o, false, 0b10, reg, v, rm, k, z, imm);
    }

    /// [`Enc::insn`] with EVEX.W (`w`) and vector length (`ll`: 0b01 256 bits, 0b10 512) given; a full memory
    /// operand then spans the vector length (its compressed displacement's N).
    #[allow(clippy::too_many_arguments)]
    fn insn_wl(&mut self, o: Opc, w: bool, ll: u8, reg: u8, v: u8, rm: Rm, k: u8, z: bool, imm: Option<u8>) {
        let full = if ll == 0b01 { 32 } else { 64 };
        let (rm_low, x_bit, b_bit, bcst, mem, n) = match rm {
            Rm::Reg(r) => (r & 7, (r >> 4) & 1, (r >> 3) & 1, false, None, 1),
            Rm::Full(m) => (m.base & 7, m.index.map_or(0, |i| (i >> 3) & 1), (m.base >> 3) & 1, false, Some(m), full),
            Rm::Bcst(m) => (m.base & 7, m.index.map_or(0, |i| (i >> 3) & 1), (m.base >> 3) & 1, true, Some(m), 4),
            Rm::Dword(m) => (m.base & 7, m.index.map_or(0, |i| (i >> 3) & 1), (m.base >> 3) & 1, false, Some(m), 4),
            Rm::Half(m) => (m.base & 7, m.index.map_or(0, |i| (i >> 3) & 1), (m.base >> 3) & 1, false, Some(m), 32),
            Rm::Word(m) => (m.base & 7, m.index.map_or(0, |i| (i >> 3) & 1), (m.base >> 3) & 1, false, Some(m), 2),
        };
        let r_bit = (reg >> 3) & 1;
        let r2_bit = (reg >> 4) & 1;
        let p0 = ((r_bit ^ 1) << 7) | ((x_bit ^ 1) << 6) | ((b_bit ^ 1) << 5) | ((r2_bit ^ 1) << 4) | o.map;
        let p1 = ((w as u8) << 7) | (((!v) & 0xf) << 3) | 0x04 | o.pp;
        let p2 = ((z as u8) << 7) | (ll << 5) | ((bcst as u8) << 4) | ((((v >> 4) & 1) ^ 1) << 3) | (k & 7);
        self.bytes.extend([0x62, p0, p1, p2, o.op]);
        match mem {
            None => self.bytes.push(0xc0 | ((reg & 7) << 3) | rm_low),
            Some(m) => self.modrm_mem(reg, m, n),
        }
        if let Some(i) = imm {
            self.bytes.push(i);
        }
    }

    /// ModRM, SIB and displacement of a memory operand whose accesses are `n` bytes (EVEX's compressed `disp8*N`).
    fn modrm_mem(&mut self, reg: u8, m: Mem, n: i32) {
        let base = m.base & 7;
        let needs_sib = m.index.is_some() || base == 4;
        let disp8 = (m.disp % n == 0 && (-128..=127).contains(&(m.disp / n))).then_some((m.disp / n) as i8);
        // [rbp]/[r13] with no displacement would mean RIP-relative (mod 00, rm 101): give it a zero disp8.
        let md = if m.disp == 0 && base != 5 {
            0
        } else if disp8.is_some() {
            1
        } else {
            2
        };
        let rm = if needs_sib { 4 } else { base };
        self.bytes.push((md << 6) | ((reg & 7) << 3) | rm);
        if needs_sib {
            // Index 100 (none) unless given.
            let idx = m.index.map_or(4, |i| i & 7);
            let ss = if m.index.is_some() { m.scale.trailing_zeros() as u8 & 3 } else { 0 };
            self.bytes.push((ss << 6) | (idx << 3) | base);
        }
        match md {
            1 => self.bytes.push(disp8.unwrap_or(0) as u8),
            2 => self.bytes.extend(m.disp.to_le_bytes()),
            _ => {}
        }
    }

    /// `d = x op src` for a two-operand arithmetic opcode (`VADDPS`, `VPANDD`, `VFMADD231PS`: `d += x * src`, ...).
    pub(crate) fn op3(&mut self, o: Opc, d: u8, x: u8, src: Rm) {
        self.insn(o, d, x, src, 0, false, None);
    }

    pub(crate) fn zero(&mut self, d: u8) {
        self.op3(VPXORD, d, d, Rm::Reg(d));
    }

    pub(crate) fn sqrt(&mut self, d: u8, x: u8) {
        self.insn(VSQRTPS, d, 0, Rm::Reg(x), 0, false, None);
    }

    pub(crate) fn mov(&mut self, d: u8, x: u8) {
        self.insn(VMOVAPS, d, 0, Rm::Reg(x), 0, false, None);
    }

    /// `d = [m]`, or with opmask `k` (non-zero) the lanes of `k` and zeros elsewhere (masked-off lanes never fault).
    pub(crate) fn load(&mut self, d: u8, m: Mem, k: u8) {
        self.insn(VMOVUPS_LOAD, d, 0, Rm::Full(m), k, k != 0, None);
    }

    /// `d = k ? x : 0` per lane (`vmovaps d{k}{z}, x`).
    pub(crate) fn mov_masked_zero(&mut self, d: u8, k: u8, x: u8) {
        self.insn(VMOVAPS, d, 0, Rm::Reg(x), k, true, None);
    }

    /// `d` = lane 0 of `x` in every lane.
    pub(crate) fn broadcast_lane0(&mut self, d: u8, x: u8) {
        self.insn(VBROADCASTSS, d, 0, Rm::Reg(x), 0, false, None);
    }

    /// `d` = the 128-bit quarters of `x` and `y` picked by `imm` (`vshuff32x4`; 0x4e swaps the 256-bit halves of
    /// `x == y`).
    /// `d` = `x` rounded to an integral value, ties to even (`vrndscaleps` with immediate 0).
    pub(crate) fn round_nearest(&mut self, d: u8, x: u8) {
        self.insn(VRNDSCALEPS, d, 0, Rm::Reg(x), 0, false, Some(0));
    }

    pub(crate) fn shuffle_quarters(&mut self, d: u8, x: u8, y: u8, imm: u8) {
        self.insn(VSHUFF32X4, d, x, Rm::Reg(y), 0, false, Some(imm));
    }

    /// `[m] = x`, only the lanes of opmask `k` when non-zero.
    pub(crate) fn store(&mut self, m: Mem, x: u8, k: u8) {
        self.insn(VMOVUPS_STORE, x, 0, Rm::Full(m), k, false, None);
    }

    /// `[m]` = the low word of each of zmm `x`'s 16 dwords, only those of opmask `k` when non-zero (`vpmovdw`).
    pub(crate) fn store_low_words(&mut self, m: Mem, x: u8, k: u8) {
        self.insn(VPMOVDW, x, 0, Rm::Half(m), k, false, None);
    }

    /// `d` = the 16 words at `[m]`, each zero-extended to a dword; with opmask `k` (non-zero) only the words of `k`
    /// are read and the other lanes are zero (`vpmovzxwd d{k}{z}`: a bf16 load, before its shift into the top half).
    pub(crate) fn load_words_zx(&mut self, d: u8, m: Mem, k: u8) {
        self.insn(VPMOVZXWD, d, 0, Rm::Half(m), k, k != 0, None);
    }

    /// `d` = the word at `[m]` in all 32 words (`vpbroadcastw`, AVX512BW).
    pub(crate) fn broadcast_word(&mut self, d: u8, m: Mem) {
        self.insn(VPBROADCASTW, d, 0, Rm::Word(m), 0, false, None);
    }

    /// `d += x . src`: each f32 lane adds the two products of its pair of bf16 (`vdpbf16ps`, AVX512-BF16).
    pub(crate) fn dot_bf16(&mut self, d: u8, x: u8, src: Rm) {
        self.insn(VDPBF16PS, d, x, src, 0, false, None);
    }

    /// `d = [m]` in every lane (one dword).
    pub(crate) fn broadcast(&mut self, d: u8, m: Mem) {
        self.insn(VBROADCASTSS, d, 0, Rm::Dword(m), 0, false, None);
    }

    /// `k = x <pred> y` (a `vcmpps` predicate).
    pub(crate) fn cmp(&mut self, k: u8, x: u8, y: u8, pred: u8) {
        self.insn(VCMPPS, k, x, Rm::Reg(y), 0, false, Some(pred));
    }

    /// `k = x == y` on 32-bit integer lanes (`vpcmpeqd`).
    pub(crate) fn icmp_eq(&mut self, k: u8, x: u8, y: u8) {
        self.insn(VPCMPEQD, k, x, Rm::Reg(y), 0, false, None);
    }

    /// `d` = the low dword of general register `r` in every lane (`vpbroadcastd zmm, r32`).
    pub(crate) fn broadcast_gpr(&mut self, d: u8, r: u8) {
        // ModRM.rm names the GPR (B from bit 3); EVEX.X, which would extend a vector register, stays clear.
        self.insn(VPBROADCASTD_GPR, d, 0, Rm::Reg(r & 15), 0, false, None);
    }

    /// `d = k ? all ones : 0` per lane (`vpternlogd d{k}{z}, d, d, 0xff`).
    pub(crate) fn mask_to_lanes(&mut self, d: u8, k: u8) {
        self.insn(VPTERNLOGD, d, d, Rm::Reg(d), k, true, Some(0xff));
    }

    /// `k = (x & x) != 0` per lane.
    pub(crate) fn lanes_to_mask(&mut self, k: u8, x: u8) {
        self.insn(VPTESTMD, k, x, Rm::Reg(x), 0, false, None);
    }

    /// `d = k ? t : f` per lane.
    pub(crate) fn blend(&mut self, d: u8, k: u8, f: u8, t: u8) {
        self.insn(VBLENDMPS, d, f, Rm::Reg(t), k, false, None);
    }

    /// 32-bit lanes of `x` shifted by `n`: `ext` 6 left, 4 right arithmetic, 2 right logical.
    pub(crate) fn shift(&mut self, ext: u8, d: u8, x: u8, n: u8) {
        self.insn(SHIFT_IMM, ext, d, Rm::Reg(x), 0, false, Some(n));
    }

    /// `kmovw k, word [m]` (a VEX instruction; AVX-512F).
    pub(crate) fn kmov_load(&mut self, k: u8, m: Mem) {
        let x_inv = m.index.map_or(1, |i| ((i >> 3) & 1) ^ 1);
        let b_inv = ((m.base >> 3) & 1) ^ 1;
        // 3-byte VEX: R̄ X̄ B̄ mmmmm (0F), W0 vvvv=1111 L0 pp=00; then ModRM with an uncompressed displacement.
        self.bytes.extend([0xc4, 0x80 | (x_inv << 6) | (b_inv << 5) | 0x01, 0x78, 0x90]);
        self.modrm_mem(k, m, 1);
    }
}

/// GPR numbers used by the kernels.
pub(crate) mod gpr {
    pub const RAX: u8 = 0;
    pub const RDX: u8 = 2;
    pub const RSP: u8 = 4;
    pub const RBP: u8 = 5;
    pub const RSI: u8 = 6;
    pub const RDI: u8 = 7;
    pub const R8: u8 = 8;
    pub const R9: u8 = 9;
    pub const R10: u8 = 10;
    pub const R11: u8 = 11;
    pub const R12: u8 = 12;
    pub const R14: u8 = 14;
    pub const R15: u8 = 15;
}

#[cfg(test)]
mod tests {
    use super::gpr::*;
    use super::*;

    const R12: u8 = 12;
    const R13: u8 = 13;

    /// Every form the kernels emit, against `as` (GNU binutils 2.40, `-M intel`) on the same instructions.
    #[test]
    fn encodings_match_gnu_as() {
        let mut e = Enc::default();
        let mut want: Vec<u8> = Vec::new();
        let mut check = |e: &mut Enc, bytes: &[u8], what: &str| {
            assert_eq!(&e.bytes[..], bytes, "{what}");
            want.extend(bytes);
            e.bytes.clear();
        };
        e.op3(VFMADD231PS, 0, 24, Rm::Reg(31));
        check(&mut e, &[0x62, 0x92, 0x3d, 0x40, 0xb8, 0xc7], "vfmadd231ps zmm0, zmm24, zmm31");
        e.op3(VFMADD231PS, 17, 3, Rm::Bcst(mem(RDI, 8)));
        check(&mut e, &[0x62, 0xe2, 0x65, 0x58, 0xb8, 0x4f, 0x02], "vfmadd231ps zmm17, zmm3, [rdi+8]{1to16}");
        e.op3(VFMADD231PS, 5, 30, Rm::Full(mem(RSI, 128)));
        check(&mut e, &[0x62, 0xf2, 0x0d, 0x40, 0xb8, 0x6e, 0x02], "vfmadd231ps zmm5, zmm30, [rsi+128]");
        e.op3(VFMADD231PS, 5, 30, Rm::Full(mem(RSI, 100)));
        check(&mut e, &[0x62, 0xf2, 0x0d, 0x40, 0xb8, 0xae, 0x64, 0, 0, 0], "vfmadd231ps zmm5, zmm30, [rsi+100]");
        e.load(16, mem(RSI, 64), 0);
        check(&mut e, &[0x62, 0xe1, 0x7c, 0x48, 0x10, 0x46, 0x01], "vmovups zmm16, [rsi+64]");
        e.load(3, mem(RDX, 192), 1);
        check(&mut e, &[0x62, 0xf1, 0x7c, 0xc9, 0x10, 0x5a, 0x03], "vmovups zmm3{k1}{z}, [rdx+192]");
        e.store(mem(RDX, 4096), 29, 1);
        check(&mut e, &[0x62, 0x61, 0x7c, 0x49, 0x11, 0x6a, 0x40], "vmovups [rdx+4096]{k1}, zmm29");
        e.store(mem(R9, 0), 2, 0);
        check(&mut e, &[0x62, 0xd1, 0x7c, 0x48, 0x11, 0x11], "vmovups [r9], zmm2");
        e.broadcast(31, mem(RDI, 12));
        check(&mut e, &[0x62, 0x62, 0x7d, 0x48, 0x18, 0x7f, 0x03], "vbroadcastss zmm31, [rdi+12]");
        e.broadcast(7, mem(R9, -4));
        check(&mut e, &[0x62, 0xd2, 0x7d, 0x48, 0x18, 0x79, 0xff], "vbroadcastss zmm7, [r9-4]");
        e.zero(20);
        check(&mut e, &[0x62, 0xa1, 0x5d, 0x40, 0xef, 0xe4], "vpxord zmm20, zmm20, zmm20");
        e.op3(VADDPS, 1, 2, Rm::Reg(27));
        check(&mut e, &[0x62, 0x91, 0x6c, 0x48, 0x58, 0xcb], "vaddps zmm1, zmm2, zmm27");
        e.op3(VADDPS, 1, 1, Rm::Bcst(mem(R10, 32)));
        check(&mut e, &[0x62, 0xd1, 0x74, 0x58, 0x58, 0x4a, 0x08], "vaddps zmm1, zmm1, [r10+32]{1to16}");
        for (o, byte, p1) in [
            (VSUBPS, 0x5c, 0x2c),
            (VMULPS, 0x59, 0x2c),
            (VDIVPS, 0x5e, 0x2c),
            (VPANDD, 0xdb, 0x2d),
            (VPORD, 0xeb, 0x2d),
            (VPXORD, 0xef, 0x2d),
            (VPADDD, 0xfe, 0x2d),
            (VPSUBD, 0xfa, 0x2d),
            (VMAXPS, 0x5f, 0x2c),
            (VMINPS, 0x5d, 0x2c),
        ] {
            e.op3(o, 9, 10, Rm::Reg(11));
            check(&mut e, &[0x62, 0x51, p1, 0x48, byte, 0xcb], &format!("opcode {byte:#x} zmm9, zmm10, zmm11"));
        }
        e.sqrt(19, 12);
        check(&mut e, &[0x62, 0xc1, 0x7c, 0x48, 0x51, 0xdc], "vsqrtps zmm19, zmm12");
        e.op3(VSCALEFPS, 1, 2, Rm::Reg(27));
        check(&mut e, &[0x62, 0x92, 0x6d, 0x48, 0x2c, 0xcb], "vscalefps zmm1, zmm2, zmm27");
        e.op3(VSCALEFPS, 20, 9, Rm::Reg(3));
        check(&mut e, &[0x62, 0xe2, 0x35, 0x48, 0x2c, 0xe3], "vscalefps zmm20, zmm9, zmm3");
        e.round_nearest(1, 2);
        check(&mut e, &[0x62, 0xf3, 0x7d, 0x48, 0x08, 0xca, 0x00], "vrndscaleps zmm1, zmm2, 0");
        e.round_nearest(20, 9);
        check(&mut e, &[0x62, 0xc3, 0x7d, 0x48, 0x08, 0xe1, 0x00], "vrndscaleps zmm20, zmm9, 0");
        e.round_nearest(3, 27);
        check(&mut e, &[0x62, 0x93, 0x7d, 0x48, 0x08, 0xdb, 0x00], "vrndscaleps zmm3, zmm27, 0");
        e.mov(19, 12);
        check(&mut e, &[0x62, 0xc1, 0x7c, 0x48, 0x28, 0xdc], "vmovaps zmm19, zmm12");
        e.op3(VFMADD213PS, 4, 18, Rm::Bcst(mem(R10, 64)));
        check(&mut e, &[0x62, 0xd2, 0x6d, 0x50, 0xa8, 0x62, 0x10], "vfmadd213ps zmm4, zmm18, [r10+64]{1to16}");
        e.shift(6, 4, 18, 23);
        check(&mut e, &[0x62, 0xb1, 0x5d, 0x48, 0x72, 0xf2, 0x17], "vpslld zmm4, zmm18, 23");
        e.shift(4, 21, 2, 1);
        check(&mut e, &[0x62, 0xf1, 0x55, 0x40, 0x72, 0xe2, 0x01], "vpsrad zmm21, zmm2, 1");
        e.shift(2, 4, 18, 9);
        check(&mut e, &[0x62, 0xb1, 0x5d, 0x48, 0x72, 0xd2, 0x09], "vpsrld zmm4, zmm18, 9");
        e.cmp(2, 3, 25, 0x11);
        check(&mut e, &[0x62, 0x91, 0x64, 0x48, 0xc2, 0xd1, 0x11], "vcmplt_oqps k2, zmm3, zmm25");
        e.mask_to_lanes(6, 2);
        check(&mut e, &[0x62, 0xf3, 0x4d, 0xca, 0x25, 0xf6, 0xff], "vpternlogd zmm6{k2}{z}, zmm6, zmm6, 0xff");
        e.lanes_to_mask(2, 22);
        check(&mut e, &[0x62, 0xb2, 0x4d, 0x40, 0x27, 0xd6], "vptestmd k2, zmm22, zmm22");
        e.blend(7, 2, 8, 26);
        check(&mut e, &[0x62, 0x92, 0x3d, 0x4a, 0x65, 0xfa], "vblendmps zmm7{k2}, zmm8, zmm26");
        e.kmov_load(1, mem(R9, 0));
        check(&mut e, &[0xc4, 0xc1, 0x78, 0x90, 0x09], "kmovw k1, [r9]");
        e.load(0, mem(RSP, 64), 0);
        check(&mut e, &[0x62, 0xf1, 0x7c, 0x48, 0x10, 0x44, 0x24, 0x01], "vmovups zmm0, [rsp+64]");
        e.load(0, mem(R13, 0), 0);
        check(&mut e, &[0x62, 0xd1, 0x7c, 0x48, 0x10, 0x45, 0x00], "vmovups zmm0, [r13]");
        e.load(0, mem(R12, -8), 0);
        check(&mut e, &[0x62, 0xd1, 0x7c, 0x48, 0x10, 0x84, 0x24, 0xf8, 0xff, 0xff, 0xff], "vmovups zmm0, [r12-8]");
        e.op3(VADDPS, 3, 3, Rm::Full(mem_indexed(RDX, RAX, 1, 64)));
        check(&mut e, &[0x62, 0xf1, 0x64, 0x48, 0x58, 0x5c, 0x02, 0x01], "vaddps zmm3, zmm3, [rdx+rax+64]");
        e.mov_masked_zero(3, 1, 29);
        check(&mut e, &[0x62, 0x91, 0x7c, 0xc9, 0x28, 0xdd], "vmovaps zmm3{k1}{z}, zmm29");
        e.broadcast_lane0(0, 0);
        check(&mut e, &[0x62, 0xf2, 0x7d, 0x48, 0x18, 0xc0], "vbroadcastss zmm0, xmm0");
        e.broadcast_lane0(17, 9);
        check(&mut e, &[0x62, 0xc2, 0x7d, 0x48, 0x18, 0xc9], "vbroadcastss zmm17, xmm9");
        e.shuffle_quarters(1, 0, 0, 0x4e);
        check(&mut e, &[0x62, 0xf3, 0x7d, 0x48, 0x23, 0xc8, 0x4e], "vshuff32x4 zmm1, zmm0, zmm0, 0x4e");
        e.kmov_load(1, mem(R14, 0));
        check(&mut e, &[0xc4, 0xc1, 0x78, 0x90, 0x0e], "kmovw k1, [r14]");
        e.kmov_load(1, mem(R15, 0));
        check(&mut e, &[0xc4, 0xc1, 0x78, 0x90, 0x0f], "kmovw k1, [r15]");
        e.load(5, mem_indexed(11, RAX, 1, 128), 1);
        check(&mut e, &[0x62, 0xd1, 0x7c, 0xc9, 0x10, 0x6c, 0x03, 0x02], "vmovups zmm5{k1}{z}, [r11+rax+128]");
        e.store(mem_indexed(RDI, RAX, 1, 64), 20, 1);
        check(&mut e, &[0x62, 0xe1, 0x7c, 0x49, 0x11, 0x64, 0x07, 0x01], "vmovups [rdi+rax+64]{k1}, zmm20");
        e.broadcast(30, mem(3, 0));
        check(&mut e, &[0x62, 0x62, 0x7d, 0x48, 0x18, 0x33], "vbroadcastss zmm30, [rbx]");
        e.broadcast(30, mem(RAX, 32));
        check(&mut e, &[0x62, 0x62, 0x7d, 0x48, 0x18, 0x70, 0x08], "vbroadcastss zmm30, [rax+32]");
        e.store_low_words(mem(RDX, 64), 4, 1);
        check(&mut e, &[0x62, 0xf2, 0x7e, 0x49, 0x33, 0x62, 0x02], "vpmovdw [rdx+64]{k1}, zmm4");
        e.load_words_zx(5, mem_indexed(11, RAX, 1, 64), 1);
        check(&mut e, &[0x62, 0xd2, 0x7d, 0xc9, 0x33, 0x6c, 0x03, 0x02], "vpmovzxwd zmm5{k1}{z}, [r11+rax+64]");
        e.load_words_zx(21, mem_indexed(1, RAX, 1, 0), 0);
        check(&mut e, &[0x62, 0xe2, 0x7d, 0x48, 0x33, 0x2c, 0x01], "vpmovzxwd zmm21, [rcx+rax]");
        e.load(3, mem_indexed(RDX, RAX, 2, 128), 0);
        check(&mut e, &[0x62, 0xf1, 0x7c, 0x48, 0x10, 0x5c, 0x42, 0x02], "vmovups zmm3, [rdx+rax*2+128]");
        e.store(mem_indexed(RDI, RAX, 2, 64), 20, 1);
        check(&mut e, &[0x62, 0xe1, 0x7c, 0x49, 0x11, 0x64, 0x47, 0x01], "vmovups [rdi+rax*2+64]{k1}, zmm20");
        e.store_low_words(mem_indexed(RDI, RAX, 1, 32), 4, 1);
        check(&mut e, &[0x62, 0xf2, 0x7e, 0x49, 0x33, 0x64, 0x07, 0x01], "vpmovdw [rdi+rax+32]{k1}, zmm4");
        e.broadcast_word(4, mem(R9, 6));
        check(&mut e, &[0x62, 0xd2, 0x7d, 0x48, 0x79, 0x61, 0x03], "vpbroadcastw zmm4, [r9+6]");
        e.broadcast_word(17, mem(RAX, 0));
        check(&mut e, &[0x62, 0xe2, 0x7d, 0x48, 0x79, 0x08], "vpbroadcastw zmm17, [rax]");
        e.broadcast_word(3, mem(R9, 1000));
        check(&mut e, &[0x62, 0xd2, 0x7d, 0x48, 0x79, 0x99, 0xe8, 0x03, 0, 0], "vpbroadcastw zmm3, [r9+1000]");
        e.dot_bf16(1, 2, Rm::Reg(3));
        check(&mut e, &[0x62, 0xf2, 0x6e, 0x48, 0x52, 0xcb], "vdpbf16ps zmm1, zmm2, zmm3");
        e.icmp_eq(2, 3, 25);
        check(&mut e, &[0x62, 0x91, 0x65, 0x48, 0x76, 0xd1], "vpcmpeqd k2, zmm3, zmm25");
        e.broadcast_gpr(17, RAX);
        check(&mut e, &[0x62, 0xe2, 0x7d, 0x48, 0x7c, 0xc8], "vpbroadcastd zmm17, eax");
        e.broadcast_gpr(4, 12);
        check(&mut e, &[0x62, 0xd2, 0x7d, 0x48, 0x7c, 0xe4], "vpbroadcastd zmm4, r12d");
        e.op3(VPADDD, 5, 5, Rm::Full(mem(RBP, 96)));
        check(&mut e, &[0x62, 0xf1, 0x55, 0x48, 0xfe, 0xad, 0x60, 0, 0, 0], "vpaddd zmm5, zmm5, [rbp+96]");
        assert!(!want.is_empty());
    }
}
