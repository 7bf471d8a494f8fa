//! Fill-in-the-middle for code completion in an editor: llama-server's `POST /infill` (what
//! llama.vim and llama.vscode send at each keystroke) and OpenAI's `suffix` on `/v1/completions`.
//!
//! Both build the model's fill-in-the-middle prompt (`engine::fim`) as token ids and go the way
//! every text completion goes: `validate::tokens` checks it into a `ValidRequest`, `submit` runs
//! it, `Outputs` reads its output. `/infill` answers in llama-server's shapes: one object with
//! `content`, `stop_type`, `tokens_predicted`, `tokens_evaluated`, `tokens_cached` and `timings`
//! (or the `response_fields` asked for, by their `a/b` paths), or, streamed, one event per piece
//! of text and that object last. Its `t_max_predict_ms` and `n_indent` become the scheduler's
//! `Limits`; its `n_predict` is `max_tokens` (0 prefills the prompt for the cache and generates
//! one token: pld generates at least one).
//!
//! A model without fill-in-the-middle tokens answers both with a 400 saying so.

use super::error::ApiError;
use super::output::{Finish, Outputs, Piece, Usage};
use super::request::{self, json_body, missing, read_checked, Shared, Stop, TopLevelSpec};
use super::stream::{data, keep_alive, Chunk};
use super::validate::{self, Names, Settings};
use super::{answer_model, finish, record, submit};
use crate::scheduler::Limits;
use crate::tenant::Tenant;
use crate::AppState;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::sse::Sse;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use engine::fim::{indent_cut, split as fim_split, Chunk as FileChunk, FimPrompt, FimTokens, Hole};
use engine::SamplingSettings;
use futures_util::stream::{self, StreamExt};
use serde::Deserialize;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The fields of `/infill` besides the sampling settings and `Shared`, as llama-server reads
/// them.
#[derive(Deserialize)]
pub(super) struct InfillFields {
    /// The text before the cursor's line (required).
    pub input_prefix: Option<String>,
    /// The text after the cursor (required).
    pub input_suffix: Option<String>,
    /// Chunks of other files, oldest first.
    pub input_extra: Option<Vec<ExtraChunk>>,
    /// The cursor's line up to the cursor: it follows `input_prefix`.
    pub prompt: Option<String>,
    /// Tokens to generate at most; negative: no cap but the context.
    pub n_predict: Option<i64>,
    /// The same, under OpenAI's name (`n_predict` wins).
    pub max_tokens: Option<i64>,
    pub stop: Option<Stop>,
    /// End the completion at a line indented less than this.
    pub n_indent: Option<usize>,
    /// End the completion at the first newline after this many milliseconds of generating
    /// (0 or less: off).
    pub t_max_predict_ms: Option<i64>,
    /// Answer only these fields (`timings/prompt_n` names a nested one).
    pub response_fields: Option<Vec<String>>,
}

/// One chunk of `input_extra` (llama.vim also sends its `time`, which nothing reads).
#[derive(Deserialize)]
pub(super) struct ExtraChunk {
    pub text: String,
    pub filename: Option<String>,
}

/// The name a chunk without one gets, as in llama-server.
const UNNAMED_CHUNK: &str = "tmp";

/// Tokens kept free for the output when the request sets no cap: a longer prompt is cut to fit
/// the context less this many.
const OUTPUT_ROOM: usize = 256;

/// Fields llama.vim and llama.vscode always send that change nothing in pld; any other value is
/// refused like other fields pld cannot honour.
fn neutral(field: &str, v: &Value) -> Option<bool> {
    Some(match field {
        // pld has no slots: every request joins the one batch.
        "id_slot" => v.is_null() || v.is_i64(),
        // The prefix cache serves every request.
        "cache_prompt" => v.is_null() || v.is_boolean(),
        // llama.cpp's sampler order: pld's is fixed (its `infill` sampler has no counterpart).
        "samplers" => {
            v.is_null()
                || v.is_string()
                || v.as_array().is_some_and(|a| a.iter().all(Value::is_string))
        }
        // llama-server reads it and does nothing with it either.
        "t_max_prompt_ms" => v.is_null() || v.is_number(),
        _ => return request::neutral(field, v),
    })
}

