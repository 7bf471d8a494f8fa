//! `pld serve`: the HTTP server (OpenAI's chat and text completions and Responses API,
//! Anthropic's Messages API).

use crate::spec::SpecArgs;
use clap::Args;
use std::sync::Arc;

#[derive(Args, Debug)]
pub struct ServeArgs {
    #[arg(long, default_value = crate::common::DEFAULT_MODEL)]
    pub model: String,
    #[command(flatten)]
    pub kv: crate::common::KvCacheArgs,
    /// Address to bind (loopback unless told otherwise).
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    #[arg(long, default_value_t = 8000)]
    pub port: u16,
    /// Require `Authorization: Bearer KEY` (or `x-api-key: KEY`) on the API routes; repeat for
    /// several keys. Each key is a tenant: drafts, cached prefixes and stored responses of
    /// earlier requests serve only the same key's requests.
    #[arg(long)]
    pub api_key: Vec<String>,
    /// Tokens of earlier prompts and outputs kept per tenant for drafting trees (0: none).
    #[arg(long, default_value_t = drafting::DEFAULT_CORPUS_TOKENS)]
    pub corpus_tokens: usize,
    /// Sequences decoded together in one batch.
    #[arg(long, default_value_t = engine::DEFAULT_MAX_NUM_SEQS)]
    pub max_num_seqs: usize,
    /// Bytes the KV caches of the running sequences (and the kept caches of ended requests) may
    /// reserve together, as a number with an optional K, M or G: a request waits until its
    /// cache fits, and a sequence that must grow past it preempts the most recently admitted
    /// one, which resumes later with its output unchanged. Default: the machine's memory (the
    /// lesser of MemAvailable and 7/8 of MemTotal) less the model file and the prefix cache's
    /// budget, at least 256M.
    #[arg(long, value_name = "SIZE", value_parser = crate::common::parse_bytes)]
    pub kv_cache_bytes: Option<usize>,
    /// Requests that may wait for a batch slot before new ones get 429.
    #[arg(long, default_value_t = 64)]
    pub max_queue: usize,
    /// Context length per sequence (default: the model's).
    #[arg(long)]
    pub max_model_len: Option<usize>,
    /// Largest accepted request body in bytes.
    #[arg(long, default_value_t = 4 << 20)]
    pub max_body_bytes: usize,
    /// A name clients may send as `model` (default: the --model argument); repeat for several
    /// (answers carry the first unless the request named another).
    #[arg(long, value_name = "NAME")]
    pub served_model_name: Vec<String>,
    /// Responses API: stored responses kept (least recently used go first).
    #[arg(long, default_value_t = server::DEFAULT_MAX_STORED_RESPONSES)]
    pub max_stored_responses: usize,
    /// Responses API: bytes of stored responses kept, as a number with an optional K, M or G.
    #[arg(long, value_name = "SIZE", value_parser = crate::common::parse_bytes,
          default_value_t = server::DEFAULT_STORED_RESPONSES_BYTES)]
    pub stored_responses_bytes: usize,
    /// Append every request body, with its time, API and tenant, to DIR/requests.jsonl (for
    /// replaying agent traffic with `pld bench replay`).
    #[arg(long, value_name = "DIR")]
    pub record_requests: Option<std::path::PathBuf>,
    /// Allow browsers on this origin to call the API (CORS; `*` for any); repeat for several.
    /// Without it no CORS headers are sent.
    #[arg(long, value_name = "ORIGIN")]
    pub allowed_origin: Vec<String>,
    /// Log and ignore request fields pld cannot honour (unknown fields, `logit_bias`, ...)
    /// instead of answering 400.
    #[arg(long)]
    pub lenient: bool,
    /// Keep the lines agents change between requests in their system prompts (Claude Code's
    /// `x-anthropic-billing-header`), which are otherwise dropped before the chat template is
    /// applied so that every session's identical preamble is read from the prefix cache.
    #[arg(long)]
    pub keep_volatile_lines: bool,
    #[arg(long)]
    pub threads: Option<usize>,
    #[command(flatten)]
    pub prefix_cache: crate::common::PrefixCacheDirArgs,
    #[command(flatten)]
    pub spec: SpecArgs,
}

pub fn run(a: ServeArgs) -> anyhow::Result<()> {
    crate::common::init_threads(a.threads)?;
    let spec = a.spec.resolve()?;
    let lm = Arc::new(crate::common::load_model(&a.model, &a.kv)?);
    let ctx = a
        .max_model_len
        .unwrap_or(lm.model.config.context_len)
        .min(lm.model.config.context_len);
    let addr: std::net::SocketAddr = format!("{}:{}", a.host, a.port)
        .parse()
        .map_err(|e| anyhow::anyhow!("bad --host/--port '{}:{}': {e}", a.host, a.port))?;
    let config = server::ServerConfig {
        model_names: if a.served_model_name.is_empty() {
            vec![a.model.clone()]
        } else {
            a.served_model_name.clone()
        },
        api_keys: a.api_key.clone(),
        corpus_tokens: a.corpus_tokens,
        prefix_cache_bytes: a.prefix_cache.budget(),
        kv_cache_bytes: a.kv_cache_bytes,
        max_num_seqs: a.max_num_seqs.max(1),
        max_queue: a.max_queue.max(1),
        max_model_len: ctx,
        max_body_bytes: a.max_body_bytes,
        spec,
        cors_origins: a.allowed_origin.clone(),
        lenient: a.lenient,
        max_stored_responses: a.max_stored_responses,
        stored_responses_bytes: a.stored_responses_bytes,
        record_requests: a.record_requests.clone(),
        keep_volatile_lines: a.keep_volatile_lines,
        prefix_cache_dir: a.prefix_cache.prefix_cache_dir.clone(),
        prefix_cache_dir_bytes: a.prefix_cache.prefix_cache_dir_bytes.0,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(server::serve(lm, config, addr))
}
