//! `pld._native`: the engine in-process for Python. One `Engine` holds a loaded model, its
//! speculation settings and a prefix cache; `generate` runs a list of prompts as one continuous
//! batch (`batch`), `Stream` yields one prompt's text as it is verified. Settings come in and
//! results go out as JSON, turned into vLLM-shaped objects by `pld/__init__.py`. The GIL is
//! released while the engine runs; a pending signal (Ctrl-C) is checked after every pass and
//! stops the generation with `KeyboardInterrupt`.

mod batch;
mod draft;
mod settings;

use engine::kv_cache::KvDtype;
use engine::tools::{Delta, ReplyFormat, ReplyStream};
use engine::{EngineError, GenerationOutput, LoadedModel, Message, PrefixCache, Sequence};
use pyo3::exceptions::{PyFileNotFoundError, PyOSError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use serde_json::{json, Value};
use settings::Sampling;
use std::sync::{Arc, Mutex};

/// An engine error as the Python exception a user expects, with pld's message.
fn py_err(e: EngineError) -> PyErr {
    match e {
        EngineError::ModelNotFound(_) => PyFileNotFoundError::new_err(e.to_string()),
        EngineError::Io(_) => PyOSError::new_err(e.to_string()),
        _ => PyValueError::new_err(e.to_string()),
    }
}

fn field_err(e: settings::FieldError) -> PyErr {
    PyValueError::new_err(format!("{}: {}", e.field, e.message))
}

/// Everything one `LLM` runs on.
struct Inner {
    lm: LoadedModel,
    spec: drafting::SpecConfig,
    ctx: usize,
    max_num_seqs: usize,
    /// The KV caches' memory budget (`kv_cache_bytes`).
    budget: engine::KvBudget,
    prefix: Mutex<PrefixCache>,
    /// What this machine's passes cost, timed at the first batch of more than one sequence
    /// with speculation on.
    pricing: Mutex<Option<engine::pass_cost::BatchPricing>>,
}

impl Inner {
    /// The generation settings of `s` for a prompt of `prompt_len` tokens, within the budget: a
    /// `max_tokens` whose caches could never fit is a `ValueError` with the figures
    /// (`KvBudget::check`); without one the output fills what the budget holds.
    fn config(&self, prompt_len: usize, s: &Sampling) -> PyResult<engine::GenerationConfig> {
        let mut config = s.config(self.spec).map_err(field_err)?;
        let ctx_room = self.ctx.saturating_sub(prompt_len);
        let reach = prompt_len + config.max_new_tokens.min(ctx_room).max(1);
        self.budget.check(reach, s.n).map_err(py_err)?;
        config.max_new_tokens = config
            .max_new_tokens
            .min(self.budget.room(prompt_len, s.n).max(1));
        Ok(config)
    }

    fn prefix(&self) -> std::sync::MutexGuard<'_, PrefixCache> {
        self.prefix.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A loaded model with its speculation settings and prefix cache.
#[pyclass(frozen, module = "pld._native")]
struct Engine {
    inner: Arc<Inner>,
}

#[pymethods]
impl Engine {
    /// Loads `model` (an alias, fetched on first use, or a `.gguf` path). `speculative_config`
    /// is vLLM's dict as JSON (Hugging Face's names are aliases); `threads` sizes the compute
    /// pool (the first engine of the process sets it).
    #[new]
    // One argument per keyword of Python's `LLM(...)`.
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (model, speculative_config=None, max_model_len=None, threads=None, max_num_seqs=engine::DEFAULT_MAX_NUM_SEQS, prefix_cache_bytes=None, kv_cache_dtype="auto", prefix_cache_dir=None, prefix_cache_dir_bytes=engine::DEFAULT_PREFIX_CACHE_DIR_BYTES, kv_cache_bytes=None))]
    fn new(
        py: Python<'_>,
        model: &str,
        speculative_config: Option<&str>,
        max_model_len: Option<usize>,
        threads: Option<usize>,
        max_num_seqs: usize,
        prefix_cache_bytes: Option<usize>,
        kv_cache_dtype: &str,
        prefix_cache_dir: Option<std::path::PathBuf>,
        prefix_cache_dir_bytes: u64,
        kv_cache_bytes: Option<usize>,
    ) -> PyResult<Self> {
        let spec = draft::spec_config(speculative_config)?;
        let kv_dtype = KvDtype::setting(kv_cache_dtype)
            .map_err(|e| PyValueError::new_err(format!("kv_cache_dtype: {e}")))?;
        if threads == Some(0) {
            return Err(PyValueError::new_err("threads must be at least 1"));
        }
        let model = model.to_string();
        let lm = py.detach(move || -> Result<LoadedModel, PyErr> {
            let n = threads
                .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
            engine::kernels::pool::init(n);
            let path = models::resolve_model(&model).map_err(|e| match e {
                models::FetchError::UnknownModel(..) => PyFileNotFoundError::new_err(e.to_string()),
                e => PyRuntimeError::new_err(e.to_string()),
            })?;
            if !path.exists() {
                return Err(py_err(EngineError::ModelNotFound(path)));
            }
            let mut lm = LoadedModel::load(&path).map_err(py_err)?;
            if let Some(dtype) = kv_dtype {
                lm.model.set_kv_dtype(dtype).map_err(py_err)?;
            }
            Ok(lm)
        })?;
        let ctx = max_model_len
            .unwrap_or(lm.model.config.context_len)
            .min(lm.model.config.context_len);
        let budget = prefix_cache_bytes.unwrap_or_else(engine::prefix_cache::default_budget_bytes);
        let prefix = PrefixCache::open(
            &lm.path,
            lm.model.kv_shape(),
            budget,
            prefix_cache_dir.as_deref(),
            prefix_cache_dir_bytes,
        )
        .map_err(|e| PyValueError::new_err(format!("prefix_cache_dir: {e:#}")))?;
        let prefix = Mutex::new(prefix);
        let budget = engine::kv_budget::for_model(&lm, kv_cache_bytes, budget);
        Ok(Engine {
            inner: Arc::new(Inner {
                lm,
                spec,
                ctx,
                max_num_seqs: max_num_seqs.max(1),
                budget,
                prefix,
                pricing: Mutex::new(None),
            }),
        })
    }

    /// The model's name (from its metadata).
    #[getter]
    fn name(&self) -> String {
        self.inner.lm.name.clone()
    }

    /// The context length of each sequence.
    #[getter]
    fn max_model_len(&self) -> usize {
        self.inner.ctx
    }

    /// What the KV caches store keys and values as: "f16" or "f32".
    #[getter]
    fn kv_cache_dtype(&self) -> &'static str {
        self.inner.lm.model.kv_shape().dtype.name()
    }

    /// The speculation settings in use, as JSON.
    #[getter]
    fn speculative_config(&self) -> String {
        serde_json::to_string(&self.inner.spec).unwrap_or_default()
    }

    /// The prompt's token ids as generation sees them (BOS added where the model wants one).
    fn encode(&self, text: &str) -> PyResult<Vec<u32>> {
        self.inner.lm.tokenizer.encode_prompt(text).map_err(py_err)
    }

    fn decode(&self, ids: Vec<u32>) -> String {
        self.inner.lm.tokenizer.decode(&ids)
    }

    /// A conversation (OpenAI messages as JSON) rendered by the model's chat template, with
    /// `tools` (OpenAI function objects as JSON) offered as `tool_choice` (OpenAI's value as
    /// JSON) says; also the grammar that forces a call when the choice requires one, and whether
    /// the reply may make calls (tools offered, and `tool_choice` not `none`: `parse_reply`).
    #[pyo3(signature = (messages, tools=None, tool_choice=None))]
    fn render_chat(
        &self,
        messages: &str,
        tools: Option<&str>,
        tool_choice: Option<&str>,
    ) -> PyResult<(String, Option<String>, bool)> {
        let messages: Vec<Message> = serde_json::from_str(messages)
            .map_err(|e| PyValueError::new_err(format!("messages: {e}")))?;
        let json_arg = |name: &str, text: Option<&str>| -> PyResult<Option<Value>> {
            text.map(serde_json::from_str)
                .transpose()
                .map_err(|e| PyValueError::new_err(format!("{name}: {e}")))
        };
        let (tools, choice) = (
            json_arg("tools", tools)?,
            json_arg("tool_choice", tool_choice)?,
        );
        let tools = engine::tools::Tools::parse(tools.as_ref(), choice.as_ref())
            .map_err(|(m, p)| PyValueError::new_err(format!("{p}: {m}")))?;
        let offered = tools.as_ref().map_or(&[][..], |t| t.offered());
        let prompt = self
            .inner
            .lm
            .render_chat_with_tools(&messages, offered)
            .map_err(py_err)?;
        let calls = !offered.is_empty();
        let format = self.reply_format(calls);
        Ok((prompt, tools.and_then(|t| t.forced_grammar(format)), calls))
    }

    /// Whether the model writes its chat replies in harmony (gpt-oss's channels), which
    /// `parse_reply` reads.
    #[getter]
    fn harmony(&self) -> bool {
        self.inner
            .lm
            .chat_template
            .as_ref()
            .is_some_and(|t| t.is_harmony())
    }

    /// The structured output of `sampling` (`SamplingParams` as JSON) as it applies to a chat
    /// reply of this model (`ReplyFormat::constrain`): for harmony, the grammar (llguidance's
    /// Lark) that puts the answer alone in the final channel; `None` where it applies as it is.
    fn chat_grammar(&self, sampling: &str) -> PyResult<Option<String>> {
        let s = Sampling::parse(sampling).map_err(field_err)?;
        let format = s
            .config(drafting::SpecConfig::off())
            .map_err(field_err)?
            .response_format;
        let constrained = self
            .reply_format(false)
            .constrain(format.clone())
            .map_err(|e| PyValueError::new_err(format!("structured_outputs: {e}")))?;
        Ok(match constrained {
            _ if constrained == format => None,
            engine::ResponseFormat::Lark { grammar } => Some(grammar),
            _ => None,
        })
    }

    /// Runs every prompt (token ids) with its settings (`SamplingParams` as JSON) in one
    /// continuous batch; returns a JSON list of results. `progress(done)` is called after each
    /// pass with the number of prompts finished.
    #[pyo3(signature = (prompts, sampling, progress=None))]
    fn generate(
        &self,
        py: Python<'_>,
        prompts: Vec<Vec<u32>>,
        sampling: Vec<String>,
        progress: Option<Py<PyAny>>,
    ) -> PyResult<String> {
        if prompts.len() != sampling.len() {
            return Err(PyValueError::new_err("one SamplingParams per prompt"));
        }
        let inner = &*self.inner;
        let mut requests = Vec::with_capacity(prompts.len());
        for (prompt, s) in prompts.into_iter().zip(&sampling) {
            let s = Sampling::parse(s).map_err(field_err)?;
            let config = inner.config(prompt.len(), &s)?;
            requests.push(batch::Request {
                prompt,
                config,
                n: s.n,
            });
        }
        let lm = &inner.lm;
        py.detach(|| {
            requests
                .iter()
                .try_for_each(|r| batch::check(lm, r, inner.ctx, &inner.budget))
        })
        .map_err(py_err)?;
        let mut last = usize::MAX;
        let ran = py.detach(|| {
            let mut prefix = inner.prefix();
            let mut pricing = inner.pricing.lock().unwrap_or_else(|e| e.into_inner());
            batch::run(
                lm,
                &mut prefix,
                requests,
                (inner.max_num_seqs, inner.ctx, &inner.budget),
                &mut pricing,
                |done| {
                    Python::attach(|py| {
                        py.check_signals()?;
                        if let Some(p) = progress.as_ref().filter(|_| done != last) {
                            last = done;
                            p.call1(py, (done,))?;
                        }
                        Ok::<(), PyErr>(())
                    })
                },
            )
        });
        let results = match ran {
            Ok(r) => r,
            Err(batch::Stopped::Engine(e)) => return Err(py_err(e)),
            Err(batch::Stopped::Caller(e)) => return Err(e),
        };
        let tok = &inner.lm.tokenizer;
        let out: Vec<Value> = results
            .iter()
            .map(|choices| request_json(tok, choices))
            .collect();
        Ok(Value::Array(out).to_string())
    }

    /// One prompt's text as it is verified: an iterator of pieces.
    fn stream(&self, prompt: Vec<u32>, sampling: &str) -> PyResult<Stream> {
        let s = Sampling::parse(sampling).map_err(field_err)?;
        if s.n != 1 {
            return Err(PyValueError::new_err("n: a stream has one choice"));
        }
        let config = self.inner.config(prompt.len(), &s)?;
        let r = batch::Request {
            prompt,
            config,
            n: 1,
        };
        let (lm, ctx) = (&self.inner.lm, self.inner.ctx);
        batch::check(lm, &r, ctx, &self.inner.budget).map_err(py_err)?;
        let mut seq = Sequence::new(&lm.model, r.prompt, r.config, ctx).map_err(py_err)?;
        seq.reuse_prefix(&mut self.inner.prefix(), engine::LOCAL_NAMESPACE);
        Ok(Stream {
            inner: self.inner.clone(),
            seq: Some(seq),
        })
    }
}

