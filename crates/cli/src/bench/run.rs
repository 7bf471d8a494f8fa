//! `pld bench run`: real workloads (Spec-Bench's JSONL format) through plain and speculative greedy
//! decoding in one process, row by row, checking that the outputs are identical and reporting the
//! speedup per category as a table, JSON, a Markdown report and an SVG chart: the decode-only
//! speedup beside time to first token and end-to-end time in both modes.

use super::results::{
    read_json, read_workload, ResultsFile, RowResult, RunSummary, SpeculationReport, Summary,
    TurnTokens, WorkloadRow,
};
use crate::spec::SpecArgs;
use clap::Args;
use drafting::SpecConfig;
use engine::{
    GenerationConfig, GenerationOutput, LoadedModel, Message, PrefixCache, ResponseFormat,
};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

#[derive(Args, Debug)]
pub struct RunArgs {
    #[arg(long, default_value = crate::common::DEFAULT_MODEL)]
    pub model: String,
    #[command(flatten)]
    pub kv: crate::common::KvCacheArgs,
    /// Workload file(s) in Spec-Bench's JSONL format (repeatable).
    #[arg(long, required = true)]
    pub workload: Vec<PathBuf>,
    /// Only these categories (comma-separated).
    #[arg(long, value_delimiter = ',')]
    pub categories: Vec<String>,
    /// The first N rows of each category.
    #[arg(long)]
    pub limit: Option<usize>,
    /// New tokens per turn.
    #[arg(long, default_value_t = 256)]
    pub max_tokens: usize,
    #[arg(long)]
    pub threads: Option<usize>,
    /// Write results.json, report.md and speedup.svg here.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Print the summary as one JSON object.
    #[arg(long)]
    pub json: bool,
    /// Do not run: render the report from rows recorded by an earlier run (its results.json or
    /// results.partial.json), with this command's other settings.
    #[arg(long, value_name = "FILE")]
    pub from_results: Option<PathBuf>,
    /// Every answer constrained (`--json-object`, `--json-schema FILE`), plain and speculative.
    #[command(flatten)]
    pub format: crate::common::FormatArgs,
    /// Each row's later turns start from the cache its earlier turns left, in both modes.
    #[command(flatten)]
    pub prefix_cache: crate::common::PrefixCacheArgs,
    #[command(flatten)]
    pub spec: SpecArgs,
}

fn summarize<'a>(rows: impl Iterator<Item = &'a RowResult>) -> Summary {
    let mut s = Summary::default();
    let (mut plain, mut spec, mut steps, mut dec, mut drafts, mut acc, mut prop) =
        (0.0, 0.0, 0, 0, 0, 0, 0.0);
    for r in rows {
        s.rows += 1;
        s.new_tokens += r.new_tokens;
        plain += r.plain_decode_s;
        spec += r.spec_decode_s;
        steps += r.steps;
        dec += r.decode_tokens;
        drafts += r.draft_tokens;
        acc += r.accepted_tokens;
        prop += r.propose_s;
        s.mismatches += usize::from(!r.identical);
        s.accepted_by_source.add(&r.accepted_by_source);
        s.turns += r.turns.len();
        s.prompt_tokens += r.prompt_tokens;
        s.cached_tokens += r.cached_tokens;
        s.plain_ttft_s += r.plain_ttft_s;
        s.spec_ttft_s += r.spec_ttft_s;
        s.plain_e2e_s += r.plain_e2e_s;
        s.spec_e2e_s += r.spec_e2e_s;
    }
    let div = |a: f64, b: f64| if b > 0.0 { a / b } else { 0.0 };
    // Decode rates count the tokens decode steps produced (the first token of each turn comes
    // from prefill in both modes).
    s.plain_tokens_per_s = div(dec as f64, plain);
    s.spec_tokens_per_s = div(dec as f64, spec);
    s.speedup = div(plain, spec);
    s.mean_accepted_tokens = div(dec as f64, steps as f64);
    s.acceptance_rate = div(acc as f64, drafts as f64);
    s.propose_us_per_step = div(prop * 1e6, steps as f64);
    s.plain_ttft_s = div(s.plain_ttft_s, s.turns as f64);
    s.spec_ttft_s = div(s.spec_ttft_s, s.turns as f64);
    s.e2e_speedup = div(s.plain_e2e_s, s.spec_e2e_s);
    s
}

