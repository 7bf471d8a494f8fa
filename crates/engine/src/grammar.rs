//! Constrained decoding: `response_format` (any JSON object, or JSON matching a schema) or a
//! grammar (llguidance's Lark, or llama.cpp's GBNF translated by `gbnf`) compiled by llguidance
//! into a token-level matcher over the model's vocabulary.
//!
//! A constraint follows the emitted tokens. At every verified position the logits of the tokens the
//! grammar forbids are set to minus infinity before greedy choice or sampling, so a drafted token
//! the grammar forbids can never be accepted; drafts are cut before the pass at their first
//! forbidden token (no row is spent on them). Because the mask at a position depends only on the
//! tokens before it, constrained decoding with speculation gives exactly what it gives without.

use crate::error::{EngineError, Result};
use crate::tokenizer::Tokenizer;
use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{ApproximateTokEnv, TokEnv, TokRxInfo, TokTrie};
use llguidance::{Matcher, ParserFactory};
use std::sync::{Arc, Mutex};

pub mod gbnf;

/// What the output must be, as OpenAI's `response_format` says it.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ResponseFormat {
    /// Free text.
    #[default]
    Text,
    /// Any JSON object.
    JsonObject,
    /// JSON valid against `schema` (a JSON Schema).
    JsonSchema { schema: serde_json::Value },
    /// Text of a grammar in llguidance's Lark syntax (the server's forced tool calls).
    Lark { grammar: String },
    /// Text of a grammar in llama.cpp's GBNF (its server's `grammar` field, `pld generate
    /// --grammar`).
    Gbnf { grammar: String },
}

impl ResponseFormat {
    pub fn is_text(&self) -> bool {
        matches!(self, ResponseFormat::Text)
    }

    /// The request field this format came from, for errors.
    fn field(&self) -> &'static str {
        match self {
            ResponseFormat::Gbnf { .. } => "grammar",
            _ => "response_format",
        }
    }

    fn grammar(&self) -> Result<Option<TopLevelGrammar>> {
        Ok(match self {
            ResponseFormat::Text => None,
            ResponseFormat::JsonObject => Some(TopLevelGrammar::from_json_schema(
                serde_json::json!({"type": "object"}),
            )),
            ResponseFormat::JsonSchema { schema } => {
                Some(TopLevelGrammar::from_json_schema(schema.clone()))
            }
            ResponseFormat::Lark { grammar } => Some(TopLevelGrammar::from_lark(grammar.clone())),
            ResponseFormat::Gbnf { grammar } => Some(TopLevelGrammar::from_lark(
                gbnf::to_lark(grammar).map_err(|e| grammar_error(self.field(), e))?,
            )),
        })
    }
}

/// The grammar compiler for one vocabulary: the token trie (every token's bytes; control tokens
/// marked so that no text grammar produces them) and llguidance's parser factory. Built once per
/// model, on first use.
pub struct GrammarCompiler {
    factory: ParserFactory,
    end_tokens: Vec<u32>,
}

impl GrammarCompiler {
    /// The compiler over the first `vocab_size` tokens: `token(id)` gives a token's bytes and
    /// whether it is a control token; `ends` are the tokens that end generation.
    pub fn new<'t>(
        vocab_size: usize,
        token: impl Fn(u32) -> (&'t [u8], bool),
        ends: &[u32],
        bos: Option<u32>,
    ) -> Result<Self> {
        let words: Vec<Vec<u8>> = (0..vocab_size as u32)
            .map(|id| {
                let (bytes, control) = token(id);
                if control && !bytes.is_empty() {
                    let mut w = vec![TokTrie::SPECIAL_TOKEN_MARKER];
                    w.extend_from_slice(bytes);
                    w
                } else {
                    bytes.to_vec()
                }
            })
            .collect();
        let mut end_tokens: Vec<u32> = ends
            .iter()
            .copied()
            .filter(|&t| (t as usize) < vocab_size)
            .collect();
        if end_tokens.is_empty() {
            return Err(EngineError::InvalidConfig(
                "structured output needs an end-of-text token, and the model names none".into(),
            ));
        }
        end_tokens.sort_unstable();
        let mut info = TokRxInfo::new(vocab_size as u32, end_tokens[0]);
        info.tok_bos = bos;
        let trie = TokTrie::from(&info, &words).with_eos_tokens(&end_tokens);
        let env: TokEnv = Arc::new(ApproximateTokEnv::new(trie));
        let mut factory =
            ParserFactory::new_simple(&env).map_err(|e| grammar_error("response_format", e))?;
        factory.quiet();
        Ok(GrammarCompiler {
            factory,
            end_tokens,
        })
    }

    /// A constraint for one sequence, or `None` for free text. A schema llguidance cannot compile
    /// is an error naming the problem.
    pub fn compile(&self, format: &ResponseFormat) -> Result<Option<Constraint>> {
        let Some(grammar) = format.grammar()? else {
            return Ok(None);
        };
        let field = format.field();
        let parser = self
            .factory
            .create_parser(grammar)
            .map_err(|e| grammar_error(field, e))?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(grammar_error(field, e));
        }
        Ok(Some(Constraint {
            matcher,
            end_tokens: self.end_tokens.clone(),
        }))
    }
}

