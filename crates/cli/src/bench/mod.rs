//! `pld bench`: the benchmarks, one file per subcommand, and the typed JSON files they write and
//! read (`results`).

use clap::Subcommand;

pub mod drafting;
pub mod editing;
pub mod forward;
pub mod infill;
pub mod replay;
pub mod results;
pub mod run;
pub mod serve;

#[derive(Subcommand, Debug)]
pub enum BenchCommand {
    /// Time forward passes over 1, 2, 4, 8 and 16 new tokens.
    Forward(forward::ForwardArgs),
    /// Run workloads through plain and speculative decoding and report the speedup per category.
    Run(run::RunArgs),
    /// Replay recorded outputs through the drafter to compare drafting settings offline.
    Drafting(drafting::DraftingArgs),
    /// Load-test the HTTP server with and without speculation at several concurrency levels.
    Serve(serve::ServeArgs),
    /// Replay recorded API requests (`pld serve --record-requests`) through the server, plain
    /// and speculative, or against another server.
    Replay(replay::ReplayArgs),
    /// Replay an editing session as completion plugins send it (`/infill` at each line and word),
    /// through the server, plain and speculative, or against another server.
    Infill(infill::InfillArgs),
}

pub fn run(cmd: BenchCommand) -> anyhow::Result<()> {
    match cmd {
        BenchCommand::Forward(a) => forward::run(a),
        BenchCommand::Run(a) => run::run(a),
        BenchCommand::Drafting(a) => drafting::run(a),
        BenchCommand::Serve(a) => serve::run(a),
        BenchCommand::Replay(a) => replay::run(a),
        BenchCommand::Infill(a) => infill::run(a),
    }
}