/// An iterator over one generation's text pieces (`Engine.stream`).
#[pyclass(module = "pld._native")]
struct Stream {
    inner: Arc<Inner>,
    /// `None` once finished.
    seq: Option<Sequence>,
}

#[pymethods]
impl Stream {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__(&mut self, py: Python<'_>) -> PyResult<Option<String>> {
        let inner = &*self.inner;
        let Some(seq) = self.seq.as_mut() else {
            return Ok(None);
        };
        loop {
            if seq.is_finished() {
                let text = seq.take_new_text();
                if !text.is_empty() {
                    return Ok(Some(text));
                }
                seq.keep_prefix(&mut inner.prefix(), engine::LOCAL_NAMESPACE);
                self.seq = None;
                return Ok(None);
            }
            py.detach(|| engine::step(&inner.lm.model, &inner.lm.tokenizer, &mut [&mut *seq]))
                .map_err(py_err)?;
            py.check_signals()?;
            let text = seq.take_new_text();
            if !text.is_empty() {
                return Ok(Some(text));
            }
        }
    }
}

/// One request's result for `pld/__init__.py`: its prompt ids, choices and metrics.
fn request_json(tok: &engine::Tokenizer, choices: &[batch::Choice]) -> Value {
    let first = &choices[0].out;
    let outputs: Vec<Value> = choices
        .iter()
        .enumerate()
        .map(|(i, c)| choice_json(tok, i, &c.out))
        .collect();
    let mut stats = engine::SpecStats::default();
    let (mut prefill, mut decode) = (0.0, 0.0);
    for c in choices {
        stats.add(&c.out.stats);
        prefill += c.out.prefill_time.as_secs_f64();
        decode += c.out.decode_time.as_secs_f64();
    }
    json!({
        "prompt_token_ids": first.prompt_token_ids,
        "num_cached_tokens": first.cached_tokens,
        "outputs": outputs,
        "metrics": {
            "first_token_s": choices.iter().filter_map(|c| c.first_token_s).reduce(f64::min),
            "prefill_s": prefill,
            "decode_s": decode,
            "steps": stats.steps,
            "draft_tokens": stats.draft_tokens,
            "accepted_tokens": stats.accepted_tokens,
            "decode_tokens": stats.decode_tokens,
            "mean_accepted_tokens": stats.mean_accepted_tokens(),
            "acceptance_rate": stats.acceptance_rate(),
        },
    })
}

