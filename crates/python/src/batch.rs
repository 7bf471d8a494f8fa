//! `LLM.generate` over a list: every request runs in one continuous batch through the engine's
//! `step`, as the server's loop runs them. Up to `max_seqs` sequences advance in each pass; a
//! request's other choices (`n > 1`) fork from its first once the prompt is in; every prompt
//! starts from the prefix cache and leaves its rows there.

use engine::{
    step, GenerationConfig, GenerationOutput, LoadedModel, PrefixCache, Sequence, LOCAL_NAMESPACE,
};
use std::collections::VecDeque;
use std::ops::Range;
use std::time::Instant;

/// One prompt and its settings.
pub struct Request {
    pub prompt: Vec<u32>,
    pub config: GenerationConfig,
    pub n: usize,
}

/// A finished choice with the time from the batch's start to its first token.
pub struct Choice {
    pub out: GenerationOutput,
    pub first_token_s: Option<f64>,
}

struct Live {
    request: usize,
    choice: usize,
    /// Choices still to fork from this one once its prompt is in.
    forks: Range<usize>,
    seq: Sequence,
    first_token_s: Option<f64>,
}

/// Why a batch stopped before its end.
pub enum Stopped<E> {
    Engine(engine::EngineError),
    /// `between` said stop (a signal).
    Caller(E),
}

impl<E> From<engine::EngineError> for Stopped<E> {
    fn from(e: engine::EngineError) -> Self {
        Stopped::Engine(e)
    }
}

/// Checks a request as `Sequence::new` and the grammar compiler would, before anything runs.
pub fn check(lm: &LoadedModel, r: &Request, ctx: usize) -> engine::Result<()> {
    Sequence::new(&lm.model, r.prompt.clone(), r.config.clone(), ctx)?;
    if !r.config.response_format.is_text() {
        lm.tokenizer
            .grammar(lm.model.config.vocab_size)?
            .compile(&r.config.response_format)?;
    }
    Ok(())
}

/// Runs `requests` to the end; returns each one's choices in order. `between(done)` runs after
/// every pass with the number of requests finished so far, and may stop the batch.
pub fn run<E>(
    lm: &LoadedModel,
    prefix: &mut PrefixCache,
    requests: Vec<Request>,
    max_seqs: usize,
    ctx: usize,
    mut between: impl FnMut(usize) -> Result<(), E>,
) -> Result<Vec<Vec<Choice>>, Stopped<E>> {
    let started = Instant::now();
    let mut results: Vec<Vec<Option<Choice>>> = requests
        .iter()
        .map(|r| (0..r.n).map(|_| None).collect())
        .collect();
    let mut waiting: VecDeque<(usize, Request)> = requests.into_iter().enumerate().collect();
    let mut live: Vec<Live> = Vec::new();
    let mut done = 0;
    while !waiting.is_empty() || !live.is_empty() {
        while live.len() < max_seqs.max(1) {
            let Some((request, r)) = waiting.pop_front() else {
                break;
            };
            let mut seq = Sequence::new(&lm.model, r.prompt, r.config, ctx)?;
            seq.reuse_prefix(prefix, LOCAL_NAMESPACE);
            live.push(Live {
                request,
                choice: 0,
                forks: 1..r.n,
                seq,
                first_token_s: None,
            });
        }
        {
            let mut seqs: Vec<&mut Sequence> = live.iter_mut().map(|l| &mut l.seq).collect();
            step(&lm.model, &lm.tokenizer, &mut seqs)?;
        }
        let now = started.elapsed().as_secs_f64();
        let mut forked = Vec::new();
        for l in live.iter_mut() {
            if l.first_token_s.is_none() && !l.seq.generated_tokens().is_empty() {
                l.first_token_s = Some(now);
            }
            l.seq.keep_prompt(prefix, LOCAL_NAMESPACE);
            while !l.forks.is_empty() {
                let choice = l.forks.start;
                let Some(seq) = l.seq.fork_choice(&lm.model, choice)? else {
                    break;
                };
                l.forks.start += 1;
                forked.push(Live {
                    request: l.request,
                    choice,
                    forks: 0..0,
                    seq,
                    first_token_s: None,
                });
            }
        }
        live.extend(forked);
        for l in live.extract_if(.., |l| l.seq.is_finished()) {
            l.seq.keep_prefix(prefix, LOCAL_NAMESPACE);
            let slots = &mut results[l.request];
            slots[l.choice] = Some(Choice {
                out: l.seq.into_output(),
                first_token_s: l.first_token_s,
            });
            done += usize::from(slots.iter().all(Option::is_some));
        }
        between(done).map_err(Stopped::Caller)?;
    }
    Ok(results
        .into_iter()
        .map(|r| {
            r.into_iter()
                .map(|c| c.expect("every choice ran"))
                .collect()
        })
        .collect())
}