fn load_rows(args: &RunArgs) -> anyhow::Result<Vec<WorkloadRow>> {
    let mut rows = Vec::new();
    for path in &args.workload {
        rows.extend(read_workload(path)?);
    }
    if !args.categories.is_empty() {
        for c in &args.categories {
            if !rows.iter().any(|r| &r.category == c) {
                anyhow::bail!("no row of category '{c}' in the workloads");
            }
        }
        rows.retain(|r| args.categories.contains(&r.category));
    }
    if let Some(limit) = args.limit {
        let mut seen: BTreeMap<String, usize> = BTreeMap::new();
        rows.retain(|r| {
            let n = seen.entry(r.category.clone()).or_default();
            *n += 1;
            *n <= limit
        });
    }
    if rows.is_empty() {
        anyhow::bail!("the workloads hold no rows to run");
    }
    Ok(rows)
}

fn greedy(max_tokens: usize, speculation: SpecConfig, format: &ResponseFormat) -> GenerationConfig {
    GenerationConfig {
        max_new_tokens: max_tokens,
        speculation,
        response_format: format.clone(),
        ..Default::default()
    }
}

/// One turn's output, with its wall times: to the first text and end to end.
struct Turn {
    out: GenerationOutput,
    ttft_s: f64,
    e2e_s: f64,
}

fn run_one(
    lm: &LoadedModel,
    messages: &[Message],
    config: GenerationConfig,
    prefix: &mut PrefixCache,
) -> anyhow::Result<Turn> {
    let started = Instant::now();
    // A base model (no chat template) gets the turns as plain text, one paragraph each.
    let prompt = match lm.chat_template {
        Some(_) => lm.render_chat(messages)?,
        None => messages
            .iter()
            .map(|m| m.content.as_str())
            .collect::<Vec<_>>()
            .join("\n\n"),
    };
    let ids = lm.tokenizer.encode_prompt(&prompt)?;
    let ctx = lm.model.config.context_len;
    let mut first = None;
    let out = engine::generate_reusing(
        &lm.model,
        &lm.tokenizer,
        ids,
        config,
        ctx,
        Some(prefix),
        |_| {
            first.get_or_insert_with(|| started.elapsed());
            true
        },
    )?;
    let e2e = started.elapsed();
    Ok(Turn {
        out,
        ttft_s: first.unwrap_or(e2e).as_secs_f64(),
        e2e_s: e2e.as_secs_f64(),
    })
}

/// One row: its turns one after another, each in both modes. Each mode keeps its own prefix
/// cache for the row, so a later turn starts from what the earlier ones left in either mode.
fn run_row(
    lm: &LoadedModel,
    row: &WorkloadRow,
    args: &RunArgs,
    spec: &SpecConfig,
    format: &ResponseFormat,
) -> anyhow::Result<RowResult> {
    let mut r = RowResult {
        question_id: row.question_id.clone(),
        category: row.category.clone(),
        identical: true,
        ..Default::default()
    };
    let budget = args.prefix_cache.budget();
    let cache = || PrefixCache::new(lm.model.kv_shape(), budget);
    let (mut plain_cache, mut spec_cache) = (cache(), cache());
    let mut messages = Vec::new();
    for turn in &row.turns {
        messages.push(Message::new("user", turn));
        let plain_config = greedy(args.max_tokens, SpecConfig::off(), format);
        let p = run_one(lm, &messages, plain_config, &mut plain_cache)?;
        let f = run_one(
            lm,
            &messages,
            greedy(args.max_tokens, *spec, format),
            &mut spec_cache,
        )?;
        let (plain, fast) = (&p.out, &f.out);
        r.identical &= plain.token_ids == fast.token_ids;
        r.new_tokens += plain.token_ids.len();
        r.plain_decode_s += plain.decode_time.as_secs_f64();
        r.spec_decode_s += fast.decode_time.as_secs_f64();
        r.prompt_tokens += plain.prompt_token_ids.len();
        r.cached_tokens += plain.cached_tokens;
        r.plain_ttft_s += p.ttft_s;
        r.spec_ttft_s += f.ttft_s;
        r.plain_e2e_s += p.e2e_s;
        r.spec_e2e_s += f.e2e_s;
        r.steps += fast.stats.steps;
        r.decode_tokens += fast.stats.decode_tokens;
        r.draft_tokens += fast.stats.draft_tokens;
        r.accepted_tokens += fast.stats.accepted_tokens;
        r.propose_s += fast.stats.propose_time.as_secs_f64();
        r.drafted_by_source.add(&fast.stats.drafted_by_source);
        r.accepted_by_source.add(&fast.stats.accepted_by_source);
        r.turns.push(TurnTokens {
            prompt_ids: plain.prompt_token_ids.clone(),
            output_ids: plain.token_ids.clone(),
        });
        messages.push(Message::new("assistant", &plain.text));
    }
    Ok(r)
}

