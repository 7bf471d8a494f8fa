//! Fill-in-the-middle (FIM): the special tokens a code model was trained to read around a hole in
//! a file, found once when the model loads (`FimTokens`), and the prompt they make (`prompt`):
//!
//! - the tokens come from the GGUF's `tokenizer.ggml.fim_{pre,suf,mid,pad,rep,sep}_token_id`
//!   (and the older `prefix`/`suffix`/`middle_token_id`) where the file has them, else from the
//!   vocabulary by the texts of the families we know: Qwen2.5-Coder (and CodeGemma), StarCoder
//!   (1 and 2, Granite), DeepSeek-Coder, CodeLlama, Codestral;
//! - the prompt is `[PRE] prefix [SUF] suffix [MID] middle` (Codestral: `[SUFFIX] suffix [PREFIX]
//!   prefix middle`), where `middle` is the start of the middle written already (llama-server's
//!   `prompt`: the cursor's line up to the cursor), and the model writes the rest of the middle.
//!   With the typed part of the line last, a keystroke changes only the prompt's end, so a prefix
//!   cache serves all before it (in the prefix it would change what comes before the suffix);
//!   `split` chooses where it starts, a few lines above the cursor, so that a new line does not
//!   change the prefix either.
//!   Chunks of other files go in front, in the
//!   repository layout where the model has its tokens (`<|repo_name|>name`, then per file
//!   `<|file_sep|>path\n text`, and `<|file_sep|>` before the file being edited), as plain text
//!   sections otherwise;
//! - every one of these tokens ends a middle the model writes (CodeLlama also has its own end,
//!   `<EOT>`).
//!
//! A prompt longer than its budget loses first the oldest chunks, then the far end of the suffix
//! (down to a quarter of the budget), then the start of the prefix.
//!
//! `indent_cut` is the rule of llama-server's `n_indent` for completions in an editor: a line the
//! model starts less indented than the cursor's ends the completion.

pub mod split;

use crate::error::Result;
use crate::gguf::GgufFile;
use candle_core::quantized::gguf_file::Value;
use std::collections::HashMap;

/// Where the model writes the middle.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FimOrder {
    /// `[PRE] prefix [SUF] suffix [MID]`, the middle after the middle token (most code models).
    PrefixSuffixMiddle,
    /// `[SUF] suffix [PRE] prefix`, the middle right after the prefix (Codestral).
    SuffixPrefix,
}

/// A model's fill-in-the-middle tokens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FimTokens {
    pub prefix: u32,
    pub suffix: u32,
    /// Absent where the middle follows the prefix (`FimOrder::SuffixPrefix`).
    pub middle: Option<u32>,
    pub pad: Option<u32>,
    /// The repository name's token and the file separator: the repository-level layout.
    pub repo: Option<u32>,
    pub file_sep: Option<u32>,
    /// The token that ends a middle where the model has one of its own (CodeLlama's `<EOT>`).
    pub eot: Option<u32>,
    pub order: FimOrder,
}

/// The texts of one family's tokens.
struct Family {
    prefix: &'static str,
    suffix: &'static str,
    middle: Option<&'static str>,
    pad: Option<&'static str>,
    repo: Option<&'static str>,
    file_sep: Option<&'static str>,
    eot: Option<&'static str>,
    order: FimOrder,
}

const fn psm(
    prefix: &'static str,
    suffix: &'static str,
    middle: &'static str,
    pad: Option<&'static str>,
    repo: Option<&'static str>,
    file_sep: Option<&'static str>,
) -> Family {
    Family {
        prefix,
        suffix,
        middle: Some(middle),
        pad,
        repo,
        file_sep,
        eot: None,
        order: FimOrder::PrefixSuffixMiddle,
    }
}

