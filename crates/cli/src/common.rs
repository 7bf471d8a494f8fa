//! What every command needs: the default model, loading a model by alias or path, and the size of
//! the compute thread pool; and the flags several commands share: the KV cache's number type,
//! the sampling settings, the output format, the prefix cache and byte counts.

use engine::SamplingSettings;

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

/// Loads a model given by alias (fetched on first use) or path, its KV caches as `kv` says.
pub fn load_model(spec: &str, kv: &KvCacheArgs) -> anyhow::Result<engine::LoadedModel> {
    let path = models::resolve_model(spec)?;
    let mut lm = engine::LoadedModel::load(&path)?;
    if let Some(dtype) = kv.kv_cache_dtype.dtype() {
        lm.model.set_kv_dtype(dtype)?;
    }
    Ok(lm)
}

/// `--kv-cache-dtype`: what the KV cache stores keys and values as.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct KvCacheArgs {
    /// Number type of the cached keys and values: bf16 and f16 take half the memory and half
    /// the bytes attention reads at long context (bf16 keeps f32's range, and on AMX its
    /// attention runs on tiles; f16 is llama.cpp's default cache); f32 keeps every digit the
    /// pass computed; q8_0 takes about half of bf16's (blocks of 32 int8s and an f16 scale,
    /// as llama.cpp's `-ctk q8_0 -ctv q8_0`; heads of a multiple of 32 dimensions). auto: bf16
    /// where attention over it is the faster (AMX tiles, AVX-512), else f32.
    #[arg(long, value_name = "DTYPE", default_value = "auto", value_parser = kv_setting())]
    pub kv_cache_dtype: KvSetting,
}

/// A `--kv-cache-dtype` value: a type (`engine::kernels::KvDtype`, which lists and parses the
/// types), or `None` for `auto`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KvSetting(pub Option<engine::kernels::KvDtype>);

/// The parser of `--kv-cache-dtype`: the settings the engine lists (shown by `--help`).
fn kv_setting() -> impl clap::builder::TypedValueParser<Value = KvSetting> {
    use clap::builder::TypedValueParser;
    clap::builder::PossibleValuesParser::new(engine::kernels::KvDtype::SETTINGS).map(|s| {
        KvSetting(engine::kernels::KvDtype::setting(&s).expect("one of the listed settings"))
    })
}

impl KvSetting {
    /// The number type asked for, `None` for the model's default.
    pub fn dtype(self) -> Option<engine::kernels::KvDtype> {
        self.0
    }

    /// As the flag spells it.
    pub fn name(self) -> &'static str {
        self.0.map_or("auto", engine::kernels::KvDtype::name)
    }
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
    format!(
        "{cpu}, {cores} cores, kernels {:?}, prompt rows {}",
        engine::kernels::isa(),
        engine::kernels::prompt_arithmetic()
    )
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

/// `--prefix-cache-bytes SIZE`: how much the prefix cache may hold (`serve`, `chat`, `bench`).
#[derive(clap::Args, Debug, Clone, Default)]
pub struct PrefixCacheArgs {
    /// Bytes of keys and values kept across requests and turns for reuse, as a number with an
    /// optional K, M or G (powers of 1024); 0 turns the prefix cache off. Default: an eighth of
    /// the machine's memory.
    #[arg(long, value_name = "SIZE", value_parser = parse_bytes)]
    pub prefix_cache_bytes: Option<usize>,
}

/// The prefix cache's directory, for the commands whose cache lives past one process (`serve`,
/// `chat`).
#[derive(clap::Args, Debug)]
pub struct PrefixCacheDirArgs {
    #[command(flatten)]
    pub memory: PrefixCacheArgs,
    /// Also keep the prefix cache's blocks as files in this directory, so that a restarted
    /// process starts from the prefixes the last one computed (checked on read; one process per
    /// directory).
    #[arg(long, value_name = "DIR")]
    pub prefix_cache_dir: Option<std::path::PathBuf>,
    /// Bytes the directory may hold (least recently used go first), as a number with an optional
    /// K, M or G.
    #[arg(long, value_name = "SIZE", default_value_t = ByteSize(engine::DEFAULT_PREFIX_CACHE_DIR_BYTES))]
    pub prefix_cache_dir_bytes: ByteSize,
}

impl PrefixCacheArgs {
    pub fn budget(&self) -> usize {
        self.prefix_cache_bytes
            .unwrap_or_else(engine::prefix_cache::default_budget_bytes)
    }
}

impl PrefixCacheDirArgs {
    pub fn budget(&self) -> usize {
        self.memory.budget()
    }

    /// The prefix cache these flags ask for, for `lm`'s keys and values.
    pub fn open(&self, lm: &engine::LoadedModel) -> anyhow::Result<engine::PrefixCache> {
        engine::PrefixCache::open(
            &lm.path,
            lm.model.kv_shape(),
            self.budget(),
            self.prefix_cache_dir.as_deref(),
            self.prefix_cache_dir_bytes.0,
        )
    }
}