/// A compiler built (or the reason it could not be), by tokenizer and vocabulary size.
type CachedCompiler = (
    (u64, usize),
    std::result::Result<Arc<GrammarCompiler>, String>,
);

/// The compilers built lately, the most recently used first: `COMPILERS_KEPT` of them, so that a
/// process that has loaded several models keeps one for each of the last few.
static COMPILERS: Mutex<Vec<CachedCompiler>> = Mutex::new(Vec::new());
const COMPILERS_KEPT: usize = 4;

impl Tokenizer {
    /// The grammar compiler for structured output over the model's `vocab_size` logits, built on
    /// first use and kept (`COMPILERS`). It is defined here so that the dependency goes one way:
    /// the grammar reads the tokenizer, and the tokenizer knows nothing of grammars.
    pub fn grammar(&self, vocab_size: usize) -> Result<Arc<GrammarCompiler>> {
        let key = (self.id(), vocab_size);
        let mut cache = COMPILERS.lock().unwrap_or_else(|e| e.into_inner());
        let at = match cache.iter().position(|(k, _)| *k == key) {
            Some(at) => at,
            None => {
                let token = |id| (self.token_bytes(id), self.is_control(id));
                let built = GrammarCompiler::new(vocab_size, token, &self.end_tokens, self.bos)
                    .map(Arc::new)
                    .map_err(|e| e.to_string());
                cache.truncate(COMPILERS_KEPT - 1);
                cache.push((key, built));
                cache.len() - 1
            }
        };
        cache[..=at].rotate_right(1);
        cache[0].1.clone().map_err(EngineError::InvalidConfig)
    }
}

fn grammar_error(field: &str, e: impl std::fmt::Display) -> EngineError {
    EngineError::InvalidConfig(format!("{field}: {e}"))
}

/// Greedy verification's choice at a masked row (the row and its index in the chain).
pub type Chooser<'a> = dyn FnMut(&[f32], usize) -> u32 + 'a;

/// One sequence's grammar state, advanced by the tokens it emits.
pub struct Constraint {
    matcher: Matcher,
    end_tokens: Vec<u32>,
}

impl Constraint {
    /// Sets the logits of every token the grammar forbids next to minus infinity. Once the grammar
    /// is complete only the end tokens remain. A matcher in an error state forbids all but the
    /// end tokens.
    pub fn mask(&mut self, row: &mut [f32]) {
        match self.matcher.compute_mask_or_eos() {
            Ok(allowed) => {
                for (t, v) in row.iter_mut().enumerate() {
                    if !allowed.is_allowed(t as u32) {
                        *v = f32::NEG_INFINITY;
                    }
                }
            }
            Err(_) => {
                for (t, v) in row.iter_mut().enumerate() {
                    if !self.end_tokens.contains(&(t as u32)) {
                        *v = f32::NEG_INFINITY;
                    }
                }
            }
        }
    }

    /// How many of `tokens`, in order, the grammar allows from its current state.
    pub fn valid_prefix(&mut self, tokens: &[u32]) -> usize {
        self.matcher.validate_tokens(tokens).unwrap_or(0)
    }

    /// Advances over emitted tokens (end tokens are not part of the text and are skipped).
    pub fn consume(&mut self, tokens: &[u32]) {
        for &t in tokens {
            if !self.end_tokens.contains(&t) {
                // A token outside the mask cannot be emitted; should the matcher still refuse
                // it, it goes into its error state and `mask` then allows only the end.
                let _ = self.matcher.consume_token(t);
            }
        }
    }

    /// The rows of a drafted chain that verification will read, masked: row 0 as things stand,
    /// row i by the state after `draft[..i]` (a valid prefix, see `valid_prefix`). Greedy
    /// verification stops at the first row whose choice differs from the draft, so under greedy
    /// (`choose` given) the rows after it are left out and only as many masks are computed as
    /// plain decoding would; sampling gets every row. Returns the rows and how many drafts they
    /// verify. The state is left as it was.
    pub fn masked_rows(
        &mut self,
        rows: &[f32],
        vocab: usize,
        draft: &[u32],
        mut choose: Option<&mut Chooser<'_>>,
    ) -> (Vec<f32>, usize) {
        assert_eq!(rows.len(), (draft.len() + 1) * vocab);
        let mut out = Vec::with_capacity(rows.len());
        let mut consumed = 0;
        for (i, row) in rows.chunks(vocab).enumerate() {
            let start = out.len();
            out.extend_from_slice(row);
            self.mask(&mut out[start..]);
            let Some(&d) = draft.get(i) else { break };
            if let Some(choose) = choose.as_mut() {
                if choose(&out[start..], i) != d {
                    break;
                }
            }
            if self.matcher.consume_token(d).is_err() {
                break;
            }
            consumed += 1;
        }
        if consumed > 0 {
            let _ = self.matcher.rollback(consumed);
        }
        let verified = out.len() / vocab - 1;
        (out, verified)
    }
}
