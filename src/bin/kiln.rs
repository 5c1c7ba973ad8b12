//! `kiln`: the command line. Today it inspects and ships the tuning and compile cache (`kiln cache ...`).
//!
//! Owns: argument parsing and how results are shown. Deliberately not: any cache logic (all of it is
//! `kiln_autotune::Store`, so the binary and the library can never disagree about what an entry is) nor tuning
//! (`kiln tune` needs a backend and is added beside `Cache`). Every command works on `Store::global()`, so it
//! sees the cache a program run with the same `KILN_CACHE_DIR` sees.

use std::io::{self, Write as _};
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use indicatif::{HumanBytes, ProgressBar, ProgressStyle};
use kiln_autotune::{EntryInfo, EntryKind, Store};

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
    /// Write every record and artifact of this namespace to one bundle file.
    Export { file: PathBuf },
    /// Store every entry of a bundle made by this kiln version on this kind of device.
    Import { file: PathBuf },
    /// Check every entry of this namespace; exit code 1 if any is bad.
    Verify,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Cache(command) => cache(command, Store::global()),
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
        CacheCommand::Export { file } => {
            let s = store.export_bundle(&file).map_err(|e| e.to_string())?;
            let text = format!(
                "exported {} records and {} artifacts ({}) to {}\n",
                s.records,
                s.artifacts,
                HumanBytes(s.bytes),
                file.display()
            );
            emit(&text)
        }
        CacheCommand::Import { file } => {
            let s = store.import_bundle(&file).map_err(|e| e.to_string())?;
            emit(&format!("imported {} records and {} artifacts from {}\n", s.records, s.artifacts, file.display()))
        }
        CacheCommand::Verify => verify(store),
    }
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
