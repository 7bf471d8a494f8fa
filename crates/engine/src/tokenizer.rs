//! The tokenizer of a GGUF model, built from its `tokenizer.ggml.*` metadata with the `tokenizers`
//! crate's pieces, plus a byte table per token for exact, streamable decoding. Two kinds:
//! - `gpt2`: byte-level BPE with merges, and the pre-tokenizer named by `tokenizer.ggml.pre`
//!   (Qwen, SmolLM, Llama 3);
//! - `llama`: SentencePiece-style BPE (Gemma, Llama 2, Mistral's first models): pieces with scores
//!   and no merges, spaces written `▁`, bytes outside the pieces as `<0xXX>` tokens. SentencePiece
//!   merges the adjacent pair whose joined piece scores highest; the `tokenizers` BPE model does the
//!   same given the merges of every piece ranked by that piece's score.
//!
//! Control and user-defined tokens are added tokens, matched in the text before the model runs.

use crate::error::{EngineError, Result};
use crate::gguf::GgufFile;
use candle_core::quantized::gguf_file::Value;
use std::sync::atomic::{AtomicU64, Ordering};
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::normalizers::{Prepend, Replace, Sequence as NormalizerSequence};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{AddedToken, PreTokenizerWrapper, SplitDelimiterBehavior};

/// Qwen2's split pattern (contractions, letters, single digits, punctuation runs, newlines).
const QWEN2_PATTERN: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// GPT-4o's (o200k) split pattern, gpt-oss's (`tokenizer.ggml.pre = gpt-4o`): cased words keep
/// a leading capital run with their lower-case tail, contractions stay on their word, digits go
/// in runs of up to three, punctuation runs take trailing newlines and slashes.
const GPT4O_PATTERN: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Llama 3's split pattern (digits in runs of up to three).
const LLAMA3_PATTERN: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// GGUF token types.
const TOKEN_NORMAL: i32 = 1;
const TOKEN_CONTROL: i32 = 3;
const TOKEN_USER_DEFINED: i32 = 4;
const TOKEN_BYTE: i32 = 6;

/// SentencePiece's visible space.
const SPM_SPACE: char = '\u{2581}';

/// Texts of the control tokens that end a turn in the chat formats we know.
const END_OF_TURN_TEXTS: [&str; 6] = [
    "<|im_end|>",
    "<|endoftext|>",
    "<|eot_id|>",
    "<|end_of_text|>",
    "<end_of_turn>",
    "<|end|>",
];

/// Harmony's end of a message, and its two ends of a turn (a reply, a call).
const HARMONY_END: &str = "<|end|>";
const HARMONY_RETURN: &str = "<|return|>";
const HARMONY_CALL: &str = "<|call|>";

/// A model's tokenizer. What is built over its vocabulary elsewhere is cached there under its
/// `id` (the grammar compiler for structured output: `Tokenizer::grammar`, in `grammar.rs`).
pub struct Tokenizer {
    /// Unique in this process (see `id`).
    id: u64,
    inner: tokenizers::Tokenizer,
    token_bytes: Vec<Vec<u8>>,
    is_control: Vec<bool>,
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    pub add_bos: bool,
    /// Tokens that end generation: eos, end-of-turn, and the chat formats' end markers.
    pub end_tokens: Vec<u32>,
}

/// The next `Tokenizer::id`.
static NEXT_ID: AtomicU64 = AtomicU64::new(0);

fn err(msg: impl std::fmt::Display) -> EngineError {
    EngineError::Tokenizer(msg.to_string())
}

fn strings(values: &[Value], key: &str) -> Result<Vec<String>> {
    values
        .iter()
        .map(|v| match v {
            Value::String(s) => Ok(s.clone()),
            _ => Err(EngineError::BadMetadata(format!(
                "{key} holds a non-string"
            ))),
        })
        .collect()
}

/// The inverse of byte-level BPE's byte-to-character table.
fn byte_level_decoding_table() -> std::collections::HashMap<char, u8> {
    let mut printable: Vec<u32> = (b'!' as u32..=b'~' as u32).collect();
    printable.extend(0xA1..=0xAC);
    printable.extend(0xAE..=0xFF);
    let mut table = std::collections::HashMap::new();
    let mut extra = 0u32;
    for b in 0u32..256 {
        let ch = if printable.contains(&b) {
            b
        } else {
            extra += 1;
            255 + extra
        };
        table.insert(char::from_u32(ch).expect("valid char"), b as u8);
    }
    table
}

