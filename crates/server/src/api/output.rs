//! A request's output in the terms every API renders, from the one stream of engine events:
//! text as it is released, read in the model's `ReplyFormat` by `tools::ReplyStream` (content,
//! the model's reasoning when it writes it apart, as gpt-oss's harmony does, and function calls:
//! `<tool_call>` blocks are held back from the first one on and parsed at the end; harmony's
//! markers never reach the client), the log-probabilities of the content's tokens alone
//! (`engine::ContentLogprobs`: not those of a format's markup, the reasoning or the calls), and
//! each choice's end with its token counts. The chat and
//! text completions, the Responses API and the Messages API all read their output through
//! `Outputs`, streamed (`next`) or whole (`collect`); none of them reads the engine's events or
//! parses the model's text itself.

use crate::scheduler::Event;
use crate::tools::{Delta, ReplyFormat, ReplyStream};
use engine::{ContentLogprobs, FinishReason, LoadedModel, TokenLogprob};
use serde_json::Value;
use std::sync::Arc;
use tokio::sync::mpsc;

/// A function call the model made.
#[derive(Clone, Debug)]
pub(super) struct Call {
    pub id: String,
    pub name: String,
    /// The arguments as JSON text.
    pub arguments: String,
}

impl Call {
    /// From the OpenAI `tool_calls` entry that `tools` parses.
    fn from_openai(v: &Value) -> Call {
        let f = &v["function"];
        Call {
            id: v["id"].as_str().unwrap_or_default().to_string(),
            name: f["name"].as_str().unwrap_or_default().to_string(),
            arguments: f["arguments"].as_str().unwrap_or("{}").to_string(),
        }
    }

    /// The arguments as a JSON value (an empty object if they are not JSON).
    pub fn input(&self) -> Value {
        serde_json::from_str(&self.arguments).unwrap_or_else(|_| serde_json::json!({}))
    }
}

/// Why a choice ended.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum Finish {
    /// The model ended its turn, or `sequence` (one of the request's stop strings) ended it.
    Stop { sequence: Option<String> },
    /// The output cap or the context was reached.
    Length,
    /// One of the request's other limits ended it (`scheduler::Limits`: `/infill`'s time to
    /// generate and indentation).
    Limit,
    /// The output ended in function calls.
    ToolCalls,
}

/// Token counts of one choice: the request's prompt (`cached` of them from the prefix cache) and
/// this choice's output.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Usage {
    pub prompt: usize,
    pub cached: usize,
    pub completion: usize,
}

/// One thing that happened to a request's output.
pub(super) enum Piece {
    Text {
        index: usize,
        text: String,
        logprobs: Vec<TokenLogprob>,
    },
    /// The model's reasoning (before the text it leads to).
    Reasoning { index: usize, text: String },
    /// Choice `index` ended in these calls (sent just before its `Finished`).
    Calls { index: usize, calls: Vec<Call> },
    Finished {
        index: usize,
        finish: Finish,
        usage: Usage,
    },
    /// The engine failed; nothing follows.
    Failed(String),
}

/// A whole choice.
#[derive(Debug)]
pub(super) struct Choice {
    /// The text (with calls: the text before them, trimmed).
    pub text: String,
    /// The model's reasoning (empty when it wrote none apart).
    pub reasoning: String,
    pub logprobs: Vec<TokenLogprob>,
    pub calls: Vec<Call>,
    pub finish: Finish,
    pub usage: Usage,
}

/// The pieces of choice `index` that `deltas` make, the text's log-probabilities with the first
/// text (or alone, when the tokens were all reasoning or held back).
fn pieces(index: usize, deltas: Vec<Delta>, logprobs: Vec<TokenLogprob>) -> Vec<Piece> {
    let mut logprobs = Some(logprobs).filter(|l| !l.is_empty());
    let mut out: Vec<Piece> = deltas
        .into_iter()
        .map(|d| match d {
            Delta::Reasoning(text) => Piece::Reasoning { index, text },
            Delta::Content(text) => Piece::Text {
                index,
                text,
                logprobs: logprobs.take().unwrap_or_default(),
            },
        })
        .collect();
    if let Some(logprobs) = logprobs {
        out.push(Piece::Text {
            index,
            text: String::new(),
            logprobs,
        });
    }
    out
}

/// The output of one request of `n` choices, read from its engine events.
pub(super) struct Outputs {
    rx: mpsc::UnboundedReceiver<Event>,
    /// Per choice: its text read in the model's format, and its log-probabilities kept to the
    /// content's tokens (plain text is all content: its log-probabilities go out as they come).
    replies: Vec<ReplyStream>,
    logprobs: Vec<ContentLogprobs>,
    plain: bool,
    lm: Arc<LoadedModel>,
    /// Call ids are this, the choice and the call's number.
    call_prefix: String,
    n: usize,
    finished: usize,
}