/// The families whose tokens are found by text, the first whose prefix, suffix (and middle)
/// tokens the vocabulary all has wins.
const FAMILIES: [Family; 7] = [
    // Qwen2.5-Coder; CodeGemma has the same three (its file separator is another).
    psm(
        "<|fim_prefix|>",
        "<|fim_suffix|>",
        "<|fim_middle|>",
        Some("<|fim_pad|>"),
        Some("<|repo_name|>"),
        Some("<|file_sep|>"),
    ),
    // StarCoder, StarCoder 2, SantaCoder, Granite code models.
    psm(
        "<fim_prefix>",
        "<fim_suffix>",
        "<fim_middle>",
        Some("<fim_pad>"),
        Some("<reponame>"),
        Some("<file_sep>"),
    ),
    psm(
        "<fim-prefix>",
        "<fim-suffix>",
        "<fim-middle>",
        Some("<fim-pad>"),
        None,
        None,
    ),
    // DeepSeek-Coder (full-width bars), and the ASCII spelling some conversions use.
    psm(
        "<\u{ff5c}fim\u{2581}begin\u{ff5c}>",
        "<\u{ff5c}fim\u{2581}hole\u{ff5c}>",
        "<\u{ff5c}fim\u{2581}end\u{ff5c}>",
        None,
        None,
        None,
    ),
    psm(
        "<|fim\u{2581}begin|>",
        "<|fim\u{2581}hole|>",
        "<|fim\u{2581}end|>",
        None,
        None,
        None,
    ),
    // CodeLlama: SentencePiece pieces with their leading space, and its end of a middle.
    Family {
        eot: Some("\u{2581}<EOT>"),
        ..psm(
            "\u{2581}<PRE>",
            "\u{2581}<SUF>",
            "\u{2581}<MID>",
            None,
            None,
            None,
        )
    },
    // Codestral: the suffix first, the middle right after the prefix.
    Family {
        prefix: "[PREFIX]",
        suffix: "[SUFFIX]",
        middle: None,
        pad: None,
        repo: None,
        file_sep: None,
        eot: None,
        order: FimOrder::SuffixPrefix,
    },
];

/// CodeLlama's pieces as some conversions spell them, without the leading space (and its end of
/// a middle).
const PLAIN_CODELLAMA: [&str; 3] = ["<PRE>", "<SUF>", "<MID>"];
const PLAIN_CODELLAMA_EOT: &str = "<EOT>";

/// The metadata keys of each token, newest name first.
const KEYS: [(&str, &[&str]); 6] = [
    (
        "prefix",
        &[
            "tokenizer.ggml.fim_pre_token_id",
            "tokenizer.ggml.prefix_token_id",
        ],
    ),
    (
        "suffix",
        &[
            "tokenizer.ggml.fim_suf_token_id",
            "tokenizer.ggml.suffix_token_id",
        ],
    ),
    (
        "middle",
        &[
            "tokenizer.ggml.fim_mid_token_id",
            "tokenizer.ggml.middle_token_id",
        ],
    ),
    ("pad", &["tokenizer.ggml.fim_pad_token_id"]),
    ("repo", &["tokenizer.ggml.fim_rep_token_id"]),
    ("file_sep", &["tokenizer.ggml.fim_sep_token_id"]),
];

impl FimTokens {
    /// The tokens of the model in `file`, if it has fill-in-the-middle tokens.
    pub fn from_gguf(file: &GgufFile) -> Option<FimTokens> {
        let vocab = match file.meta("tokenizer.ggml.tokens") {
            Some(Value::Array(a)) => a,
            _ => return None,
        };
        let wanted: Vec<&str> = FAMILIES
            .iter()
            .flat_map(|f| {
                [
                    Some(f.prefix),
                    Some(f.suffix),
                    f.middle,
                    f.pad,
                    f.repo,
                    f.file_sep,
                    f.eot,
                ]
            })
            .flatten()
            .chain(PLAIN_CODELLAMA)
            .chain([PLAIN_CODELLAMA_EOT])
            .collect();
        let mut by_text = HashMap::new();
        for (i, v) in vocab.iter().enumerate() {
            if let Value::String(s) = v {
                if wanted.contains(&s.as_str()) {
                    by_text.entry(s.clone()).or_insert(i as u32);
                }
            }
        }
        let n = vocab.len() as u64;
        let meta = |key: &str| {
            file.get_u64_opt(key)
                .filter(|&id| id < n)
                .map(|id| id as u32)
        };
        Self::detect(meta, |text| by_text.get(text).copied())
    }

