//! `kiln`: the command line. It tunes GEMMs ahead of time (`kiln tune`) and inspects and ships the tuning and
//! compile cache (`kiln cache ...`).
//!
//! Owns: argument parsing and how results are shown. Deliberately not: any cache logic (all of it is
//! `kiln_autotune::Store`, so the binary and the library can never disagree about what an entry is) nor tuning
//! logic (`kiln::tune`). Every command works on `Store::global()`, so it sees the cache a program run with the
//! same `KILN_CACHE_DIR` sees.

use std::io::{self, Write as _};
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use indicatif::{HumanBytes, ProgressBar, ProgressStyle};
use kiln_autotune::{EntryInfo, EntryKind, Store};
use kiln_backends::gpu_cache;
use kiln_jit::render::cuda::Flavor;

#[derive(Parser)]
#[command(name = "kiln", version, about = "kiln's command line")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Inspect and ship the cache of tuning records and compiled artifacts (root: KILN_CACHE_DIR).
    #[command(subcommand)]
    Cache(CacheCommand),
    /// Tune and compile GEMMs ahead of time (results go to the cache; `kiln cache export` ships them).
    ///
    /// Example: `kiln tune --gemm 1024x1024x1024 --layer 256x784 --batch 1,32,128 --transposed-w`.
    Tune(TuneArgs),
}

#[derive(clap::Args)]
struct TuneArgs {
    /// A GEMM `MxNxK` (x[M,K] @ w[K,N]); repeatable.
    #[arg(long = "gemm", value_name = "MxNxK")]
    gemms: Vec<String>,
    /// A layer `NxK` (out x in features) tuned at every `--batch` hint as M; repeatable.
    #[arg(long = "layer", value_name = "NxK")]
    layers: Vec<String>,
    /// Batch hints for `--layer`, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,32,128,1024")]
    batch: Vec<usize>,
    /// The weight is stored [N, K] and transposed, as in `nn::Linear`.
    #[arg(long)]
    transposed_w: bool,
    /// What follows the GEMM: none, bias or bias-relu (part of the tuning key).
    #[arg(long, default_value = "none")]
    epilogue: String,
    /// Search effort: off (model only), fast, or full.
    #[arg(long, default_value = "full")]
    mode: String,
}

#[derive(Subcommand)]
enum CacheCommand {
    /// List every entry, one per line; entries of other kiln versions or devices are marked foreign.
    Ls {
        /// Also print each record's autotune table.
        #[arg(short, long)]
        verbose: bool,
    },
    /// Counts and sizes per kind, the root, this namespace and the device.
    Stats,
    /// Remove this kiln version's entries for this device (other versions and devices are kept).
    Clear,
    /// Write every record and artifact of this namespace to one bundle file (refused when there is none).
    Export {
        file: PathBuf,
        /// Write the bundle even when the cache holds nothing for this kiln version and device.
        #[arg(long)]
        allow_empty: bool,
        /// Export the CUDA cubins compiled for this architecture (`sm_90`) instead: those a run with
        /// `KILN_CUDA_ARCH=sm_90` compiled, on this machine, with or without a GPU.
        #[arg(long, value_name = "SM_XY", conflicts_with = "hip_arch")]
        cuda_arch: Option<String>,
        /// Export the HIP code objects compiled for this architecture (`gfx90a`) instead: those a run with
        /// `KILN_HIP_ARCH=gfx90a` compiled, on this machine, with or without a GPU.
        #[arg(long, value_name = "GFX")]
        hip_arch: Option<String>,
    },
    /// Store every entry of a bundle made by this kiln version on this kind of device (a bundle of GPU code: for
    /// this machine's GPU architecture).
    Import { file: PathBuf },
    /// Check every entry of this namespace; exit code 1 if any is bad.
    Verify,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Cache(command) => cache(command, Store::global()),
        Command::Tune(args) => tune(args),
    };
    match result {
        Ok(code) => code,
        Err(message) => {
            eprintln!("kiln: {message}");
            ExitCode::FAILURE
        }
    }
}