impl Tokenizer {
    pub fn from_gguf(file: &GgufFile) -> Result<Self> {
        let model = file.get_str("tokenizer.ggml.model")?;
        let tokens = strings(file.get_array("tokenizer.ggml.tokens")?, "tokens")?;
        let types: Vec<i32> = match file.meta("tokenizer.ggml.token_type") {
            Some(Value::Array(a)) => a
                .iter()
                .map(|v| match v {
                    Value::I32(x) => *x,
                    Value::U32(x) => *x as i32,
                    _ => 1,
                })
                .collect(),
            _ => vec![1; tokens.len()],
        };
        if types.len() != tokens.len() {
            return Err(EngineError::BadMetadata(
                "token_type and tokens differ in length".into(),
            ));
        }
        let (mut inner, token_bytes) = match model {
            "gpt2" => byte_level_bpe(file, &tokens, &types)?,
            "llama" => sentencepiece_bpe(file, &tokens, &types)?,
            other => {
                return Err(err(format!(
                    "tokenizer model '{other}' is not supported (supported: gpt2 = byte-level BPE, llama = SentencePiece BPE)"
                )))
            }
        };

        let special: Vec<AddedToken> = tokens
            .iter()
            .zip(&types)
            .filter(|(_, &t)| t == TOKEN_CONTROL || t == TOKEN_USER_DEFINED)
            .map(|(s, &t)| AddedToken::from(s.clone(), t == TOKEN_CONTROL).normalized(false))
            .collect();
        inner.add_special_tokens(&special);

        let is_control: Vec<bool> = types.iter().map(|&t| t == TOKEN_CONTROL).collect();

        let id = |key: &str| {
            file.get_u64_opt(key)
                .map(|v| v as u32)
                .filter(|&v| (v as usize) < tokens.len())
        };
        let bos = id("tokenizer.ggml.bos_token_id");
        let eos = id("tokenizer.ggml.eos_token_id");
        let mut end_tokens: Vec<u32> = eos.into_iter().collect();
        end_tokens.extend(id("tokenizer.ggml.eot_token_id"));
        // A special token (control or user-defined: conversions differ) by its text.
        let control_id = |text: &str| {
            let i = tokens.iter().position(|t| t == text)?;
            matches!(types[i], TOKEN_CONTROL | TOKEN_USER_DEFINED).then_some(i as u32)
        };
        // Harmony's vocabulary (gpt-oss, o200k_harmony) ends a turn with `<|return|>` or
        // `<|call|>`; its `<|end|>` ends one message of the turn, and the reply goes on.
        let harmony_ends = [HARMONY_RETURN, HARMONY_CALL].map(control_id);
        let harmony = harmony_ends.iter().all(Option::is_some);
        for (i, t) in tokens.iter().enumerate() {
            if is_control[i]
                && END_OF_TURN_TEXTS.contains(&t.as_str())
                && !(harmony && t == HARMONY_END)
            {
                end_tokens.push(i as u32);
            }
        }
        end_tokens.extend(harmony_ends.into_iter().flatten());
        if harmony {
            end_tokens.retain(|&t| Some(t) != control_id(HARMONY_END));
        }
        // The BOS token opens turns in some chat formats (SmolLM's <|im_start|>): it ends nothing
        // unless the model says it is also its EOS.
        end_tokens.retain(|&t| Some(t) != bos || bos == eos);
        end_tokens.sort_unstable();
        end_tokens.dedup();
        Ok(Tokenizer {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            inner,
            token_bytes,
            is_control,
            bos,
            eos,
            add_bos: file
                .get_bool_opt("tokenizer.ggml.add_bos_token")
                .unwrap_or(false),
            end_tokens,
        })
    }

    /// This tokenizer among all those of the process (each gets its own), the key under which
    /// what is built over its vocabulary is cached.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The length in bytes of the longest token: a text of `b` bytes has at least
    /// `b / longest_token_bytes()` tokens.
    pub fn longest_token_bytes(&self) -> usize {
        (0..self.vocab_size() as u32)
            .map(|id| self.token_bytes(id).len())
            .max()
            .unwrap_or(1)
    }

    pub fn vocab_size(&self) -> usize {
        self.token_bytes.len()
    }

