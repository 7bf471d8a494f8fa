//! GBNF, llama.cpp's grammar format (the `grammar` field of its server), translated into
//! llguidance's Lark so that it runs through the same matcher as JSON schemas.
//!
//! The whole format is read: rules `name ::= ...` (a rule ends at the end of its line, except
//! inside parentheses and right after `::=` or `|`), alternatives, grouping, `*` `+` `?` and
//! `{m}` `{m,}` `{m,n}` `{,n}` repetition, string literals, character classes with ranges and `^`,
//! `.` for any character, `#` comments and the escapes `\x.. \u.... \U........ \t \n \r \\ \" \[
//! \]`. Token references (`<...>`, `<[id]>`) are refused with an error that says so. The start rule
//! is `root`; every rule used must be defined.
//!
//! Each rule becomes a Lark rule named `g_` plus its name (upper-case letters become `_` and the
//! letter in lower case, so that names stay distinct and stay rules, not Lark terminals); literals
//! become JSON strings and character classes become regular expressions with every character
//! written as `\x{..}`.

use std::collections::BTreeSet;
use std::fmt::Write;

/// The Lark text of a GBNF grammar, or a message naming what is wrong and where (line and column).
pub fn to_lark(src: &str) -> Result<String, String> {
    let mut p = Parser {
        chars: src.chars().collect(),
        pos: 0,
        defined: BTreeSet::new(),
        used: BTreeSet::new(),
        out: String::from("start: g_root\n"),
    };
    p.grammar()?;
    if !p.defined.contains("root") {
        return Err("the grammar has no rule named 'root' (where output starts)".into());
    }
    if let Some(missing) = p.used.difference(&p.defined).next() {
        return Err(format!(
            "the grammar uses rule '{missing}' but never defines it"
        ));
    }
    Ok(p.out)
}

struct Parser {
    chars: Vec<char>,
    pos: usize,
    defined: BTreeSet<String>,
    used: BTreeSet<String>,
    out: String,
}

impl Parser {
    fn peek(&self) -> Option<char> {
        self.chars.get(self.pos).copied()
    }

    fn peek_at(&self, ahead: usize) -> Option<char> {
        self.chars.get(self.pos + ahead).copied()
    }

    /// An error at the current position, as "line L, column C: message".
    fn error(&self, message: impl std::fmt::Display) -> String {
        let before = &self.chars[..self.pos.min(self.chars.len())];
        let line = before.iter().filter(|&&c| c == '\n').count() + 1;
        let column = before.iter().rev().take_while(|&&c| c != '\n').count() + 1;
        format!("grammar line {line}, column {column}: {message}")
    }

    /// Skips blanks and comments; newlines too when `newlines` (inside parentheses, after `::=`
    /// and `|`).
    fn space(&mut self, newlines: bool) {
        while let Some(c) = self.peek() {
            match c {
                ' ' | '\t' => self.pos += 1,
                '\r' | '\n' if newlines => self.pos += 1,
                '#' => {
                    while self.peek().is_some_and(|c| c != '\n' && c != '\r') {
                        self.pos += 1;
                    }
                }
                _ => break,
            }
        }
    }

    fn name(&mut self) -> Option<String> {
        let start = self.pos;
        while self
            .peek()
            .is_some_and(|c| c.is_ascii_alphanumeric() || c == '-')
        {
            self.pos += 1;
        }
        (self.pos > start).then(|| self.chars[start..self.pos].iter().collect())
    }

    fn grammar(&mut self) -> Result<(), String> {
        self.space(true);
        while self.peek().is_some() {
            self.rule()?;
        }
        Ok(())
    }

    fn rule(&mut self) -> Result<(), String> {
        let name = self
            .name()
            .ok_or_else(|| self.error("expected a rule name"))?;
        self.space(false);
        if !(self.peek() == Some(':')
            && self.peek_at(1) == Some(':')
            && self.peek_at(2) == Some('='))
        {
            return Err(self.error(format!("expected '::=' after rule name '{name}'")));
        }
        self.pos += 3;
        self.space(true);
        if !self.defined.insert(name.clone()) {
            return Err(self.error(format!("rule '{name}' is defined twice")));
        }
        let body = self.alternatives(false)?;
        let _ = writeln!(self.out, "{}: {body}", lark_name(&name));
        match self.peek() {
            Some('\r') => {
                self.pos += 1;
                if self.peek() == Some('\n') {
                    self.pos += 1;
                }
            }
            Some('\n') => self.pos += 1,
            None => {}
            Some(c) => return Err(self.error(format!("expected the end of the line, found '{c}'"))),
        }
        self.space(true);
        Ok(())
    }