/// The model's fill-in-the-middle tokens, or the 400 saying it has none (naming `field`).
fn fim_tokens(state: &AppState, field: &str) -> Result<FimTokens, ApiError> {
    state.lm.fim.clone().ok_or_else(|| {
        ApiError::bad_request(
            format!(
                "this model ({}) has no fill-in-the-middle tokens, so it cannot fill in the \
                 middle (/infill, suffix); serve a code model that has them, such as \
                 qwen-coder-1.5b",
                state.lm.name
            ),
            Some(field),
        )
        .code("fim_not_supported")
    })
}

/// The texts of the model's fill-in-the-middle tokens, and of its BOS where prompts do not open
/// with it (a separator between documents, Qwen's `<|endoftext|>`, with which such a model ends
/// a middle): stop strings, since a model that writes one has finished the middle.
fn markers(state: &AppState, fim: &FimTokens) -> Vec<String> {
    let tok = &state.lm.tokenizer;
    let separator = tok.bos.filter(|_| !tok.add_bos);
    fim.all()
        .into_iter()
        .chain(separator)
        .map(|id| String::from_utf8_lossy(tok.token_bytes(id)).into_owned())
        .filter(|t| !t.is_empty())
        .collect()
}

/// The texts of a request's hole, owned (`Hole` borrows them on the tokenizing thread).
struct HoleText {
    prefix: String,
    suffix: String,
    middle: String,
    extra: Vec<FileChunk>,
}

impl HoleText {
    /// `before`, all the text before the cursor, split where the written middle starts
    /// (`fim::split`: the cursor's line and the lines above it up to an anchor go after the
    /// middle token, so that a keystroke leaves the suffix where the last prompt had it).
    /// A long prefix starts at a start anchor (`fim::split::prefix_start`).
    fn split(mut before: String, suffix: String, extra: Vec<FileChunk>) -> HoleText {
        let middle = before.split_off(fim_split::written_middle_start(&before));
        before.drain(..fim_split::prefix_start(&before));
        HoleText {
            prefix: before,
            suffix,
            middle,
            extra,
        }
    }

    /// `before` as the prefix, all of it, with no written middle: llama-server's layout.
    fn prefix_only(before: String, suffix: String) -> HoleText {
        HoleText {
            prefix: before,
            suffix,
            middle: String::new(),
            extra: Vec::new(),
        }
    }
}

/// The fill-in-the-middle prompt, tokenized off the async workers, cut to fit the context less
/// `output` tokens; with a written middle, its end healed (`heal`): the prompt less the tokens
/// taken back, and their text.
async fn fim_prompt(
    state: &Arc<AppState>,
    fim: FimTokens,
    text: HoleText,
    output: usize,
    field: &str,
) -> Result<(FimPrompt, Option<String>), ApiError> {
    let ctx = state.config.max_model_len;
    let budget = ctx.saturating_sub(output.min(ctx / 2)).max(1);
    let lm = state.lm.clone();
    tokio::task::spawn_blocking(move || {
        let tok = &lm.tokenizer;
        let bos = tok.bos.filter(|_| tok.add_bos);
        let hole = Hole {
            prefix: &text.prefix,
            suffix: &text.suffix,
            middle: &text.middle,
            extra: &text.extra,
        };
        let mut built = fim.prompt(&hole, budget, bos, |t| tok.encode(t))?;
        let healed = if text.middle.is_empty() {
            None
        } else {
            tok.heal_end(&mut built.ids, HEALED_TOKENS)
        };
        Ok::<_, engine::EngineError>((built, healed))
    })
    .await
    .map_err(|e| ApiError::server(format!("tokenizing failed: {e}")))?
    .map_err(|e| ApiError::bad_request(e.to_string(), Some(field)))
}