fn choice_json(tok: &engine::Tokenizer, index: usize, out: &GenerationOutput) -> Value {
    let text_of = |id: u32| String::from_utf8_lossy(tok.token_bytes(id)).into_owned();
    let logprobs: Option<Vec<Value>> = (!out.logprobs.is_empty()).then(|| {
        out.logprobs
            .iter()
            .map(|lp| {
                let top: Vec<Value> = lp.top.iter().map(|&(id, l)| json!([id, l, text_of(id)])).collect();
                json!({"token": lp.token, "logprob": lp.logprob, "text": text_of(lp.token), "top": top})
            })
            .collect()
    });
    let cumulative = (!out.logprobs.is_empty())
        .then(|| out.logprobs.iter().map(|l| l.logprob as f64).sum::<f64>());
    let finish = match out.finish_reason {
        engine::FinishReason::Stop => "stop",
        engine::FinishReason::Length => "length",
        engine::FinishReason::Cancelled => "abort",
    };
    json!({
        "index": index,
        "text": out.text,
        "token_ids": out.token_ids,
        "finish_reason": finish,
        "logprobs": logprobs,
        "cumulative_logprob": cumulative,
    })
}

/// The engine's defaults of `LLM`'s and `SamplingParams`' settings, as JSON (`settings::defaults`).
#[pyfunction]
fn defaults() -> String {
    settings::defaults()
}