    fn alternatives(&mut self, nested: bool) -> Result<String, String> {
        let mut alts = vec![self.sequence(nested)?];
        while self.peek() == Some('|') {
            self.pos += 1;
            self.space(true);
            alts.push(self.sequence(nested)?);
        }
        Ok(alts.join(" | "))
    }

    /// A sequence of items (possibly none: the empty string), up to `|`, `)` or the end of the
    /// rule.
    fn sequence(&mut self, nested: bool) -> Result<String, String> {
        let mut items: Vec<String> = Vec::new();
        while let Some(atom) = self.atom()? {
            self.space(nested);
            let item = self.repeated(atom)?;
            self.space(nested);
            items.push(item);
        }
        Ok(if items.is_empty() {
            "\"\"".to_string()
        } else {
            items.join(" ")
        })
    }

    /// The next atom in Lark (a literal, a class, `.`, a group or a rule name), or `None` where
    /// the sequence ends.
    fn atom(&mut self) -> Result<Option<String>, String> {
        Ok(Some(match self.peek() {
            Some('"') => self.string_literal()?,
            Some('[') => self.char_class()?,
            Some('.') => {
                self.pos += 1;
                "/(?s:.)/".to_string()
            }
            Some('(') => self.group()?,
            Some('<') => {
                return Err(self
                    .error("token references (<...>) are not supported: write the text instead"))
            }
            Some(c) if c.is_ascii_alphanumeric() || c == '-' => {
                let name = self.name().unwrap_or_default();
                let lark = lark_name(&name);
                self.used.insert(name);
                lark
            }
            _ => return Ok(None),
        }))
    }

    /// `"..."` (at its `"`) as a Lark string.
    fn string_literal(&mut self) -> Result<String, String> {
        self.pos += 1;
        let mut text = String::new();
        loop {
            match self.peek() {
                None => return Err(self.error("unterminated string literal")),
                Some('"') => {
                    self.pos += 1;
                    break;
                }
                Some(_) => text.push(self.char_in_literal()?),
            }
        }
        Ok(json_string(&text))
    }

    /// `[...]` (at its `[`) as a Lark regular expression, every character as `\x{..}`.
    fn char_class(&mut self) -> Result<String, String> {
        self.pos += 1;
        let mut class = String::from("/[");
        if self.peek() == Some('^') {
            self.pos += 1;
            class.push('^');
        }
        let mut empty = true;
        loop {
            match self.peek() {
                None => return Err(self.error("unterminated character class")),
                Some(']') => {
                    self.pos += 1;
                    break;
                }
                Some(_) => {
                    let lo = self.char_in_literal()?;
                    let _ = write!(class, "\\x{{{:x}}}", lo as u32);
                    if self.peek() == Some('-') && self.peek_at(1).is_some_and(|c| c != ']') {
                        self.pos += 1;
                        let hi = self.char_in_literal()?;
                        if hi < lo {
                            return Err(
                                self.error(format!("character range '{lo}'-'{hi}' runs backwards"))
                            );
                        }
                        let _ = write!(class, "-\\x{{{:x}}}", hi as u32);
                    }
                    empty = false;
                }
            }
        }
        if empty {
            return Err(self.error("empty character class"));
        }
        class.push_str("]/");
        Ok(class)
    }

    /// `(...)` (at its `(`): the alternatives inside, in parentheses.
    fn group(&mut self) -> Result<String, String> {
        self.pos += 1;
        self.space(true);
        let inner = self.alternatives(true)?;
        if self.peek() != Some(')') {
            return Err(self.error("expected ')'"));
        }
        self.pos += 1;
        Ok(format!("({inner})"))
    }

    /// `atom` with the repetition that follows it, if any (`*`, `+`, `?`, `{...}`).
    fn repeated(&mut self, atom: String) -> Result<String, String> {
        Ok(match self.peek() {
            Some(op @ ('*' | '+' | '?')) => {
                self.pos += 1;
                format!("({atom}){op}")
            }
            Some('{') => {
                self.pos += 1;
                match self.repetition()? {
                    (_, Some(0)) => "\"\"".to_string(),
                    (m, Some(n)) if m == n => format!("({atom}){{{m}}}"),
                    (m, Some(n)) => format!("({atom}){{{m},{n}}}"),
                    (m, None) => format!("({atom}){{{m},}}"),
                }
            }
            _ => atom,
        })
    }