/// A text completion with OpenAI's `suffix`: the model writes what goes between `prompt` and
/// `suffix`.
pub(super) async fn with_suffix(
    state: &Arc<AppState>,
    prompt: String,
    suffix: String,
    mut settings: Settings,
    names: Names,
) -> Result<validate::ValidRequest, ApiError> {
    let fim = fim_tokens(state, "suffix")?;
    settings.generation.stop.extend(markers(state, &fim));
    let output = settings.generation.max_tokens.unwrap_or(OUTPUT_ROOM);
    // The whole prompt is the prefix here: a written middle needs its last token healed, and the
    // healed text taken off the output (`Middle`), which the completions route does not do.
    let text = HoleText::prefix_only(prompt, suffix);
    let (built, _) = fim_prompt(state, fim, text, output, names.prompt).await?;
    validate::tokens(state, built.ids, settings, names)
}

/// Tokens token healing takes back at most (`Tokenizer::heal_end`). The written middle's end is
/// healed because the cursor often sits inside what would be one token (`    return ` ends in a
/// lone space, `    retu` in ` ret` and `u`): so tokenized, the written middle ends in a split
/// the model never saw inside a middle, and its completions suffer (qwen-coder-0.5b completes
/// `    return ` in `def add(a, b):` with `2 + 3`). The tokens taken back are written again by the
/// first generated token, which must begin with their text
/// (`GenerationConfig::first_token_prefix`); `Middle` leaves it out of the answer.
const HEALED_TOKENS: usize = 4;

/// `POST /infill`.
pub(super) async fn infill(
    State(state): State<Arc<AppState>>,
    Extension(tenant): Extension<Tenant>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    record(&state, "infill", tenant, &body);
    let result = answer(&state, tenant, body).await;
    finish(&state, result)
}

/// llama-server's sampling defaults, for what the request leaves out (editor plugins send only
/// some of them).
fn llama_server_defaults(mut s: SamplingSettings) -> SamplingSettings {
    s.temperature.get_or_insert(0.8);
    s.top_k.get_or_insert(40);
    s.top_p.get_or_insert(0.95);
    s.min_p.get_or_insert(0.05);
    s
}

async fn answer(
    state: &Arc<AppState>,
    tenant: Tenant,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let (sampling, mut shared, speculation, fields): (
        SamplingSettings,
        Shared,
        TopLevelSpec,
        InfillFields,
    ) = read_checked(json_body(body)?, &[], neutral, state.config.lenient)?;
    // llama.vim sends `"model": ""` when none is set (llama-server reads no model): the served
    // one.
    shared.model = shared.model.filter(|m| !m.is_empty());
    let fim = fim_tokens(state, "input_prefix")?;
    let prefix = fields.input_prefix.ok_or_else(|| missing("input_prefix"))?;
    let suffix = fields.input_suffix.ok_or_else(|| missing("input_suffix"))?;
    let extra = fields
        .input_extra
        .unwrap_or_default()
        .into_iter()
        .map(|c| FileChunk {
            filename: c.filename.unwrap_or_else(|| UNNAMED_CHUNK.to_string()),
            text: c.text,
        })
        .collect();
    // `prompt` goes after the middle token, where llama-server's documentation puts it (its code
    // appends it to the prefix), with the lines above it up to an anchor (`fim::split`).
    let before = prefix + fields.prompt.as_deref().unwrap_or("");

    let mut settings = request::settings(&llama_server_defaults(sampling), &shared, &speculation);
    let n_predict = fields.n_predict.or(fields.max_tokens);
    settings.generation.max_tokens = n_predict
        .and_then(|n| usize::try_from(n).ok())
        .map(|n| n.max(1));
    let user_stops = match fields.stop {
        None => Vec::new(),
        Some(Stop::One(s)) => vec![s],
        Some(Stop::Many(v)) => v,
    };
    let markers = markers(state, &fim);
    settings.generation.stop = user_stops.iter().chain(&markers).cloned().collect();
    let names = Names {
        prompt: "input_prefix",
        max_tokens: "n_predict",
        logprobs: "n_probs",
        tools: "tools",
    };
    let output = settings.generation.max_tokens.unwrap_or(OUTPUT_ROOM);
    let text = HoleText::split(before, suffix, extra);
    let (built, healed) = fim_prompt(state, fim, text, output, names.prompt).await?;
    let generation_settings = json!({
        "n_predict": n_predict.unwrap_or(-1),
        "temperature": settings.generation.sampling.temperature,
        "top_k": settings.generation.sampling.top_k,
        "top_p": settings.generation.sampling.top_p,
        "min_p": settings.generation.sampling.min_p,
        "seed": settings.generation.sampling.seed,
        "stop": user_stops,
        "stream": settings.stream,
        "n_indent": fields.n_indent.unwrap_or(0),
        "t_max_predict_ms": fields.t_max_predict_ms.unwrap_or(-1),
    });
    let mut valid = validate::tokens(state, built.ids.clone(), settings, names)?;
    valid.config.first_token_prefix = healed.clone();
    valid.limits = Limits {
        predict_time: fields
            .t_max_predict_ms
            .and_then(|ms| u64::try_from(ms).ok())
            .filter(|&ms| ms > 0)
            .map(Duration::from_millis),
        min_indent: fields.n_indent.unwrap_or(0),
    };
    let meta = Meta {
        model: answer_model(state, shared.model.as_deref()),
        prompt: state.lm.tokenizer.decode(&built.ids),
        prompt_tokens: built.ids.len(),
        truncated: built.truncated,
        markers,
        healed: healed.unwrap_or_default(),
        min_indent: valid.limits.min_indent,
        fields: fields.response_fields.filter(|f| !f.is_empty()),
        generation_settings,
        started: Instant::now(),
    };
    let stream = valid.stream;
    let (n, reply) = (valid.n, valid.reply);
    let rx = submit(state, tenant, valid)?;
    let outputs = Outputs::new(rx, n, reply, "infill".into(), state.lm.clone());
    Ok(if stream {
        streamed(meta, outputs).into_response()
    } else {
        whole(meta, outputs).await
    })
}

