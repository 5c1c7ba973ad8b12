//! `KILN_DUMP=<dir>|stderr`: what was generated, for people. Per compiled plan: the graph before fusion (text and
//! Graphviz DOT), the kernels after fusion with their buffer slots, each kernel's kernel IR, its rendered code and
//! its disassembly where the backend has one, and the cache keys. Files are named `plan<N>.<what>`; N counts plans
//! compiled by this process. Each process writes into a folder of its own, `<dir>/<program>-<pid>`, named once on
//! stderr: a reused `<dir>` would otherwise mix two runs' `plan0.*` files without a word. Failing to write a dump
//! never fails a compile: it is reported once on stderr.

use kiln_jit::Graph;
use kiln_jit::kernel::{KernelIr, KernelPlan};
use std::collections::hash_map::DefaultHasher;
use std::fmt::Write as _;
use std::hash::{Hash, Hasher};
use std::path::PathBuf;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};

static PLANS: AtomicUsize = AtomicUsize::new(0);

/// This process's folder under `root`, created (and named on stderr) on first use; `None` when it cannot be.
fn process_dir(root: PathBuf) -> Option<PathBuf> {
    static DIR: OnceLock<Option<PathBuf>> = OnceLock::new();
    DIR.get_or_init(|| {
        let program = std::env::current_exe()
            .ok()
            .and_then(|p| p.file_stem().map(|s| s.to_string_lossy().into_owned()))
            .unwrap_or_else(|| "kiln".to_string());
        let dir = root.join(format!("{program}-{}", std::process::id()));
        match std::fs::create_dir_all(&dir) {
            Ok(()) => {
                eprintln!("kiln: KILN_DUMP: writing this process's plans to {}", dir.display());
                Some(dir)
            }
            Err(e) => {
                eprintln!("kiln: KILN_DUMP: cannot create {}: {e}", dir.display());
                None
            }
        }
    })
    .clone()
}

pub struct Dump {
    /// `None` writes to stderr.
    dir: Option<PathBuf>,
    plan: usize,
    kernels: AtomicUsize,
}

impl Dump {
    /// Starts the dump of one plan, if `KILN_DUMP` is set.
    pub fn start(graph: &Graph, plan: &KernelPlan) -> Option<Dump> {
        let target = std::env::var("KILN_DUMP").ok().filter(|s| !s.is_empty())?;
        let dir = match target.as_str() {
            "stderr" => None,
            _ => Some(process_dir(PathBuf::from(target))?),
        };
        let dump = Dump { dir, plan: PLANS.fetch_add(1, Ordering::Relaxed), kernels: AtomicUsize::new(0) };
        dump.write("graph.txt", &graph.to_text());
        dump.write("graph.dot", &graph.to_dot());
        dump.write("fused.txt", &fused_text(plan));
        dump.write("fused.dot", &fused_dot(plan));
        let mut keys = String::from("kernel cache keys (hash of the kernel IR text; the IR fixes the code):\n");
        for l in &plan.launches {
            let _ = writeln!(keys, "{:016x} {}", ir_hash(&l.kernel), l.kernel.name);
        }
        dump.write("keys.txt", &keys);
        Some(dump)
    }

    /// Dumps one kernel: its IR, its rendered code (`ext` names the language) and disassembly.
    pub fn kernel_files(&self, k: &KernelIr, ext: &str, code: &str, disasm: &str) {
        let stem = self.begin_kernel(k);
        self.write(&format!("{stem}.{ext}"), code);
        if !disasm.is_empty() {
            self.write(&format!("{stem}.s"), disasm);
        }
    }

    /// Dumps one kernel whose configuration the autotuner chose (a WGSL GEMM tile): its IR, its rendered code, and
    /// its configuration with the autotune table (every candidate: score, time, verified, winner).
    pub fn tuned_kernel_files(&self, k: &KernelIr, ext: &str, code: &str, config: &str, autotune_table: &str) {
        let stem = self.begin_kernel(k);
        self.write(&format!("{stem}.{ext}"), code);
        self.write(&format!("{stem}.autotune.txt"), &format!("config: {config}\n\n{autotune_table}"));
    }

    /// Dumps one generated GEMM: its IR, its configuration and autotune table (every candidate: score, time,
    /// verified, winner), and its machine code (`objdump -D -b binary -mi386:x86-64 <file>` disassembles it).
    pub fn gemm_files(&self, k: &KernelIr, config: &str, code: &[u8], autotune_table: &str) {
        let stem = self.begin_kernel(k);
        self.write(&format!("{stem}.autotune.txt"), &format!("config: {config}\n\n{autotune_table}"));
        // The library candidate has no generated code to write.
        self.write_bytes(&format!("{stem}.gemm.bin"), code);
    }

