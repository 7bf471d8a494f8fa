//! What every command needs: the default model, loading a model by alias or path, and the size of
//! the compute thread pool.

/// The model `generate`, `serve` and `bench run` use when none is named.
pub const DEFAULT_MODEL: &str = "qwen-coder-1.5b";

/// Sets the number of compute threads (default: all cores).
pub fn init_threads(threads: Option<usize>) -> anyhow::Result<usize> {
    let n = threads.unwrap_or_else(|| {
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
    });
    if n == 0 {
        anyhow::bail!("--threads must be at least 1");
    }
    engine::kernels::pool::init(n);
    Ok(n)
}

/// Loads a model given by alias (fetched on first use) or path.
pub fn load_model(spec: &str) -> anyhow::Result<engine::LoadedModel> {
    let path = models::resolve_model(spec)?;
    Ok(engine::LoadedModel::load(&path)?)
}

/// The CPU, its cores and the kernels pld picked on it, for benchmark reports.
pub fn machine_description() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|v| v.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    format!("{cpu}, {cores} cores, kernels {:?}", engine::kernels::isa())
}

/// `--json-schema FILE` / `--json-object` / `--grammar FILE`: structured output for `generate`
/// and `bench run`.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct FormatArgs {
    /// Constrain the output to JSON valid against the JSON Schema in this file.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["json_object", "grammar"])]
    pub json_schema: Option<std::path::PathBuf>,
    /// Constrain the output to a JSON object.
    #[arg(long, conflicts_with = "grammar")]
    pub json_object: bool,
    /// Constrain the output to the grammar in this file (llama.cpp's GBNF; the start rule is
    /// `root`).
    #[arg(long, value_name = "FILE")]
    pub grammar: Option<std::path::PathBuf>,
}

impl FormatArgs {
    /// The output format asked for (free text when neither flag is given).
    pub fn response_format(&self) -> anyhow::Result<engine::ResponseFormat> {
        if let Some(path) = &self.json_schema {
            let text = std::fs::read_to_string(path).map_err(|e| {
                anyhow::anyhow!("cannot read --json-schema {}: {e}", path.display())
            })?;
            let schema: serde_json::Value = serde_json::from_str(&text).map_err(|e| {
                anyhow::anyhow!("--json-schema {} is not JSON: {e}", path.display())
            })?;
            return Ok(engine::ResponseFormat::JsonSchema { schema });
        }
        if let Some(path) = &self.grammar {
            let grammar = std::fs::read_to_string(path)
                .map_err(|e| anyhow::anyhow!("cannot read --grammar {}: {e}", path.display()))?;
            return Ok(engine::ResponseFormat::Gbnf { grammar });
        }
        Ok(if self.json_object {
            engine::ResponseFormat::JsonObject
        } else {
            engine::ResponseFormat::Text
        })
    }
}