/// What the answer carries besides the output.
struct Meta {
    model: String,
    /// The prompt as text (its special tokens spelled out).
    prompt: String,
    prompt_tokens: usize,
    /// Parts of the request were left out to fit the context.
    truncated: bool,
    /// The fill-in-the-middle tokens' texts among the stop strings.
    markers: Vec<String>,
    /// The text of the prompt's last tokens, taken back (`fim_prompt`): the output begins with
    /// it.
    healed: String,
    min_indent: usize,
    /// `response_fields`, when the request named some.
    fields: Option<Vec<String>>,
    generation_settings: Value,
    /// When the request went to the engine.
    started: Instant,
}

/// The middle as it comes, its start healed and its end where `n_indent` ends it.
struct Middle {
    /// What is still to be dropped from the start of the output, as far as the output repeats it
    /// (`Meta::healed`).
    heal: String,
    text: String,
    sent: usize,
    /// The text is final (`n_indent` ended it): what comes after is dropped.
    cut: bool,
    first_text: Option<Instant>,
    done: Option<(Finish, Usage, Instant)>,
}

impl Middle {
    fn new(heal: &str) -> Self {
        Middle {
            heal: heal.to_string(),
            text: String::new(),
            sent: 0,
            cut: false,
            first_text: None,
            done: None,
        }
    }

    /// Reads one piece of output; the text to send now, or the engine's error.
    fn read(&mut self, piece: Piece, min_indent: usize) -> Result<String, String> {
        let now = Instant::now();
        match piece {
            Piece::Text { text, .. } if !text.is_empty() && !self.cut => {
                self.first_text.get_or_insert(now);
                let text = self.healed(&text);
                self.text.push_str(text);
                if let Some(at) = indent_cut(&self.text, min_indent) {
                    self.text.truncate(at.max(self.sent));
                    self.cut = true;
                }
            }
            Piece::Finished { finish, usage, .. } => self.done = Some((finish, usage, now)),
            Piece::Failed(m) => return Err(m),
            _ => {}
        }
        let out = self.text[self.sent..].to_string();
        self.sent = self.text.len();
        Ok(out)
    }

