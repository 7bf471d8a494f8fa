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
        Command::Fetch { alias } => {
            let src = models::source(&alias).ok_or_else(|| {
                models::FetchError::UnknownModel(alias.clone(), models::ALIASES.join(", "))
            })?;
            let path = models::fetch(&src, true)?;
            println!("{}", path.display());
            Ok(())
        }
        Command::Generate(args) => generate::run(args),
        Command::Chat(args) => chat::run(args),
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