fn cache(command: CacheCommand, store: &Store) -> Result<ExitCode, String> {
    match command {
        CacheCommand::Ls { verbose } => ls(store, verbose),
        CacheCommand::Stats => stats(store),
        CacheCommand::Clear => {
            let removed = store.clear().map_err(|e| e.to_string())?;
            let place = store.namespace_dir().map_or_else(|| "memory".to_string(), |ns| ns.display().to_string());
            emit(&format!("removed {removed} entries from {place}\n"))
        }
        CacheCommand::Export { file, allow_empty, cuda_arch, hip_arch }
            if cuda_arch.is_some() || hip_arch.is_some() =>
        {
            let (flavor, arch) = match (cuda_arch, hip_arch) {
                (Some(arch), _) => (Flavor::Cuda, arch),
                (None, Some(arch)) => (Flavor::Hip, arch),
                (None, None) => unreachable!("the guard above"),
            };
            let code = gpu_cache::code_name(flavor);
            let stored = gpu_cache::store(flavor, &arch)?;
            if !allow_empty && !stored.entries().iter().any(|e| !e.foreign && e.problem.is_none()) {
                let var = gpu_cache::arch_var(flavor);
                return Err(format!(
                    "nothing to export: {} holds no {code} for {arch} (run the workload with {var}={arch} and this \
                     KILN_CACHE_DIR first); pass --allow-empty to write an empty bundle anyway",
                    where_(stored)
                ));
            }
            let s = stored.export_bundle(&file).map_err(|e| e.to_string())?;
            emit(&format!(
                "exported {} {code} for {arch} ({}) to {}\n",
                s.artifacts,
                HumanBytes(s.bytes),
                file.display()
            ))
        }
        CacheCommand::Export { file, allow_empty, .. } => {
            // Exporting nothing is almost always the wrong cache (KILN_CACHE_DIR unset or pointing elsewhere).
            if !allow_empty && !store.entries().iter().any(|e| !e.foreign && e.problem.is_none()) {
                return Err(format!(
                    "nothing to export: {} holds no entries for this kiln version and device (is KILN_CACHE_DIR \
                     the cache your model ran with? run it, or `kiln tune`, first); pass --allow-empty to write an \
                     empty bundle anyway",
                    where_(store)
                ));
            }
            let s = store.export_bundle(&file).map_err(|e| e.to_string())?;
            let text = format!(
                "exported {} records and {} artifacts ({} plans; {}) to {}\n",
                s.records,
                s.artifacts,
                s.plans,
                HumanBytes(s.bytes),
                file.display()
            );
            emit(&text)
        }
        CacheCommand::Import { file } => {
            if let Some((flavor, s)) = gpu_cache::import_bundle(&file, kiln::tune::local_gpu_arch)? {
                let code = gpu_cache::code_name(flavor);
                return emit(&format!("imported {} {code} from {}\n", s.artifacts, file.display()));
            }
            let s = store.import_bundle(&file).map_err(|e| e.to_string())?;
            // The plans are compiled by the process that imports the bundle itself (`kiln::tune::import_bundle`).
            let (r, a, p) = (s.records, s.artifacts, s.plans);
            emit(&format!("imported {r} records and {a} artifacts ({p} plans) from {}\n", file.display()))
        }
        CacheCommand::Verify => verify(store),
    }
}

fn dims(text: &str, n: usize) -> Result<Vec<usize>, String> {
    let parts: Vec<&str> = text.split('x').collect();
    let v: Vec<usize> = parts.iter().filter_map(|p| p.trim().parse().ok()).filter(|&x| x > 0).collect();
    if v.len() != n || parts.len() != n {
        return Err(format!("`{text}`: expected {n} positive sizes separated by `x`"));
    }
    Ok(v)
}

fn tune(args: TuneArgs) -> Result<ExitCode, String> {
    use kiln::tune::{Epilogue, GemmShape, Mode};
    let mode = Mode::parse(&args.mode).ok_or_else(|| format!("--mode {}: expected off, fast or full", args.mode))?;
    let epilogue = match args.epilogue.as_str() {
        "none" => Epilogue::None,
        "bias" => Epilogue::Bias,
        "bias-relu" => Epilogue::BiasRelu,
        e => return Err(format!("--epilogue {e}: expected none, bias or bias-relu")),
    };
    let mut shapes = Vec::new();
    for g in &args.gemms {
        let d = dims(g, 3)?;
        shapes.push(GemmShape { m: d[0], n: d[1], k: d[2], transposed_w: args.transposed_w, epilogue });
    }
    for l in &args.layers {
        let d = dims(l, 2)?;
        for &m in &args.batch {
            shapes.push(GemmShape { m, n: d[0], k: d[1], transposed_w: args.transposed_w, epilogue });
        }
    }
    if shapes.is_empty() {
        return Err("nothing to tune: give --gemm MxNxK or --layer NxK (see kiln tune --help)".into());
    }
    let bar = ProgressBar::new(shapes.len() as u64);
    if let Ok(style) = ProgressStyle::with_template("tuning {bar:30} {pos}/{len} {wide_msg}") {
        bar.set_style(style);
    }
    let mut out = String::new();
    for s in &shapes {
        let what = format!("{}x{}x{}", s.m, s.n, s.k);
        bar.set_message(what.clone());
        let line = match kiln::tune::tune_gemm(s, mode).map_err(|e| e.to_string())? {
            Some(rec) => {
                let t = rec.winner_trial().and_then(|t| t.time_ns).map_or("-".to_string(), |ns| {
                    // The time is of the problem it was tuned at (fast mode tunes a smaller one of the same key).
                    let dim = |name: &str| kiln_autotune::dim_named(&rec.tuned_dims, name).unwrap_or(1) as f64;
                    let gflops = 2.0 * dim("batch") * dim("m") * dim("n") * dim("k") / ns as f64;
                    format!("{:.1} µs, {gflops:.1} GFLOP/s", ns as f64 / 1e3)
                });
                let tuned: Vec<String> = rec.tuned_dims.iter().map(|(n, v)| format!("{n}={v}")).collect();
                format!("{what}: {} ({t}; tuned at {})\n", rec.winner, tuned.join(" "))
            }
            None => format!("{what}: not a generated GEMM on this host (too small, or no AVX2+FMA)\n"),
        };
        out.push_str(&line);
        bar.inc(1);
    }
    bar.finish_and_clear();
    let s = kiln::stats();
    out.push_str(&format!(
        "{} searched, {} reused from the cache ({})\n",
        s.tunings,
        s.tune_hits,
        where_(Store::global())
    ));
    emit(&out)
}