    /// Dumps one kernel generated as machine code without a tuner (an 8-lane elementwise kernel): its IR, its
    /// listing (`ext` names the file) and the code, as for a GEMM.
    pub fn generated_files(&self, k: &KernelIr, ext: &str, listing: &str, code: &[u8]) {
        let stem = self.begin_kernel(k);
        self.write(&format!("{stem}.{ext}"), listing);
        self.write_bytes(&format!("{stem}.bin"), code);
    }

    /// Numbers the next kernel dumped and writes its IR (`<stem>.kir`); returns its file stem
    /// ([`kernel_file_stem`]), which the kernel's other files share.
    fn begin_kernel(&self, k: &KernelIr) -> String {
        let stem = kernel_file_stem(self.kernels.fetch_add(1, Ordering::Relaxed), &k.name);
        self.write(&format!("{stem}.kir"), &k.to_text());
        stem
    }

    fn write_bytes(&self, what: &str, code: &[u8]) {
        if let Some(d) = self.dir.as_ref().filter(|_| !code.is_empty()) {
            let name = format!("plan{}.{what}", self.plan);
            if let Err(e) = std::fs::write(d.join(&name), code) {
                eprintln!("kiln: KILN_DUMP: cannot write {name}: {e}");
            }
        }
    }

    fn write(&self, what: &str, text: &str) {
        let name = format!("plan{}.{what}", self.plan);
        match &self.dir {
            None => eprintln!("==== {name}\n{text}"),
            Some(d) => {
                if let Err(e) = std::fs::write(d.join(&name), text) {
                    eprintln!("kiln: KILN_DUMP: cannot write {name}: {e}");
                }
            }
        }
    }
}

/// The file stem of the `n`-th kernel dumped: `k<n>.<name>`, the name cut in its middle where it is long (a
/// gradient norm's stack of 52 per-parameter norms is named by its ops, ~900 bytes), so every file name stays under
/// the 255 bytes file systems allow with its plan prefix and extension. `n` keeps the stems apart; the name's start
/// (its first ops) and end (its shape) stay.
fn kernel_file_stem(n: usize, name: &str) -> String {
    const KEEP_START: usize = 120;
    const KEEP_END: usize = 40;
    // Kernel names are ASCII (op names, digits, `x` and `_`), so byte offsets are character boundaries.
    if name.len() <= KEEP_START + KEEP_END + 5 || !name.is_ascii() {
        return format!("k{n}.{name}");
    }
    format!("k{n}.{}_etc_{}", &name[..KEEP_START], &name[name.len() - KEEP_END..])
}

fn ir_hash(k: &KernelIr) -> u64 {
    let mut h = DefaultHasher::new();
    k.to_text().hash(&mut h);
    h.finish()
}

fn fused_text(plan: &KernelPlan) -> String {
    let mut s = String::new();
    for (i, l) in plan.launches.iter().enumerate() {
        let _ = writeln!(s, "launch {i}: {} reads {:?} writes {:?}", l.kernel.name, l.inputs, l.output);
    }
    let _ = writeln!(s, "temps (bytes): {:?}", plan.temps);
    s
}

fn fused_dot(plan: &KernelPlan) -> String {
    let mut s = String::from("digraph kernels {\n  node [shape=box, fontname=monospace];\n");
    for (i, l) in plan.launches.iter().enumerate() {
        let _ = writeln!(s, "  k{i} [label=\"{}\"];", l.kernel.name);
        let _ = writeln!(s, "  b{i} [label=\"{:?}\", shape=ellipse];", l.output);
        let _ = writeln!(s, "  k{i} -> b{i};");
        for input in &l.inputs {
            let src = plan.launches.iter().position(|p| p.output == *input);
            match src {
                Some(j) if j < i => {
                    let _ = writeln!(s, "  b{j} -> k{i};");
                }
                _ => {
                    let _ = writeln!(s, "  \"{input:?}\" -> k{i};");
                }
            }
        }
    }
    s.push_str("}\n");
    s
}

#[cfg(test)]
mod tests {
    use super::kernel_file_stem;

    /// A long kernel name is cut to a stem whose file names fit a file system's 255 bytes, keeping its start and
    /// its shape; a short one is kept whole.
    #[test]
    fn long_kernel_names_make_short_stems() {
        assert_eq!(kernel_file_stem(3, "G_matmul_add_1024x512_128"), "k3.G_matmul_add_1024x512_128");
        let long = format!("E_{}52", "sqrt_pad_add_".repeat(70));
        let s = kernel_file_stem(361, &long);
        assert!(s.starts_with("k361.E_sqrt_pad_add_") && s.ends_with("sqrt_pad_add_52"), "{s}");
        assert!(format!("plan12.{s}.autotune.txt").len() < 255, "{} bytes", s.len());
    }
}