pub fn run(args: RunArgs) -> anyhow::Result<()> {
    let threads = crate::common::init_threads(args.threads)?;
    let spec = args.spec.resolve()?;
    if !spec.enabled() {
        anyhow::bail!(
            "bench run compares against speculation: --num-speculative-tokens must be > 0"
        );
    }
    let lm = crate::common::load_model(&args.model, &args.kv)?;
    let results = match &args.from_results {
        Some(path) => recorded_rows(path)?,
        None => run_rows(&lm, &args, &spec)?,
    };
    let mut categories: BTreeMap<String, Summary> = BTreeMap::new();
    for name in results.iter().map(|r| r.category.clone()) {
        categories
            .entry(name.clone())
            .or_insert_with(|| summarize(results.iter().filter(|r| r.category == name)));
    }
    let overall = summarize(results.iter());
    let summary = RunSummary {
        model: lm.name.clone(),
        model_path: lm.path.clone(),
        threads,
        max_tokens: args.max_tokens,
        speculation: SpeculationReport::from(&spec),
        categories,
        overall,
    };
    let table = render_table(&summary.categories, &summary.overall);
    if args.json {
        println!("{}", serde_json::to_string_pretty(&summary)?);
    } else {
        print!("{table}");
    }
    if let Some(dir) = &args.out {
        write_outputs(dir, summary.clone(), results, &table, &args)?;
    }
    if summary.overall.mismatches > 0 {
        anyhow::bail!(
            "{} row(s) differ between plain and speculative decoding",
            summary.overall.mismatches
        );
    }
    Ok(())
}

/// The rows of an earlier run; the mismatches among them are reported as a live run reports them.
fn recorded_rows(path: &Path) -> anyhow::Result<Vec<RowResult>> {
    let file: ResultsFile = read_json(path, "a results file of `pld bench run`")?;
    if file.rows.is_empty() {
        anyhow::bail!("{} holds no recorded rows", path.display());
    }
    for r in file.rows.iter().filter(|r| !r.identical) {
        eprintln!("{}", mismatch_line(r));
    }
    Ok(file.rows)
}

fn mismatch_line(r: &RowResult) -> String {
    format!(
        "MISMATCH: row {} ({}) differs between plain and speculative decoding",
        r.question_id, r.category
    )
}