/// A byte count given as a flag (`parse_bytes`), written in the largest unit that divides it
/// (`16G`), as `--help` shows a default.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ByteSize(pub u64);

impl std::str::FromStr for ByteSize {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        parse_bytes(s).map(|n| ByteSize(n as u64))
    }
}

impl std::fmt::Display for ByteSize {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let n = self.0;
        for (unit, shift) in [("G", 30), ("M", 20), ("K", 10)] {
            if n != 0 && n.trailing_zeros() >= shift {
                return write!(f, "{}{unit}", n >> shift);
            }
        }
        write!(f, "{n}")
    }
}

/// `--ctx-size` and `--threads`: the commands that run a model in this process alone (`generate`,
/// `chat`).
#[derive(clap::Args, Debug, Clone)]
pub struct RunArgs {
    /// KV cache size in tokens: the longest prompt and output, or conversation (default: the
    /// model's context length).
    #[arg(long, alias = "max-model-len")]
    pub ctx_size: Option<usize>,
    /// Compute threads (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
}

/// The sampling flags of `generate` and `chat`: the engine's `SamplingSettings`, each with the
/// engine's default but the temperature, which is greedy here.
#[derive(clap::Args, Debug, Clone)]
pub struct SamplingArgs {
    /// 0 means greedy decoding.
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,
    #[arg(long, default_value_t = SamplingSettings::DEFAULT_TOP_P)]
    pub top_p: f32,
    /// -1 or 0 disables top-k.
    #[arg(long, default_value_t = SamplingSettings::DEFAULT_TOP_K, allow_negative_numbers = true)]
    pub top_k: i64,
    #[arg(long, default_value_t = SamplingSettings::DEFAULT_MIN_P)]
    pub min_p: f32,
    #[arg(long, default_value_t = SamplingSettings::DEFAULT_REPETITION_PENALTY)]
    pub repetition_penalty: f32,
    /// Seed for sampling.
    #[arg(long)]
    pub seed: Option<u64>,
}

impl SamplingArgs {
    pub fn settings(&self) -> SamplingSettings {
        SamplingSettings {
            temperature: Some(self.temperature),
            top_p: Some(self.top_p),
            top_k: Some(self.top_k),
            min_p: Some(self.min_p),
            repetition_penalty: Some(self.repetition_penalty),
            seed: self.seed,
        }
    }
}

/// A byte count such as `0`, `65536`, `512M` or `2G`.
pub fn parse_bytes(s: &str) -> Result<usize, String> {
    let t = s.trim();
    let (digits, unit) = match t.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
        Some((i, _)) => (&t[..i], t[i..].trim()),
        None => (t, ""),
    };
    let n: usize = digits
        .parse()
        .map_err(|_| format!("'{s}' is not a byte count (a number with an optional K, M or G)"))?;
    let shift = match unit.to_ascii_uppercase().trim_end_matches(['B', 'I']) {
        "" => 0,
        "K" => 10,
        "M" => 20,
        "G" => 30,
        _ => return Err(format!("'{s}': unknown unit '{unit}' (K, M or G)")),
    };
    n.checked_mul(1 << shift)
        .ok_or_else(|| format!("'{s}' is too large"))
}

/// The generation settings of a command's flags, checked and defaulted by the engine
/// (`GenerationSettings::config`, as the server's and Python's are); the flags' speculation
/// settings are already merged (`speculation`). An error reads as the engine's own.
pub fn generation_config(
    settings: engine::GenerationSettings,
    speculation: drafting::SpecConfig,
) -> anyhow::Result<engine::GenerationConfig> {
    settings
        .config(&speculation, usize::MAX, "max_new_tokens")
        .map_err(|e| engine::EngineError::InvalidConfig(e.message).into())
}

#[cfg(test)]
mod tests {
    use super::{parse_bytes, ByteSize};

    #[test]
    fn byte_sizes_show_their_largest_unit() {
        assert_eq!(ByteSize(16 << 30).to_string(), "16G");
        assert_eq!(ByteSize(3 << 20).to_string(), "3M");
        assert_eq!(ByteSize(4097).to_string(), "4097");
        assert_eq!(ByteSize(0).to_string(), "0");
        assert_eq!("16G".parse::<ByteSize>(), Ok(ByteSize(16 << 30)));
    }

    #[test]
    fn byte_counts_parse_with_units() {
        assert_eq!(parse_bytes("0"), Ok(0));
        assert_eq!(parse_bytes("4096"), Ok(4096));
        assert_eq!(parse_bytes("512M"), Ok(512 << 20));
        assert_eq!(parse_bytes("2G"), Ok(2 << 30));
        assert_eq!(parse_bytes("3GiB"), Ok(3 << 30));
        assert_eq!(parse_bytes("64k"), Ok(64 << 10));
        assert!(parse_bytes("lots")
            .unwrap_err()
            .contains("not a byte count"));
        assert!(parse_bytes("5T").unwrap_err().contains("unknown unit"));
    }
}