    /// Token ids of `text`; special-token strings in it map to their ids. No BOS is added.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let enc = self.inner.encode(text, false).map_err(err)?;
        Ok(enc.get_ids().to_vec())
    }

    /// Token ids of a whole prompt: like `encode`, with the model's BOS in front when the model
    /// asks for one and the text does not already start with it.
    pub fn encode_prompt(&self, text: &str) -> Result<Vec<u32>> {
        let mut ids = self.encode(text)?;
        if let (true, Some(bos)) = (self.add_bos, self.bos) {
            if ids.first() != Some(&bos) {
                ids.insert(0, bos);
            }
        }
        Ok(ids)
    }

    /// The bytes a token stands for (special tokens: their text).
    pub fn token_bytes(&self, id: u32) -> &[u8] {
        self.token_bytes
            .get(id as usize)
            .map(|b| b.as_slice())
            .unwrap_or(&[])
    }

    /// `row` (one logit per token id) with only the text tokens whose bytes begin with `prefix`
    /// kept: every other logit, and those of ids past the vocabulary, are minus infinity.
    /// Token healing: a prompt's last token taken back, the next token must write it again.
    pub fn tokens_starting_with(&self, row: &[f32], prefix: &[u8]) -> Vec<f32> {
        let keep = |id: u32| !self.is_control(id) && self.token_bytes(id).starts_with(prefix);
        (0u32..)
            .zip(row)
            .map(|(id, &v)| if keep(id) { v } else { f32::NEG_INFINITY })
            .collect()
    }

    /// Whether some text token's bytes begin with `prefix`.
    fn some_token_starts_with(&self, prefix: &[u8]) -> bool {
        (0..self.token_bytes.len() as u32)
            .any(|id| !self.is_control(id) && self.token_bytes(id).starts_with(prefix))
    }

    /// Token healing: takes back the last tokens of `ids`, as many (`most` at most, the last
    /// always) as a single text token could write again, and returns their text, which the next
    /// token must begin with (`tokens_starting_with`): ` ret` and `u` together, since ` return`
    /// begins with ` retu`. None, and `ids` untouched, where the last token is a control token or
    /// the text is not whole UTF-8.
    pub fn heal_end(&self, ids: &mut Vec<u32>, most: usize) -> Option<String> {
        let (mut healed, mut taken) = (Vec::new(), 0);
        for &id in ids.iter().rev().take(most) {
            if self.is_control(id) || self.token_bytes(id).is_empty() {
                break;
            }
            let text = [self.token_bytes(id), &healed].concat();
            if taken > 0 && !self.some_token_starts_with(&text) {
                break;
            }
            (healed, taken) = (text, taken + 1);
        }
        let text = String::from_utf8(healed).ok().filter(|t| !t.is_empty())?;
        ids.truncate(ids.len() - taken);
        Some(text)
    }

    pub fn is_control(&self, id: u32) -> bool {
        self.is_control.get(id as usize).copied().unwrap_or(false)
    }

    pub fn is_end(&self, id: u32) -> bool {
        self.end_tokens.contains(&id)
    }

    /// The text of a whole sequence of ids (invalid UTF-8 replaced).
    pub fn decode(&self, ids: &[u32]) -> String {
        let bytes: Vec<u8> = ids
            .iter()
            .flat_map(|&i| self.token_bytes(i).iter().copied())
            .collect();
        String::from_utf8_lossy(&bytes).into_owned()
    }
}

/// Byte-level BPE (`tokenizer.ggml.model = gpt2`): the model with its merges and pre-tokenizer,
/// and each token's bytes.
fn byte_level_bpe(
    file: &GgufFile,
    tokens: &[String],
    types: &[i32],
) -> Result<(tokenizers::Tokenizer, Vec<Vec<u8>>)> {
    let merges = strings(file.get_array("tokenizer.ggml.merges")?, "merges")?;
    let vocab: Vocab = tokens
        .iter()
        .enumerate()
        .map(|(i, t)| (t.clone(), i as u32))
        .collect();
    let merges: Vec<(String, String)> = merges
        .iter()
        .map(|m| {
            m.split_once(' ')
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .ok_or_else(|| err(format!("malformed merge '{m}'")))
        })
        .collect::<Result<_>>()?;
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .build()
        .map_err(err)?;

    let pre = file.get_str_opt("tokenizer.ggml.pre").unwrap_or("default");
    let split = |pattern: &str| -> Result<PreTokenizerWrapper> {
        Ok(Split::new(
            SplitPattern::Regex(pattern.into()),
            SplitDelimiterBehavior::Isolated,
            false,
        )
        .map_err(err)?
        .into())
    };
    let pre_tokenizer: PreTokenizerWrapper = match pre {
        "qwen2" => Sequence::new(vec![
            split(QWEN2_PATTERN)?,
            ByteLevel::new(false, false, false).into(),
        ])
        .into(),
        "gpt-4o" => Sequence::new(vec![
            split(GPT4O_PATTERN)?,
            ByteLevel::new(false, false, false).into(),
        ])
        .into(),
        "llama-bpe" | "llama3" => Sequence::new(vec![
            split(LLAMA3_PATTERN)?,
            ByteLevel::new(false, false, false).into(),
        ])
        .into(),
        "smollm" => Sequence::new(vec![
            Digits::new(true).into(),
            ByteLevel::new(false, false, true).into(),
        ])
        .into(),
        "gpt2" | "default" => ByteLevel::new(false, false, true).into(),
        other => {
            return Err(err(format!(
            "pre-tokenizer '{other}' is not supported (supported: qwen2, smollm, llama-bpe, gpt-4o, gpt2)"
        )))
        }
    };
    let mut inner = tokenizers::Tokenizer::new(bpe);
    inner.with_pre_tokenizer(Some(pre_tokenizer));
    inner.with_decoder(Some(ByteLevelDecoder::default()));

    let table = byte_level_decoding_table();
    let token_bytes = tokens
        .iter()
        .zip(types)
        .map(|(s, &t)| {
            if t == TOKEN_CONTROL || t == TOKEN_USER_DEFINED {
                s.as_bytes().to_vec()
            } else {
                s.chars()
                    .map(|c| table.get(&c).copied())
                    .collect::<Option<Vec<u8>>>()
                    .unwrap_or_else(|| s.as_bytes().to_vec())
            }
        })
        .collect();
    Ok((inner, token_bytes))
}