    /// `text` less what it repeats of the healed start; once the output has gone past it (or
    /// written something else), nothing more is dropped.
    fn healed<'t>(&mut self, text: &'t str) -> &'t str {
        let same: usize = text
            .chars()
            .zip(self.heal.chars())
            .take_while(|(a, b)| a == b)
            .map(|(a, _)| a.len_utf8())
            .sum();
        let rest = &text[same..];
        if rest.is_empty() {
            self.heal.drain(..same);
        } else {
            self.heal.clear();
        }
        rest
    }

    /// The final answer: `content` (empty when it was streamed), the counts, the timings.
    fn answer(&self, meta: &Meta, streamed: bool) -> Value {
        let (finish, usage, end) =
            self.done
                .clone()
                .unwrap_or((Finish::Length, Usage::default(), Instant::now()));
        let first = self.first_text.unwrap_or(end);
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        let (prompt_ms, predicted_ms) = (ms(first - meta.started), ms(end - first));
        let prompt_n = usage.prompt.saturating_sub(usage.cached);
        let per_token = |ms: f64, n: usize| if n > 0 { ms / n as f64 } else { 0.0 };
        let per_second = |ms: f64, n: usize| if ms > 0.0 { 1e3 * n as f64 / ms } else { 0.0 };
        let (stop_type, word) = match &finish {
            Finish::Stop { sequence: Some(s) } if !meta.markers.contains(s) => ("word", s.clone()),
            Finish::Stop { .. } | Finish::ToolCalls => ("eos", String::new()),
            Finish::Length | Finish::Limit => ("limit", String::new()),
        };
        let answer = json!({
            "index": 0,
            "content": if streamed { "" } else { self.text.as_str() },
            "tokens": [],
            "id_slot": 0,
            "stop": true,
            "model": meta.model,
            "tokens_predicted": usage.completion,
            "tokens_evaluated": usage.prompt,
            "generation_settings": meta.generation_settings,
            "prompt": meta.prompt,
            "has_new_line": self.text.contains('\n'),
            "truncated": meta.truncated,
            "stop_type": stop_type,
            "stopping_word": word,
            "tokens_cached": usage.prompt + usage.completion,
            "timings": {
                "cache_n": usage.cached,
                "prompt_n": prompt_n,
                "prompt_ms": prompt_ms,
                "prompt_per_token_ms": per_token(prompt_ms, prompt_n),
                "prompt_per_second": per_second(prompt_ms, prompt_n),
                "predicted_n": usage.completion,
                "predicted_ms": predicted_ms,
                "predicted_per_token_ms": per_token(predicted_ms, usage.completion),
                "predicted_per_second": per_second(predicted_ms, usage.completion),
            },
        });
        match &meta.fields {
            Some(paths) => pick(paths, &answer),
            None => answer,
        }
    }
}

/// The fields of `v` at `paths` (`a/b`: field `b` of field `a`), each under its path, as
/// llama-server answers `response_fields`; a path that leads nowhere is left out.
fn pick(paths: &[String], v: &Value) -> Value {
    let mut out = serde_json::Map::new();
    for path in paths {
        let found = path
            .split('/')
            .try_fold(v, |at, key| at.as_object().and_then(|o| o.get(key)));
        if let Some(found) = found {
            out.insert(path.clone(), found.clone());
        }
    }
    Value::Object(out)
}

/// The whole answer, once the middle has finished.
async fn whole(meta: Meta, mut outputs: Outputs) -> Response {
    let mut middle = Middle::new(&meta.healed);
    while !outputs.done() {
        let Some(pieces) = outputs.next().await else {
            return ApiError::server("the engine dropped the request").into_response();
        };
        for piece in pieces {
            if let Err(m) = middle.read(piece, meta.min_indent) {
                return ApiError::server(m).into_response();
            }
        }
    }
    Json(middle.answer(&meta, false)).into_response()
}