fn run_rows(lm: &LoadedModel, args: &RunArgs, spec: &SpecConfig) -> anyhow::Result<Vec<RowResult>> {
    let rows = load_rows(args)?;
    let format = args.format.response_format()?;
    // Warm-up: touch the weights and the code paths once.
    run_one(
        lm,
        &[Message::new("user", "Say hello.")],
        greedy(8, *spec, &ResponseFormat::Text),
        &mut PrefixCache::new(lm.model.kv_shape(), 0),
    )?;

    let bar = indicatif::ProgressBar::with_draw_target(
        Some(rows.len() as u64),
        indicatif::ProgressDrawTarget::stderr(),
    );
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{bar:30} {pos}/{len} rows {msg} [{elapsed}<{eta}]",
        )
        .expect("valid template"),
    );
    let mut results = Vec::new();
    for (i, row) in rows.iter().enumerate() {
        bar.set_message(row.category.clone());
        let r = run_row(lm, row, args, spec, &format)?;
        if !r.identical {
            bar.suspend(|| eprintln!("{}", mismatch_line(&r)));
        }
        if bar.is_hidden() {
            // No terminal for the bar: a line per row keeps long runs observable.
            eprintln!(
                "[{}/{}] {} {}: {} tokens, decode plain {:.1}s, speculative {:.1}s; end to end plain {:.1}s, speculative {:.1}s",
                i + 1,
                rows.len(),
                r.category,
                r.question_id,
                r.new_tokens,
                r.plain_decode_s,
                r.spec_decode_s,
                r.plain_e2e_s,
                r.spec_e2e_s
            );
        }
        results.push(r);
        if let Some(dir) = &args.out {
            // Partial results survive an interrupted run.
            std::fs::create_dir_all(dir)?;
            std::fs::write(
                dir.join("results.partial.json"),
                serde_json::to_string(&serde_json::json!({ "rows": &results }))?,
            )?;
        }
        bar.inc(1);
    }
    bar.finish_and_clear();

    Ok(results)
}

fn render_table(categories: &BTreeMap<String, Summary>, overall: &Summary) -> String {
    let sources: Vec<&str> = drafting::Source::ALL.iter().map(|s| s.name()).collect();
    let mut t = format!(
        "| category | rows | new tokens | plain tok/s | spec tok/s | speedup | mean accepted | acceptance | propose us | accepted {} | cached prompt | TTFT plain s | TTFT spec s | e2e plain s | e2e spec s | e2e speedup |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
        sources.join("/")
    );
    let line = |name: &str, s: &Summary| {
        let accepted: Vec<String> = s
            .accepted_by_source
            .iter()
            .map(|(_, n)| n.to_string())
            .collect();
        let accepted = accepted.join("/");
        format!(
            "| {name} | {} | {} | {:.1} | {:.1} | {:.2}x | {:.2} | {:.0}% | {:.2} | {} | {:.0}% | {:.2} | {:.2} | {:.1} | {:.1} | {:.2}x |\n",
            s.rows,
            s.new_tokens,
            s.plain_tokens_per_s,
            s.spec_tokens_per_s,
            s.speedup,
            s.mean_accepted_tokens,
            s.acceptance_rate * 100.0,
            s.propose_us_per_step,
            accepted,
            100.0 * s.cached_tokens as f64 / s.prompt_tokens.max(1) as f64,
            s.plain_ttft_s,
            s.spec_ttft_s,
            s.plain_e2e_s,
            s.spec_e2e_s,
            s.e2e_speedup,
        )
    };
    for (name, s) in categories {
        t.push_str(&line(name, s));
    }
    t.push_str(&line("**overall**", overall));
    t
}

fn write_outputs(
    dir: &Path,
    summary: RunSummary,
    rows: Vec<RowResult>,
    table: &str,
    args: &RunArgs,
) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir)
        .map_err(|e| anyhow::anyhow!("cannot create {}: {e}", dir.display()))?;
    let machine = crate::common::machine_description();
    let workloads: Vec<String> = args
        .workload
        .iter()
        .map(|p| p.display().to_string())
        .collect();
    let s = &summary.speculation;
    let report = format!(
        "# pld benchmark\n\n- date: {}\n- machine: {machine}\n- model: {} ({})\n- threads: {}\n- workloads: {}\n- rows per category: {}\n- new tokens per turn: {}\n- speculation: {}, K = {}, n-gram {}..{}, match policy {}, adaptive draft length {}\n- speedup: total plain decode time / total speculative decode time (greedy; outputs checked identical)\n- cached prompt: the share of prompt tokens served from the prefix cache (a row's later turns reuse its earlier ones, in both modes)\n- TTFT: mean wall time per turn to the first text; e2e: total wall time of all turns (tokenizing, prefill, decode); e2e speedup: plain e2e / speculative e2e\n\n{table}\n![speedup per category](speedup.svg)\n",
        utc_now(),
        summary.model,
        summary.model_path.display(),
        summary.threads,
        workloads.join(", "),
        args.limit.map(|l| format!("first {l}")).unwrap_or_else(|| "all".into()),
        args.max_tokens,
        s.method,
        s.num_speculative_tokens,
        s.prompt_lookup_min,
        s.prompt_lookup_max,
        s.match_policy,
        s.adaptive,
    );
    std::fs::write(dir.join("report.md"), report)?;
    draw_chart(
        &dir.join("speedup.svg"),
        &summary.categories,
        &summary.model,
    )?;
    let file = ResultsFile {
        summary: Some(summary),
        rows,
    };
    std::fs::write(
        dir.join("results.json"),
        serde_json::to_string_pretty(&file)?,
    )?;
    Ok(())
}

