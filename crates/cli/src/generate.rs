//! `pld generate`: one prompt in, text streamed out (or one JSON object), with `--compare` to run
//! plain and speculative greedy decoding side by side.

use crate::bench::results::SpeculationReport;
use crate::common::{FormatArgs, RunArgs, SamplingArgs};
use crate::spec::SpecArgs;
use clap::Args;
use drafting::SpecConfig;
use engine::{GenerationConfig, GenerationOutput, GenerationSettings, LoadedModel, Message};
use serde_json::json;
use std::io::Write;

#[derive(Args, Debug)]
pub struct GenerateArgs {
    /// Model alias (fetched on first use) or path to a .gguf file.
    #[arg(long, default_value = crate::common::DEFAULT_MODEL)]
    pub model: String,
    #[command(flatten)]
    pub kv: crate::common::KvCacheArgs,
    /// The prompt text.
    #[arg(
        long,
        conflicts_with = "prompt_file",
        required_unless_present = "prompt_file"
    )]
    pub prompt: Option<String>,
    /// Read the prompt from a file.
    #[arg(long)]
    pub prompt_file: Option<std::path::PathBuf>,
    /// Wrap the prompt as a user message in the model's chat template.
    #[arg(long)]
    pub chat: bool,
    /// System message (with --chat).
    #[arg(long, requires = "chat")]
    pub system: Option<String>,
    #[arg(long, default_value_t = 256)]
    pub max_tokens: usize,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    /// Stop when this text is produced (repeatable).
    #[arg(long)]
    pub stop: Vec<String>,
    #[command(flatten)]
    pub run: RunArgs,
    /// Print one JSON object instead of streaming text.
    #[arg(long)]
    pub json: bool,
    /// Run plain greedy and speculative greedy on the same prompt and compare them.
    #[arg(long)]
    pub compare: bool,
    #[command(flatten)]
    pub format: FormatArgs,
    #[command(flatten)]
    pub spec: SpecArgs,
}

impl GenerateArgs {
    /// The settings, checked and defaulted by the engine as the server's and Python's are.
    pub fn config(&self, speculation: SpecConfig) -> anyhow::Result<GenerationConfig> {
        crate::common::generation_config(
            GenerationSettings {
                max_tokens: Some(self.max_tokens),
                sampling: self.sampling.settings(),
                stop: self.stop.clone(),
                response_format: self.format.response_format()?,
                ..Default::default()
            },
            speculation,
        )
    }

    fn prompt_text(&self, lm: &LoadedModel) -> anyhow::Result<String> {
        let raw = match (&self.prompt, &self.prompt_file) {
            (Some(p), _) => p.clone(),
            (None, Some(f)) => std::fs::read_to_string(f)
                .map_err(|e| anyhow::anyhow!("cannot read --prompt-file {}: {e}", f.display()))?,
            (None, None) => anyhow::bail!("give --prompt or --prompt-file"),
        };
        if !self.chat {
            return Ok(raw);
        }
        let mut messages = Vec::new();
        if let Some(s) = &self.system {
            messages.push(Message::new("system", s));
        }
        messages.push(Message::new("user", &raw));
        Ok(lm.render_chat(&messages)?)
    }
}

/// `--json`'s `speculation` object: the settings and what speculation did.
#[derive(serde::Serialize)]
struct SpeculationOutput {
    #[serde(flatten)]
    settings: SpeculationReport,
    steps: usize,
    draft_tokens: usize,
    accepted_tokens: usize,
    acceptance_rate: f64,
    mean_accepted_tokens: f64,
    propose_us_per_step: f64,
    drafted_by_source: engine::BySource,
    accepted_by_source: engine::BySource,
}