/// The byte a SentencePiece byte token such as `<0x0A>` stands for.
fn spm_byte(piece: &str) -> Option<u8> {
    let hex = piece.strip_prefix("<0x")?.strip_suffix('>')?;
    (hex.len() == 2).then(|| u8::from_str_radix(hex, 16).ok())?
}

/// SentencePiece-style BPE (`tokenizer.ggml.model = llama`): pieces with scores and no merges.
/// The merges are derived: every way to split a normal piece into two pieces is a merge, ranked by
/// the joined piece's score (higher first), so that the BPE model always joins the pair whose
/// result scores highest, as SentencePiece does. Spaces become `▁` (with one in front of the text
/// when `tokenizer.ggml.add_space_prefix` says so), and characters outside the pieces fall back to
/// byte tokens.
fn sentencepiece_bpe(
    file: &GgufFile,
    tokens: &[String],
    types: &[i32],
) -> Result<(tokenizers::Tokenizer, Vec<Vec<u8>>)> {
    let scores: Vec<f32> = match file.meta("tokenizer.ggml.scores") {
        Some(Value::Array(a)) => a
            .iter()
            .map(|v| match v {
                Value::F32(x) => Ok(*x),
                _ => Err(EngineError::BadMetadata(
                    "tokenizer.ggml.scores holds a non-float".into(),
                )),
            })
            .collect::<Result<_>>()?,
        _ => {
            return Err(EngineError::BadMetadata(
                "missing key 'tokenizer.ggml.scores' (a SentencePiece vocabulary needs scores)"
                    .into(),
            ))
        }
    };
    if scores.len() != tokens.len() {
        return Err(EngineError::BadMetadata(
            "tokenizer.ggml.scores and tokens differ in length".into(),
        ));
    }
    let mut vocab: Vocab = Vocab::with_capacity(tokens.len());
    for (i, t) in tokens.iter().enumerate() {
        // The first of duplicate pieces wins, as in SentencePiece.
        vocab.entry(t.clone()).or_insert(i as u32);
    }
    let mergeable = |id: u32| types[id as usize] == TOKEN_NORMAL;
    let mut ranked: Vec<(f32, u32, u32, u32)> = Vec::new();
    for (id, piece) in tokens.iter().enumerate() {
        if types[id] != TOKEN_NORMAL || vocab.get(piece) != Some(&(id as u32)) {
            continue;
        }
        for (at, _) in piece.char_indices().skip(1) {
            let (l, r) = piece.split_at(at);
            if let (Some(&a), Some(&b)) = (vocab.get(l), vocab.get(r)) {
                if mergeable(a) && mergeable(b) {
                    ranked.push((scores[id], id as u32, a, b));
                }
            }
        }
    }
    // Highest score first; ties by piece id, then by the split, so the order is fixed.
    ranked.sort_by(|x, y| y.0.total_cmp(&x.0).then(x.1.cmp(&y.1)).then(x.2.cmp(&y.2)));
    let merges: Vec<(String, String)> = ranked
        .iter()
        .map(|&(_, _, a, b)| (tokens[a as usize].clone(), tokens[b as usize].clone()))
        .collect();
    let byte_tokens = (0..=255u8).all(|b| vocab.contains_key(&format!("<0x{b:02X}>")));
    let unk = file
        .get_u64_opt("tokenizer.ggml.unknown_token_id")
        .and_then(|i| tokens.get(i as usize).cloned());
    let mut builder = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .byte_fallback(byte_tokens);
    if let Some(unk) = unk {
        builder = builder.unk_token(unk);
    }
    let bpe = builder.build().map_err(err)?;
    let mut inner = tokenizers::Tokenizer::new(bpe);
    let space = Replace::new(" ", SPM_SPACE.to_string()).map_err(err)?;
    if file
        .get_bool_opt("tokenizer.ggml.add_space_prefix")
        .unwrap_or(true)
    {
        inner.with_normalizer(Some(NormalizerSequence::new(vec![
            Prepend::new(SPM_SPACE.to_string()).into(),
            space.into(),
        ])));
    } else {
        inner.with_normalizer(Some(space));
    }

    let token_bytes = tokens
        .iter()
        .zip(types)
        .map(|(s, &t)| match t {
            TOKEN_BYTE => spm_byte(s).map_or_else(|| s.as_bytes().to_vec(), |b| vec![b]),
            TOKEN_CONTROL | TOKEN_USER_DEFINED => s.as_bytes().to_vec(),
            _ => s.replace(SPM_SPACE, " ").into_bytes(),
        })
        .collect();
    Ok((inner, token_bytes))
}