    /// The tokens from metadata ids (`meta`, by key) over those found by text (`id_of`): the
    /// family whose prefix, suffix and middle tokens are all there gives every token it has, and
    /// each token the metadata names replaces the one found by text.
    pub fn detect(
        meta: impl Fn(&str) -> Option<u32>,
        id_of: impl Fn(&str) -> Option<u32>,
    ) -> Option<FimTokens> {
        let by_text = FAMILIES.iter().find_map(|f| {
            let middle = match f.middle {
                Some(m) => Some(id_of(m)?),
                None => None,
            };
            Some(FimTokens {
                prefix: id_of(f.prefix)?,
                suffix: id_of(f.suffix)?,
                middle,
                pad: f.pad.and_then(&id_of),
                repo: f.repo.and_then(&id_of),
                file_sep: f.file_sep.and_then(&id_of),
                eot: f.eot.and_then(&id_of),
                order: f.order,
            })
        });
        let by_text = by_text.or_else(|| {
            let [p, s, m] = PLAIN_CODELLAMA.map(&id_of);
            Some(FimTokens {
                prefix: p?,
                suffix: s?,
                middle: Some(m?),
                pad: None,
                repo: None,
                file_sep: None,
                eot: id_of(PLAIN_CODELLAMA_EOT),
                order: FimOrder::PrefixSuffixMiddle,
            })
        });
        let named = |field: &str| {
            let (_, keys) = KEYS.iter().find(|(f, _)| *f == field)?;
            keys.iter().find_map(|k| meta(k))
        };
        let (prefix, suffix, middle) = (named("prefix"), named("suffix"), named("middle"));
        let mut tokens = match (by_text, prefix, suffix, middle) {
            (Some(t), _, _, _) => t,
            (None, Some(prefix), Some(suffix), Some(middle)) => FimTokens {
                prefix,
                suffix,
                middle: Some(middle),
                pad: None,
                repo: None,
                file_sep: None,
                eot: None,
                order: FimOrder::PrefixSuffixMiddle,
            },
            _ => return None,
        };
        tokens.prefix = prefix.unwrap_or(tokens.prefix);
        tokens.suffix = suffix.unwrap_or(tokens.suffix);
        if middle.is_some() {
            tokens.middle = middle;
            tokens.order = FimOrder::PrefixSuffixMiddle;
        }
        tokens.pad = named("pad").or(tokens.pad);
        tokens.repo = named("repo").or(tokens.repo);
        tokens.file_sep = named("file_sep").or(tokens.file_sep);
        Some(tokens)
    }

    /// Every fill-in-the-middle token of the model: none of them belongs in a middle, so a model
    /// that writes one has finished it.
    pub fn all(&self) -> Vec<u32> {
        [
            Some(self.prefix),
            Some(self.suffix),
            self.middle,
            self.pad,
            self.repo,
            self.file_sep,
            self.eot,
        ]
        .into_iter()
        .flatten()
        .collect()
    }

    /// Whether the model has the repository-level layout for other files' chunks.
    pub fn has_repo_layout(&self) -> bool {
        self.repo.is_some() && self.file_sep.is_some()
    }

    /// The prompt for `hole` in at most `budget` tokens (less only when even the tokens around
    /// the hole do not fit): `bos` first when the model takes one, the chunks of other files,
    /// then the hole in the model's order. `encode` tokenizes text without special tokens' ids
    /// being added.
    pub fn prompt(
        &self,
        hole: &Hole<'_>,
        budget: usize,
        bos: Option<u32>,
        encode: impl Fn(&str) -> Result<Vec<u32>>,
    ) -> Result<FimPrompt> {
        let mut prefix = encode(hole.prefix)?;
        let mut suffix = encode(hole.suffix)?;
        let middle = encode(hole.middle)?;
        let repo = self.has_repo_layout();
        let mut chunks = Vec::with_capacity(hole.extra.len());
        for c in hole.extra {
            let mut ids = Vec::new();
            if repo {
                ids.extend(self.file_sep);
                ids.extend(encode(&format!("{}\n", c.filename))?);
                ids.extend(encode(&c.text)?);
            } else {
                ids.extend(encode(&format!("--- {} ---\n{}\n", c.filename, c.text))?);
            }
            chunks.push(ids);
        }
        // The repository's name before the chunks and the edited file's separator after them.
        let (head, tail) = if repo && !chunks.is_empty() {
            let mut head: Vec<u32> = self.repo.into_iter().collect();
            head.extend(encode(&format!("{REPO_NAME}\n"))?);
            let mut tail: Vec<u32> = self.file_sep.into_iter().collect();
            tail.extend(encode(&format!("{EDITED_FILE}\n"))?);
            (head, tail)
        } else {
            (Vec::new(), Vec::new())
        };
        let fixed =
            usize::from(bos.is_some()) + 2 + usize::from(self.middle.is_some()) + middle.len();
        let mut truncated = false;
        let room = budget.saturating_sub(fixed);
        if prefix.len() + suffix.len() > room {
            truncated = true;
            let keep_suffix = suffix
                .len()
                .min((budget / 4).max(room.saturating_sub(prefix.len())));
            suffix.truncate(keep_suffix);
            let keep_prefix = prefix.len().min(room.saturating_sub(suffix.len()));
            prefix.drain(..prefix.len() - keep_prefix);
        }
        // The newest chunks that fit (clients send the oldest first).
        let mut left = room.saturating_sub(prefix.len() + suffix.len() + head.len() + tail.len());
        let mut first_kept = chunks.len();
        while first_kept > 0 && chunks[first_kept - 1].len() <= left {
            first_kept -= 1;
            left -= chunks[first_kept].len();
        }
        truncated |= first_kept > 0;
        let kept = &chunks[first_kept..];

        let mut ids = Vec::new();
        ids.extend(bos);
        if !kept.is_empty() {
            ids.extend(&head);
            kept.iter().for_each(|c| ids.extend(c));
            ids.extend(&tail);
        }
        match self.order {
            FimOrder::PrefixSuffixMiddle => {
                ids.push(self.prefix);
                ids.extend(&prefix);
                ids.push(self.suffix);
                ids.extend(&suffix);
                ids.extend(self.middle);
                ids.extend(&middle);
            }
            FimOrder::SuffixPrefix => {
                ids.push(self.suffix);
                ids.extend(&suffix);
                ids.push(self.prefix);
                ids.extend(&prefix);
                ids.extend(&middle);
            }
        }
        Ok(FimPrompt { ids, truncated })
    }
}