/// The current time in UTC, to the minute.
fn utc_now() -> String {
    time::OffsetDateTime::now_utc()
        .format(time::macros::format_description!(
            "[year]-[month]-[day] [hour]:[minute] UTC"
        ))
        .unwrap_or_default()
}

/// A bar per category with the 1.0 line marked.
fn draw_chart(
    path: &Path,
    categories: &BTreeMap<String, Summary>,
    model: &str,
) -> anyhow::Result<()> {
    use plotters::prelude::*;
    register_font()?;
    let names: Vec<&String> = categories.keys().collect();
    let values: Vec<f64> = categories.values().map(|s| s.speedup).collect();
    let top = values.iter().copied().fold(1.0f64, f64::max) * 1.15;
    let root =
        SVGBackend::new(path, ((100 + 90 * names.len() as u32).max(640), 480)).into_drawing_area();
    let err = |e: &dyn std::fmt::Display| anyhow::anyhow!("drawing the chart: {e}");
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!("pld speedup over plain decoding ({model})"),
            ("sans-serif", 18),
        )
        .margin(12)
        .x_label_area_size(70)
        .y_label_area_size(50)
        .build_cartesian_2d((0..names.len()).into_segmented(), 0f64..top)
        .map_err(|e| err(&e))?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(names.len())
        .x_label_formatter(&|v| match v {
            SegmentValue::CenterOf(i) => names.get(*i).map(|s| s.to_string()).unwrap_or_default(),
            _ => String::new(),
        })
        .y_desc("speedup (x)")
        .draw()
        .map_err(|e| err(&e))?;
    chart
        .draw_series(
            Histogram::vertical(&chart)
                .style(RGBColor(66, 110, 180).filled())
                .margin(12)
                .data(values.iter().enumerate().map(|(i, v)| (i, *v))),
        )
        .map_err(|e| err(&e))?;
    chart
        .draw_series(LineSeries::new(
            [(SegmentValue::Exact(0), 1.0), (SegmentValue::Last, 1.0)],
            RED.stroke_width(2),
        ))
        .map_err(|e| err(&e))?;
    root.present().map_err(|e| err(&e))?;
    Ok(())
}

/// plotters lays text out with a real font: use the system's DejaVu Sans (or Liberation Sans).
fn register_font() -> anyhow::Result<()> {
    static DONE: std::sync::OnceLock<Result<(), String>> = std::sync::OnceLock::new();
    DONE.get_or_init(|| {
        let candidates = [
            "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
            "/usr/share/fonts/TTF/DejaVuSans.ttf",
            "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
        ];
        let bytes = candidates
            .iter()
            .find_map(|p| std::fs::read(p).ok())
            .ok_or_else(|| {
                format!(
                    "no font found for the chart (looked at {})",
                    candidates.join(", ")
                )
            })?;
        let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
        plotters::style::register_font("sans-serif", plotters::style::FontStyle::Normal, bytes)
            .map_err(|_| "the chart font is not a valid TrueType file".to_string())
    })
    .clone()
    .map_err(|e| anyhow::anyhow!(e))
}