    /// The inside of `{...}` (the `{` read): the least and most repetitions.
    fn repetition(&mut self) -> Result<(u32, Option<u32>), String> {
        self.space(true);
        let min = self.number()?;
        self.space(true);
        let max = if self.peek() == Some(',') {
            self.pos += 1;
            self.space(true);
            self.number()?
        } else {
            Some(min.unwrap_or(0))
        };
        self.space(true);
        if self.peek() != Some('}') {
            return Err(self.error("expected '}' to close the repetition"));
        }
        self.pos += 1;
        let min = min.unwrap_or(0);
        if max.is_some_and(|n| n < min) {
            return Err(self.error("repetition {m,n} with n below m"));
        }
        Ok((min, max))
    }

    fn number(&mut self) -> Result<Option<u32>, String> {
        let start = self.pos;
        while self.peek().is_some_and(|c| c.is_ascii_digit()) {
            self.pos += 1;
        }
        if start == self.pos {
            return Ok(None);
        }
        let text: String = self.chars[start..self.pos].iter().collect();
        text.parse::<u32>()
            .ok()
            .filter(|&n| n < i32::MAX as u32)
            .map(Some)
            .ok_or_else(|| self.error(format!("repetition count {text} is too large")))
    }

    /// One character of a literal or class, escapes decoded.
    fn char_in_literal(&mut self) -> Result<char, String> {
        let c = self.peek().ok_or_else(|| self.error("unexpected end"))?;
        self.pos += 1;
        if c != '\\' {
            return Ok(c);
        }
        let e = self
            .peek()
            .ok_or_else(|| self.error("unexpected end after '\\'"))?;
        self.pos += 1;
        let digits = match e {
            'x' => 2,
            'u' => 4,
            'U' => 8,
            't' => return Ok('\t'),
            'n' => return Ok('\n'),
            'r' => return Ok('\r'),
            '\\' | '"' | '[' | ']' | '-' | '^' => return Ok(e),
            _ => return Err(self.error(format!("unknown escape '\\{e}'"))),
        };
        let start = self.pos;
        let end = start + digits;
        let hex: String = self.chars.get(start..end).unwrap_or(&[]).iter().collect();
        let code = (hex.len() == digits)
            .then(|| u32::from_str_radix(&hex, 16).ok())
            .flatten()
            .ok_or_else(|| self.error(format!("'\\{e}' needs {digits} hex digits")))?;
        self.pos = end;
        char::from_u32(code).ok_or_else(|| self.error(format!("U+{code:X} is not a character")))
    }
}

/// A GBNF rule name as a Lark rule name (see the module doc).
fn lark_name(name: &str) -> String {
    let mut s = String::from("g_");
    for c in name.chars() {
        if c.is_ascii_uppercase() {
            s.push('_');
            s.push(c.to_ascii_lowercase());
        } else {
            s.push(c);
        }
    }
    s
}

/// A Lark string literal (JSON syntax, control characters escaped).
fn json_string(text: &str) -> String {
    let mut s = String::from("\"");
    for c in text.chars() {
        match c {
            '"' => s.push_str("\\\""),
            '\\' => s.push_str("\\\\"),
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                let _ = write!(s, "\\u{:04x}", c as u32);
            }
            c => s.push(c),
        }
    }
    s.push('"');
    s
}

#[cfg(test)]
mod tests {
    use super::to_lark;
    use llguidance::api::TopLevelGrammar;
    use llguidance::toktrie::{ApproximateTokEnv, TokEnv, TokRxInfo, TokTrie};
    use llguidance::{Matcher, ParserFactory};
    use std::sync::Arc;