fn ls(store: &Store, verbose: bool) -> Result<ExitCode, String> {
    let entries = store.entries();
    if entries.is_empty() {
        return emit(&format!("no cache entries ({})\n", where_(store)));
    }
    let mut out = String::new();
    for e in &entries {
        out.push_str(&entry_line(e));
        out.push('\n');
        if verbose {
            if let Some(path) = &e.path {
                out.push_str(&format!("    {}\n", path.display()));
            }
            if e.kind == EntryKind::Record && e.problem.is_none() {
                let table = match &e.path {
                    Some(path) => Store::read_record_file(path).map(|r| r.table()),
                    None => Err("only in memory".to_string()),
                };
                match table {
                    Ok(table) => table.lines().for_each(|l| out.push_str(&format!("    {l}\n"))),
                    Err(reason) => out.push_str(&format!("    (no table: {reason})\n")),
                }
            }
        }
    }
    emit(&out)
}

fn entry_line(e: &EntryInfo) -> String {
    let mut line = format!("{:<8}  {:>10}  {}", e.kind.as_str(), HumanBytes(e.bytes).to_string(), e.key);
    if e.foreign {
        line.push_str(&format!("  [foreign: v{}/{}]", e.version, e.fingerprint));
    }
    if e.path.is_none() {
        line.push_str("  [memory only]");
    }
    if let Some(problem) = &e.problem {
        line.push_str(&format!("  [BAD: {problem}]"));
    }
    line
}

fn stats(store: &Store) -> Result<ExitCode, String> {
    let entries = store.entries();
    let tally = |pick: &dyn Fn(&EntryInfo) -> bool| {
        let chosen: Vec<&EntryInfo> = entries.iter().filter(|e| pick(e)).collect();
        format!("{} ({})", chosen.len(), HumanBytes(chosen.iter().map(|e| e.bytes).sum()))
    };
    let ns = store.namespace_dir().map_or_else(|| "none (memory only)".to_string(), |p| p.display().to_string());
    let mut out = format!(
        "root:       {}\nnamespace:  {ns}\nversion:    kiln-autotune {}\ndevice:     {}\n",
        where_(store),
        kiln_autotune::VERSION,
        store.fingerprint().describe(),
    );
    out.push_str(&format!("records:    {}\n", tally(&|e| !e.foreign && e.kind == EntryKind::Record)));
    out.push_str(&format!("artifacts:  {}\n", tally(&|e| !e.foreign && e.kind == EntryKind::Artifact)));
    out.push_str(&format!("foreign:    {} of other kiln versions or devices\n", tally(&|e| e.foreign)));
    let bad = entries.iter().filter(|e| !e.foreign && e.problem.is_some()).count();
    if bad > 0 {
        out.push_str(&format!("bad:        {bad} (see `kiln cache verify`; they are rebuilt when next needed)\n"));
    }
    emit(&out)
}

fn verify(store: &Store) -> Result<ExitCode, String> {
    let files = store.namespace_files();
    let bar = ProgressBar::new(files.len() as u64);
    if let Ok(style) = ProgressStyle::with_template("verifying {bar:30} {pos}/{len} {wide_msg}") {
        bar.set_style(style);
    }
    let mut bad = Vec::new();
    for path in &files {
        bar.set_message(path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default());
        if let Err(reason) = store.verify_file(path) {
            bad.push(format!("BAD {}: {reason}\n", path.display()));
        }
        bar.inc(1);
    }
    bar.finish_and_clear();
    let mut out = bad.concat();
    out.push_str(&format!("{} entries checked, {} bad ({})\n", files.len(), bad.len(), where_(store)));
    emit(&out)?;
    Ok(if bad.is_empty() { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

/// Where the cache is, for messages.
fn where_(store: &Store) -> String {
    match store.root() {
        Some(root) => root.display().to_string(),
        None => "memory only: KILN_CACHE_DIR=off or no user cache directory".to_string(),
    }
}

/// Prints to stdout; a closed pipe (`kiln cache ls | head`) ends the output quietly instead of panicking.
fn emit(text: &str) -> Result<ExitCode, String> {
    match io::stdout().lock().write_all(text.as_bytes()) {
        Ok(()) => Ok(ExitCode::SUCCESS),
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => Ok(ExitCode::SUCCESS),
        Err(e) => Err(format!("cannot write to stdout: {e}")),
    }
}