impl Outputs {
    pub fn new(
        rx: mpsc::UnboundedReceiver<Event>,
        n: usize,
        format: ReplyFormat,
        call_prefix: String,
        lm: Arc<LoadedModel>,
    ) -> Self {
        Outputs {
            rx,
            replies: (0..n).map(|_| ReplyStream::new(format)).collect(),
            logprobs: (0..n).map(|_| ContentLogprobs::default()).collect(),
            plain: format == ReplyFormat::Text,
            lm,
            call_prefix,
            n,
            finished: 0,
        }
    }

    /// Whether every choice has finished.
    pub fn done(&self) -> bool {
        self.finished == self.n
    }

    /// What the next engine event comes to (possibly nothing); `None` once the engine has
    /// dropped the request without finishing it.
    pub async fn next(&mut self) -> Option<Vec<Piece>> {
        Some(match self.rx.recv().await? {
            Event::Text {
                index,
                text,
                logprobs,
            } => {
                let deltas = self.replies[index].push(&text);
                let logprobs = self.content_logprobs(index, logprobs, false);
                pieces(index, deltas, logprobs)
            }
            Event::Finished {
                index,
                reason,
                prompt_tokens,
                cached_tokens,
                completion_tokens,
                stop,
            } => {
                self.finished += 1;
                let usage = Usage {
                    prompt: prompt_tokens,
                    cached: cached_tokens,
                    completion: completion_tokens,
                };
                let mut finish = match reason {
                    FinishReason::Length => Finish::Length,
                    FinishReason::Stop => Finish::Stop { sequence: stop },
                    // A client that left gets nothing: the server cancels only for the limits.
                    FinishReason::Cancelled => Finish::Limit,
                };
                let id_prefix = format!("{}-{index}", self.call_prefix);
                let (rest, calls) = self.replies[index].finish(&id_prefix);
                let logprobs = self.content_logprobs(index, Vec::new(), true);
                let mut out = pieces(index, rest, logprobs);
                if !calls.is_empty() {
                    let calls = calls.iter().map(Call::from_openai).collect();
                    out.push(Piece::Calls { index, calls });
                    finish = Finish::ToolCalls;
                }
                out.push(Piece::Finished {
                    index,
                    finish,
                    usage,
                });
                out
            }
            Event::Failed(m) => vec![Piece::Failed(m)],
        })
    }

    /// Of choice `index`'s log-probabilities so far (`new` the latest), those of its content's
    /// tokens that are decided (`end`: all, the choice has finished).
    fn content_logprobs(
        &mut self,
        index: usize,
        new: Vec<TokenLogprob>,
        end: bool,
    ) -> Vec<TokenLogprob> {
        if self.plain {
            return new;
        }
        let lps = &mut self.logprobs[index];
        lps.push(new, &self.lm.tokenizer);
        let (decided, content) = self.replies[index].take_content();
        lps.take(if end { usize::MAX } else { decided }, content)
    }

    /// The one choice of a request of one (the Responses and Messages APIs), whole.
    pub async fn single(self) -> Result<Choice, String> {
        self.collect()
            .await?
            .pop()
            .ok_or_else(|| "the request had no choice".to_string())
    }

    /// Every choice whole, once all have finished; the engine's message if it failed.
    pub async fn collect(mut self) -> Result<Vec<Choice>, String> {
        let mut choices: Vec<Choice> = (0..self.n)
            .map(|_| Choice {
                text: String::new(),
                reasoning: String::new(),
                logprobs: Vec::new(),
                calls: Vec::new(),
                finish: Finish::Length,
                usage: Usage::default(),
            })
            .collect();
        while !self.done() {
            let pieces = self
                .next()
                .await
                .ok_or_else(|| "the engine dropped the request".to_string())?;
            for piece in pieces {
                match piece {
                    Piece::Text {
                        index,
                        text,
                        logprobs,
                    } => {
                        choices[index].text.push_str(&text);
                        choices[index].logprobs.extend(logprobs);
                    }
                    Piece::Reasoning { index, text } => choices[index].reasoning.push_str(&text),
                    Piece::Calls { index, calls } => {
                        let c = &mut choices[index];
                        c.text = c.text.trim().to_string();
                        c.calls = calls;
                    }
                    Piece::Finished {
                        index,
                        finish,
                        usage,
                    } => {
                        choices[index].finish = finish;
                        choices[index].usage = usage;
                    }
                    Piece::Failed(m) => return Err(m),
                }
            }
        }
        Ok(choices)
    }
}