    #[test]
    fn rules_literals_classes_and_repetition_translate() {
        let lark = to_lark(
            "root ::= \"a\\n\" [a-zA-Z_] item* (x | \"q\\\"\")?  # comment\n\
             item ::=\n  [^\\]\\x41-\\x5a]{2,3} . Up{1,}\n\
             x ::= \"\"\nUp ::= \"u\"{0}\n",
        )
        .unwrap();
        assert_eq!(
            lark,
            "start: g_root\n\
             g_root: \"a\\u000a\" /[\\x{61}-\\x{7a}\\x{41}-\\x{5a}\\x{5f}]/ (g_item)* ((g_x | \"q\\\"\"))?\n\
             g_item: (/[^\\x{5d}\\x{41}-\\x{5a}]/){2,3} /(?s:.)/ (g__up){1,}\n\
             g_x: \"\"\n\
             g__up: \"\"\n"
        );
    }

    #[test]
    fn mistakes_are_named_with_their_place() {
        let cases = [
            ("item ::= \"a\"\n", "no rule named 'root'"),
            ("root ::= item\n", "never defines it"),
            ("root ::= \"a\n", "unterminated string"),
            ("root ::= [ab", "unterminated character class"),
            ("root ::= []", "empty character class"),
            ("root ::= [z-a]\n", "runs backwards"),
            ("root ::= \"a\" )\n", "line 1, column 14"),
            ("root = \"a\"\n", "expected '::='"),
            ("root ::= <think>\n", "token references"),
            ("root ::= \"\\q\"\n", "unknown escape"),
            ("root ::= \"\\x4\"\n", "needs 2 hex digits"),
            ("root ::= \"a\"{3,1}\n", "below m"),
            ("root ::= \"a\"\nroot ::= \"b\"\n", "defined twice"),
            ("root ::= (\"a\"\n", "expected ')'"),
        ];
        for (src, want) in cases {
            let err = to_lark(src).expect_err(src);
            assert!(err.contains(want), "{src:?}: {err}");
        }
    }

    /// Whether the translated grammar matches `text` exactly, over a vocabulary of the 256 bytes
    /// (token 256 ends the text).
    fn matches(gbnf: &str, text: &str) -> bool {
        let words: Vec<Vec<u8>> = (0..=255u8)
            .map(|b| vec![b])
            .chain([vec![TokTrie::SPECIAL_TOKEN_MARKER, b'e']])
            .collect();
        let trie = TokTrie::from(&TokRxInfo::new(257, 256), &words);
        let env: TokEnv = Arc::new(ApproximateTokEnv::new(trie));
        let mut factory = ParserFactory::new_simple(&env).unwrap();
        factory.quiet();
        let lark = to_lark(gbnf).unwrap();
        let parser = factory
            .create_parser(TopLevelGrammar::from_lark(lark.clone()))
            .unwrap_or_else(|e| panic!("{lark}: {e}"));
        let mut m = Matcher::new(Ok(parser));
        for b in text.bytes() {
            if m.consume_token(b as u32).is_err() {
                return false;
            }
        }
        m.is_accepting().unwrap_or(false)
    }

    #[test]
    fn translated_grammars_accept_what_gbnf_accepts() {
        // A JSON-like grammar in the style of llama.cpp's examples: multi-line rules, nested
        // groups, classes, negated classes and bounded repetition.
        let json = r#"
root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws
object ::=
  "{" ws (
            string ":" ws value
    ("," ws string ":" ws value)*
  )? "}" ws
array  ::= "[" ws ( value ("," ws value)* )? "]" ws
string ::= "\"" ( [^"\\\x7F\x00-\x1F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4}) )* "\"" ws
number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws
ws ::= | " " | "\n" [ \t]{0,20}
"#;
        for ok in [
            r#"{"a": 1}"#,
            r#"{"name": "x\u00e9", "list": [1, -2.5, true, null], "o": {}}"#,
            "{}",
        ] {
            assert!(matches(json, ok), "should match: {ok}");
        }
        for bad in [r#"{"a": 01}"#, r#"{"a" 1}"#, "[1]", r#"{"a": "\q"}"#, "{"] {
            assert!(!matches(json, bad), "should not match: {bad}");
        }
        let counted =
            "root ::= [a-c]{2,3} \"-\" Digit{2} tail\nDigit ::= [0-9]\ntail ::= . | \"\"\n";
        assert!(matches(counted, "ab-12"));
        assert!(matches(counted, "abc-12\n"));
        assert!(!matches(counted, "a-12"));
        assert!(!matches(counted, "abcd-12"));
        assert!(!matches(counted, "ab-1"));
        assert!(matches("root ::= [^a]+\n", "b\nc"));
        assert!(!matches("root ::= [^a]+\n", "bac"));
    }
}
