//! `pld`: the command line of the pld inference engine (fetch, generate, serve, bench).

mod bench;
mod drafting_study;
mod generate;
mod load;
mod serve;
mod spec;
mod workload;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "pld",
    version,
    about = "LLM inference with prompt lookup decoding"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Download a known model (by alias) into $PLD_MODELS and print its path.
    Fetch {
        /// One of: smollm2-135m, qwen-coder-0.5b, qwen-coder-1.5b.
        alias: String,
    },
    /// Generate text from a prompt.
    Generate(generate::GenerateArgs),
    /// Serve an OpenAI-compatible HTTP API with continuous batching.
    Serve(serve::ServeArgs),
    /// Benchmarks.
    Bench {
        #[command(subcommand)]
        which: bench::BenchCommand,
    },
}

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
    let path = engine::fetch::resolve_model(spec)?;
    Ok(engine::LoadedModel::load(&path)?)
}

fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Fetch { alias } => {
            let src = engine::fetch::source(&alias).ok_or_else(|| {
                engine::EngineError::UnknownModel(alias.clone(), engine::fetch::ALIASES.join(", "))
            })?;
            let path = engine::fetch::fetch(&src, true)?;
            println!("{}", path.display());
            Ok(())
        }
        Command::Generate(args) => generate::run(args),
        Command::Serve(args) => serve::run(args),
        Command::Bench { which } => bench::run(which),
    }
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            for cause in e.chain().skip(1) {
                eprintln!("  caused by: {cause}");
            }
            ExitCode::FAILURE
        }
    }
}