/// Turns token bytes into text as they arrive, holding back a character whose bytes are split
/// across tokens until it is complete.
#[derive(Default, Clone)]
pub struct TextStream {
    pending: Vec<u8>,
}

impl TextStream {
    pub fn push(&mut self, bytes: &[u8]) -> String {
        self.pending.extend_from_slice(bytes);
        let mut out = String::new();
        loop {
            match std::str::from_utf8(&self.pending) {
                Ok(s) => {
                    out.push_str(s);
                    self.pending.clear();
                    return out;
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    out.push_str(
                        std::str::from_utf8(&self.pending[..valid]).expect("valid prefix"),
                    );
                    match e.error_len() {
                        // Incomplete character at the end: wait for more bytes.
                        None => {
                            self.pending.drain(..valid);
                            return out;
                        }
                        Some(bad) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            self.pending.drain(..valid + bad);
                        }
                    }
                }
            }
        }
    }

    /// Whatever is still held back, made valid.
    pub fn finish(&mut self) -> String {
        let s = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_holds_back_split_characters() {
        let mut s = TextStream::default();
        let rocket = "🚀".as_bytes();
        assert_eq!(s.push(b"a"), "a");
        assert_eq!(s.push(&rocket[..1]), "");
        assert_eq!(s.push(&rocket[1..3]), "");
        assert_eq!(s.push(&rocket[3..]), "🚀");
        assert_eq!(s.push(&[0xff, b'b']), "\u{fffd}b");
        assert_eq!(s.push(&rocket[..2]), "");
        assert_eq!(s.finish(), "\u{fffd}");
    }

    #[test]
    fn byte_table_covers_all_bytes() {
        let t = byte_level_decoding_table();
        assert_eq!(t.len(), 256);
        assert_eq!(t[&'Ġ'], b' ');
        assert_eq!(t[&'Ċ'], b'\n');
        assert_eq!(t[&'a'], b'a');
    }

    /// GPT-4o's pattern splits as tiktoken's o200k does: a capitalised word is one piece with its
    /// space, contractions stay on their word, digits go in threes, a punctuation run keeps the
    /// newline after it, and camel case splits before its capitals.
    #[test]
    fn gpt4o_pattern_splits_like_o200k() {
        use tokenizers::{OffsetReferential, OffsetType, PreTokenizedString, PreTokenizer};
        let split = Split::new(
            SplitPattern::Regex(GPT4O_PATTERN.into()),
            SplitDelimiterBehavior::Isolated,
            false,
        )
        .unwrap();
        let text = "Hello World's 12345 getHTTPResponse;\n  x";
        let mut pre = PreTokenizedString::from(text);
        split.pre_tokenize(&mut pre).unwrap();
        let pieces: Vec<String> = pre
            .get_splits(OffsetReferential::Original, OffsetType::Byte)
            .into_iter()
            .map(|(p, _, _)| p.to_string())
            .collect();
        assert_eq!(
            pieces,
            [
                "Hello",
                " World's",
                " ",
                "123",
                "45",
                " get",
                "HTTPResponse",
                ";\n",
                " ",
                " x"
            ]
        );
    }
}