/// The repository name the layout needs (clients send none).
const REPO_NAME: &str = "project";
/// The name the layout gives the file being edited (clients send none).
const EDITED_FILE: &str = "edited";

/// One chunk of another file, as editors send it for context.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Chunk {
    pub filename: String,
    pub text: String,
}

/// What a fill-in-the-middle request holds: the text before the hole, after it, the start of the
/// middle written already (kept whole, never cut), and chunks of other files, oldest first.
pub struct Hole<'a> {
    pub prefix: &'a str,
    pub suffix: &'a str,
    pub middle: &'a str,
    pub extra: &'a [Chunk],
}

/// A fill-in-the-middle prompt, and whether parts of the request were left out to fit it.
#[derive(Debug, PartialEq, Eq)]
pub struct FimPrompt {
    pub ids: Vec<u32>,
    pub truncated: bool,
}

/// Where `text` must end under llama-server's `n_indent`: at the first line, after the first
/// newline, that has more than its indentation and is indented by fewer than `min_indent` spaces
/// or tabs (an empty line counts as not indented). The cut keeps that line's indentation, as
/// llama-server does. `None`: no such line (yet), or `min_indent` is 0.
pub fn indent_cut(text: &str, min_indent: usize) -> Option<usize> {
    if min_indent == 0 {
        return None;
    }
    let mut at = text.find('\n')? + 1;
    loop {
        let line = &text[at..];
        let indent = line
            .bytes()
            .take_while(|b| *b == b' ' || *b == b'\t')
            .count();
        if indent == line.len() {
            return None;
        }
        if indent < min_indent {
            return Some(at + indent);
        }
        at += line.find('\n')? + 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vocab(texts: &[&str]) -> HashMap<String, u32> {
        texts
            .iter()
            .enumerate()
            .map(|(i, t)| (t.to_string(), 100 + i as u32))
            .collect()
    }

    fn detect_in(v: &HashMap<String, u32>, meta: &[(&str, u32)]) -> Option<FimTokens> {
        FimTokens::detect(
            |k| meta.iter().find(|(key, _)| *key == k).map(|(_, id)| *id),
            |t| v.get(t).copied(),
        )
    }

    #[test]
    fn qwen_tokens_are_found_by_text() {
        let v = vocab(&[
            "<|fim_prefix|>",
            "<|fim_middle|>",
            "<|fim_suffix|>",
            "<|fim_pad|>",
            "<|repo_name|>",
            "<|file_sep|>",
        ]);
        let t = detect_in(&v, &[]).unwrap();
        assert_eq!((t.prefix, t.suffix, t.middle), (100, 102, Some(101)));
        assert_eq!(
            (t.pad, t.repo, t.file_sep),
            (Some(103), Some(104), Some(105))
        );
        assert!(t.has_repo_layout());
        assert_eq!(t.order, FimOrder::PrefixSuffixMiddle);
    }

    #[test]
    fn each_family_is_found_and_metadata_wins() {
        let deepseek = vocab(&[
            "<\u{ff5c}fim\u{2581}begin\u{ff5c}>",
            "<\u{ff5c}fim\u{2581}hole\u{ff5c}>",
            "<\u{ff5c}fim\u{2581}end\u{ff5c}>",
        ]);
        let t = detect_in(&deepseek, &[]).unwrap();
        assert_eq!((t.prefix, t.suffix, t.middle), (100, 101, Some(102)));
        assert!(!t.has_repo_layout());
        let codellama = vocab(&[
            "\u{2581}<PRE>",
            "\u{2581}<SUF>",
            "\u{2581}<MID>",
            "\u{2581}<EOT>",
        ]);
        let t = detect_in(&codellama, &[]).unwrap();
        assert_eq!((t.middle, t.eot), (Some(102), Some(103)));
        assert_eq!(t.all(), [100, 101, 102, 103]);
        let plain = vocab(&["<PRE>", "<SUF>", "<MID>", "<EOT>"]);
        let t = detect_in(&plain, &[]).unwrap();
        assert_eq!((t.prefix, t.eot), (100, Some(103)));
        let starcoder = vocab(&["<fim_prefix>", "<fim_suffix>", "<fim_middle>", "<file_sep>"]);
        let t = detect_in(&starcoder, &[]).unwrap();
        assert_eq!((t.file_sep, t.repo), (Some(103), None));
        let codestral = vocab(&["[PREFIX]", "[SUFFIX]", "[MIDDLE]"]);
        let t = detect_in(&codestral, &[]).unwrap();
        assert_eq!((t.order, t.middle), (FimOrder::SuffixPrefix, None));
        // The metadata's ids over the texts', and alone.
        let t = detect_in(&deepseek, &[("tokenizer.ggml.fim_mid_token_id", 7)]).unwrap();
        assert_eq!(t.middle, Some(7));
        let ids = [
            ("tokenizer.ggml.prefix_token_id", 1),
            ("tokenizer.ggml.suffix_token_id", 2),
            ("tokenizer.ggml.middle_token_id", 3),
            ("tokenizer.ggml.fim_sep_token_id", 4),
        ];
        let t = detect_in(&HashMap::new(), &ids).unwrap();
        assert_eq!(
            (t.prefix, t.suffix, t.middle, t.file_sep),
            (1, 2, Some(3), Some(4))
        );
        // Two of three is no fill-in-the-middle.
        assert_eq!(
            detect_in(&vocab(&["<|fim_prefix|>", "<|fim_suffix|>"]), &[]),
            None
        );
        assert_eq!(detect_in(&vocab(&["<|im_start|>"]), &[]), None);
    }

    /// One token per byte, offset so that they are apart from the special tokens.
    fn bytes(text: &str) -> Result<Vec<u32>> {
        Ok(text.bytes().map(|b| 1000 + b as u32).collect())
    }

    fn text(ids: &[u32]) -> String {
        ids.iter()
            .map(|&i| match i.checked_sub(1000) {
                Some(b) => char::from(b as u8).to_string(),
                None => format!("<{i}>"),
            })
            .collect()
    }

    fn qwen() -> FimTokens {
        FimTokens {
            prefix: 1,
            suffix: 2,
            middle: Some(3),
            pad: Some(4),
            repo: Some(5),
            file_sep: Some(6),
            eot: None,
            order: FimOrder::PrefixSuffixMiddle,
        }
    }

    #[test]
    fn the_prompt_in_each_layout() {
        let extra = [
            Chunk {
                filename: "a.py".into(),
                text: "A\n".into(),
            },
            Chunk {
                filename: "b.py".into(),
                text: "B\n".into(),
            },
        ];
        let hole = Hole {
            prefix: "def f(",
            suffix: ")\n",
            middle: "",
            extra: &extra,
        };
        let p = qwen().prompt(&hole, 1000, None, bytes).unwrap();
        assert_eq!(
            text(&p.ids),
            "<5>project\n<6>a.py\nA\n<6>b.py\nB\n<6>edited\n<1>def f(<2>)\n<3>"
        );
        assert!(!p.truncated);
        let alone = Hole { extra: &[], ..hole };
        let p = qwen().prompt(&alone, 1000, Some(9), bytes).unwrap();
        assert_eq!(text(&p.ids), "<9><1>def f(<2>)\n<3>");
        let plain = FimTokens {
            repo: None,
            ..qwen()
        };
        let p = plain.prompt(&hole, 1000, None, bytes).unwrap();
        assert_eq!(
            text(&p.ids),
            "--- a.py ---\nA\n\n--- b.py ---\nB\n\n<1>def f(<2>)\n<3>"
        );
        let codestral = FimTokens {
            middle: None,
            order: FimOrder::SuffixPrefix,
            ..plain
        };
        let p = codestral.prompt(&alone, 1000, Some(9), bytes).unwrap();
        assert_eq!(text(&p.ids), "<9><2>)\n<1>def f(");
        // The start of the middle written already goes last, after the middle token.
        let typed = Hole {
            prefix: "def f(",
            suffix: ")\n",
            middle: "  x",
            extra: &[],
        };
        let p = qwen().prompt(&typed, 1000, None, bytes).unwrap();
        assert_eq!(text(&p.ids), "<1>def f(<2>)\n<3>  x");
        let p = codestral.prompt(&typed, 1000, None, bytes).unwrap();
        assert_eq!(text(&p.ids), "<2>)\n<1>def f(  x");
    }

    #[test]
    fn a_long_request_loses_old_chunks_then_the_far_suffix_then_the_prefix_start() {
        let extra: Vec<Chunk> = ["old", "new"]
            .iter()
            .map(|n| Chunk {
                filename: n.to_string(),
                text: "x".repeat(20),
            })
            .collect();
        let hole = Hole {
            prefix: &"p".repeat(40),
            suffix: &"s".repeat(40),
            middle: "",
            extra: &extra,
        };
        let full = qwen().prompt(&hole, 10_000, None, bytes).unwrap();
        assert!(!full.truncated);
        // Room for one chunk: the newest stays.
        let p = qwen()
            .prompt(&hole, full.ids.len() - 10, None, bytes)
            .unwrap();
        assert!(p.truncated);
        let t = text(&p.ids);
        assert!(t.contains("<6>new\n") && !t.contains("old"), "{t}");
        assert!(p.ids.len() <= full.ids.len() - 10);
        // Less room than the hole takes: the suffix gives up what the prefix needs, down to a
        // quarter of the budget, then the prefix keeps its end.
        let p = qwen().prompt(&hole, 60, None, bytes).unwrap();
        assert_eq!(
            text(&p.ids),
            format!("<1>{}<2>{}<3>", "p".repeat(40), "s".repeat(17))
        );
        let p = qwen().prompt(&hole, 40, None, bytes).unwrap();
        assert_eq!(
            text(&p.ids),
            format!("<1>{}<2>{}<3>", "p".repeat(27), "s".repeat(10))
        );
        let p = qwen().prompt(&hole, 90, None, bytes).unwrap();
        assert_eq!(
            text(&p.ids),
            format!("<1>{}<2>{}<3>", "p".repeat(40), "s".repeat(40))
        );
        // The middle's start is kept whole: the prefix and suffix give up its room.
        let typed = Hole {
            middle: "mmmmm",
            ..hole
        };
        let p = qwen().prompt(&typed, 45, None, bytes).unwrap();
        assert_eq!(
            text(&p.ids),
            format!("<1>{}<2>{}<3>mmmmm", "p".repeat(26), "s".repeat(11))
        );
        assert_eq!(p.ids.len(), 45);
    }

    #[test]
    fn indentation_ends_a_completion_as_in_llama_server() {
        assert_eq!(indent_cut("a\n  b\nc", 0), None);
        assert_eq!(indent_cut("x = 1", 4), None);
        // The first line is never checked; the next lines must keep the indentation.
        assert_eq!(indent_cut("x\n    y\n    z", 4), None);
        assert_eq!(indent_cut("x\n    y\n  z", 4), Some(10));
        assert_eq!(&"x\n    y\n  z"[..10], "x\n    y\n  ");
        // A line that is only indentation so far is not decided.
        assert_eq!(indent_cut("x\n  ", 4), None);
        // An empty line ends it.
        assert_eq!(indent_cut("x\n\n    y", 4), Some(2));
        assert_eq!(indent_cut("x\n\ty\n", 1), None);
    }
}