/// The streamed answer: an event per piece of text (`stop: false`), then the final answer with
/// `stop: true`. As llama-server's own routes, no `[DONE]`.
fn streamed(meta: Meta, outputs: Outputs) -> Sse<impl stream::Stream<Item = Chunk>> {
    let healed = meta.healed.clone();
    let start = (meta, outputs, Middle::new(&healed), false);
    let s = stream::unfold(start, |(meta, mut outputs, mut middle, over)| async move {
        if over {
            return None;
        }
        let mut events = Vec::new();
        let Some(pieces) = outputs.next().await else {
            let e = ApiError::server("the engine dropped the request");
            events.push(data(json!({"error": e.openai_object()})));
            return Some((events, (meta, outputs, middle, true)));
        };
        for piece in pieces {
            match middle.read(piece, meta.min_indent) {
                Ok(text) if !text.is_empty() => events.push(data(json!({
                    "index": 0,
                    "content": text,
                    "tokens": [],
                    "stop": false,
                    "id_slot": 0,
                    "tokens_evaluated": meta.prompt_tokens,
                }))),
                Ok(_) => {}
                Err(m) => {
                    let e = ApiError::server(m);
                    events.push(data(json!({"error": e.openai_object()})));
                    return Some((events, (meta, outputs, middle, true)));
                }
            }
        }
        let over = outputs.done();
        if over {
            events.push(data(middle.answer(&meta, true)));
        }
        Some((events, (meta, outputs, middle, over)))
    })
    .flat_map(stream::iter);
    Sse::new(s).keep_alive(keep_alive())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn infill_reads_what_it_accepts() {
        request::assert_reads_what_it_accepts::<(SamplingSettings, Shared, InfillFields)>(
            &[],
            neutral,
        );
    }

    #[test]
    fn editor_plugins_fields_are_accepted() {
        for (field, value) in [
            ("id_slot", json!(0)),
            ("cache_prompt", json!(true)),
            ("samplers", json!(["top_k", "top_p", "infill"])),
            ("samplers", json!([])),
            ("t_max_prompt_ms", json!(500)),
        ] {
            assert_eq!(neutral(field, &value), Some(true), "{field}");
        }
        assert_eq!(neutral("samplers", &json!([1])), Some(false));
        assert_eq!(neutral("lora", &json!([])), None);
    }

    #[test]
    fn response_fields_pick_nested_values_by_path() {
        let v = json!({"content": "x", "timings": {"prompt_n": 3}, "n": null});
        let paths = ["content", "timings/prompt_n", "timings/nope", "", "n"].map(String::from);
        assert_eq!(
            pick(&paths, &v),
            json!({"content": "x", "timings/prompt_n": 3, "n": null})
        );
    }

    fn text_piece(t: &str) -> Piece {
        Piece::Text {
            index: 0,
            text: t.into(),
            logprobs: Vec::new(),
        }
    }

    #[test]
    fn the_middle_ends_at_a_shallow_line() {
        let mut m = Middle::new("");
        assert_eq!(
            m.read(text_piece("return x\n    y"), 4).unwrap(),
            "return x\n    y"
        );
        assert_eq!(m.read(text_piece("\n  z = 1"), 4).unwrap(), "\n  ");
        assert_eq!(m.read(text_piece("more"), 4).unwrap(), "");
        assert_eq!(m.text, "return x\n    y\n  ");
    }

    #[test]
    fn the_healed_text_is_dropped_from_the_output_as_far_as_it_repeats_it() {
        let mut m = Middle::new("  ");
        assert_eq!(m.read(text_piece(" "), 0).unwrap(), "");
        assert_eq!(m.read(text_piece(" a +"), 0).unwrap(), "a +");
        // Past the healed start nothing more is dropped.
        assert_eq!(m.read(text_piece(" b"), 0).unwrap(), " b");
        // An output that does not repeat it is kept whole.
        let mut m = Middle::new(" ");
        assert_eq!(m.read(text_piece("\n    x"), 0).unwrap(), "\n    x");
        assert_eq!(m.read(text_piece(" y"), 0).unwrap(), " y");
        let (prefix, suffix) = ("def f(a):\n".to_string(), "\n".to_string());
        let h = HoleText::split(prefix.clone() + "    return ", suffix.clone(), Vec::new());
        assert_eq!(h.prefix.clone() + &h.middle, prefix + "    return ");
        assert!(h.middle.ends_with("    return "), "{}", h.middle);
        assert_eq!(h.suffix, suffix);
    }
}
