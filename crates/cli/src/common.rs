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