pub fn output_json(out: &GenerationOutput, spec: &SpecConfig) -> serde_json::Value {
    let s = &out.stats;
    let speculation = SpeculationOutput {
        settings: SpeculationReport::from(spec),
        steps: s.steps,
        draft_tokens: s.draft_tokens,
        accepted_tokens: s.accepted_tokens,
        acceptance_rate: s.acceptance_rate(),
        mean_accepted_tokens: s.mean_accepted_tokens(),
        propose_us_per_step: s.propose_us_per_step(),
        drafted_by_source: s.drafted_by_source,
        accepted_by_source: s.accepted_by_source,
    };
    json!({
        "text": out.text,
        "token_ids": out.token_ids,
        "prompt_token_ids": out.prompt_token_ids,
        "finish_reason": out.finish_reason,
        "usage": {
            "prompt_tokens": out.prompt_token_ids.len(),
            "completion_tokens": out.token_ids.len(),
            "prompt_tokens_details": {"cached_tokens": out.cached_tokens},
        },
        "timing": {
            "prefill_ms": out.prefill_time.as_secs_f64() * 1e3,
            "decode_ms": out.decode_time.as_secs_f64() * 1e3,
            "prefill_tokens_per_s": out.prefill_tokens_per_s(),
            "decode_tokens_per_s": out.decode_tokens_per_s(),
        },
        "speculation": speculation,
    })
}

/// One generation's figures in a line (`generate`'s summary, `chat`'s `/stats`).
pub(crate) fn summary_line(out: &GenerationOutput) -> String {
    format!(
        "prompt {} tokens, {} cached, {} new tokens ({:?}); prefill {:.1} tok/s, decode {:.1} tok/s; {:.2} tokens/step, {} of {} drafts accepted",
        out.prompt_token_ids.len(),
        out.cached_tokens,
        out.token_ids.len(),
        out.finish_reason,
        out.prefill_tokens_per_s(),
        out.decode_tokens_per_s(),
        out.stats.mean_accepted_tokens(),
        out.stats.accepted_tokens,
        out.stats.draft_tokens,
    )
}

pub fn run(args: GenerateArgs) -> anyhow::Result<()> {
    let threads = crate::common::init_threads(args.run.threads)?;
    let spec = args.spec.resolve()?;
    let lm = crate::common::load_model(&args.model, &args.kv)?;
    let prompt = args.prompt_text(&lm)?;
    let ctx = args.run.ctx_size.unwrap_or(lm.model.config.context_len);
    if args.compare {
        return compare(&args, &lm, &prompt, ctx, spec, threads);
    }
    let config = args.config(spec)?;
    let stdout = std::io::stdout();
    let out = lm.generate_text(&prompt, config, ctx, |t| {
        if !args.json {
            let mut o = stdout.lock();
            let _ = o.write_all(t.as_bytes());
            let _ = o.flush();
        }
    })?;
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&output_json(&out, &spec))?
        );
    } else {
        println!();
        eprintln!("{}", summary_line(&out));
    }
    Ok(())
}

fn compare(
    args: &GenerateArgs,
    lm: &LoadedModel,
    prompt: &str,
    ctx: usize,
    spec: SpecConfig,
    threads: usize,
) -> anyhow::Result<()> {
    if args.sampling.temperature > 0.0 {
        anyhow::bail!("--compare runs greedy decoding: drop --temperature");
    }
    if !spec.enabled() {
        anyhow::bail!("--compare needs speculation on (--num-speculative-tokens > 0)");
    }
    let plain_spec = SpecConfig::off();
    // A short warm-up so the first timed run does not pay for page faults.
    let mut warm = args.config(plain_spec)?;
    warm.max_new_tokens = 4;
    lm.generate_text(prompt, warm, ctx, |_| {})?;
    let baseline = lm.generate_text(prompt, args.config(plain_spec)?, ctx, |_| {})?;
    let speculative = lm.generate_text(prompt, args.config(spec)?, ctx, |_| {})?;
    let identical = baseline.token_ids == speculative.token_ids;
    let speedup =
        baseline.decode_time.as_secs_f64() / speculative.decode_time.as_secs_f64().max(1e-9);
    if args.json {
        let v = json!({
            "model": lm.name,
            "threads": threads,
            "baseline": output_json(&baseline, &plain_spec),
            "speculative": output_json(&speculative, &spec),
            "identical": identical,
            "speedup": speedup,
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        println!("{}", speculative.text);
        eprintln!("plain:       {}", summary_line(&baseline));
        eprintln!("speculative: {}", summary_line(&speculative));
        eprintln!("identical: {identical}, speedup: {speedup:.2}x");
    }
    if !identical {
        anyhow::bail!("speculative output differs from plain decoding");
    }
    Ok(())
}