/// Checks `SamplingParams` (as JSON) the way `generate` will: a `ValueError` names the field.
#[pyfunction]
fn check_sampling(sampling: &str) -> PyResult<()> {
    let s = Sampling::parse(sampling).map_err(field_err)?;
    s.config(drafting::SpecConfig::off()).map_err(field_err)?;
    Ok(())
}

impl Engine {
    /// How this model writes a chat reply that may (`calls`) or may not make calls.
    fn reply_format(&self, calls: bool) -> ReplyFormat {
        ReplyFormat::of_chat(self.inner.lm.chat_template.as_ref(), calls)
    }
}

/// A chat reply (`text` as generated) read as the server reads it, by the engine's reader of
/// its format: harmony's channels (`harmony`: a model whose template writes them, gpt-oss), or
/// `<tool_call>` blocks; calls are read only when `calls` (tools offered, `tool_choice` not
/// `none`: as `Engine.render_chat` says). Returns `(content, reasoning, calls)`, the calls as
/// OpenAI `tool_calls` JSON with ids `{id_prefix}-{i}`, and the content, when there are calls,
/// the text before them, trimmed.
#[pyfunction]
fn parse_reply(
    text: &str,
    id_prefix: &str,
    harmony: bool,
    calls: bool,
) -> (String, String, String) {
    let mut reply = ReplyStream::new(ReplyFormat::new(harmony, calls));
    let mut deltas = reply.push(text);
    let (rest, calls) = reply.finish(id_prefix);
    deltas.extend(rest);
    let (mut content, mut reasoning) = (String::new(), String::new());
    for d in deltas {
        match d {
            Delta::Content(t) => content.push_str(&t),
            Delta::Reasoning(t) => reasoning.push_str(&t),
        }
    }
    if !calls.is_empty() {
        content = content.trim().to_string();
    }
    (content, reasoning, Value::Array(calls).to_string())
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Engine>()?;
    m.add_class::<Stream>()?;
    m.add_class::<draft::PyDrafter>()?;
    m.add_class::<draft::PyCorpus>()?;
    m.add_function(wrap_pyfunction!(check_sampling, m)?)?;
    m.add_function(wrap_pyfunction!(defaults, m)?)?;
    m.add_function(wrap_pyfunction!(parse_reply, m)?)?;
    Ok(())
}
