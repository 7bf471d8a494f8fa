//! Where the middle a fill-in-the-middle prompt holds already starts: the lines just above the
//! cursor and the cursor's line up to the cursor go after the middle token, as the start of the
//! middle, so that the text after the cursor (the suffix) stays where it was in the last
//! request's prompt and the prefix cache serves it.
//!
//! An editor sends the text around the cursor at each keystroke. Within a line only the cursor's
//! line changes; at a new line the finished line joins the lines above. Whatever changes must come
//! after the suffix in the prompt, or the suffix is computed again (hundreds of tokens, most of a
//! request's time on a CPU). So the split between prefix and written middle is a line chosen by
//! its content alone, an *anchor*: the prefix runs to the end of the nearest anchor line above
//! the cursor, and everything after it is the written middle. Typing new lines below an anchor
//! leaves the prefix as it was; only when a finished line is itself an anchor does the prefix
//! grow (and the suffix get computed again), once every `ANCHOR_ONE_IN` lines on average.
//!
//! A line is an anchor when the FNV-1a hash of its text (trailing whitespace aside) is a
//! multiple of `ANCHOR_ONE_IN`. Searching stops `MAX_WRITTEN_LINES` finished lines above the
//! cursor, so the written middle stays short where no anchor is near. Both are fixed: a prompt
//! depends only on the request's text.
//!
//! The prefix's start moves too: a plugin sends a fixed number of lines above the cursor (256 in
//! llama.vim and llama.vscode), so deep in a file each new line drops the first line of the
//! prefix, and with it every cached position after it. A long prefix (`LONG_PREFIX_LINES` or
//! more) therefore starts at a *start anchor* (one line in `START_ONE_IN`, by the same hash mixed
//! further) among its first `MAX_DROPPED_LINES` lines: the lines before it are left out, and
//! the prefix starts at the same line until that line leaves the plugin's window, about every
//! `START_ONE_IN` lines typed.

/// One line in this many is an anchor, on average.
pub const ANCHOR_ONE_IN: u64 = 8;
/// Finished lines above the cursor's line that the written middle holds at most.
pub const MAX_WRITTEN_LINES: usize = 48;
/// Lines a prefix has at least for its start to move to a start anchor.
pub const LONG_PREFIX_LINES: usize = 128;
/// One line in this many is a start anchor, on average.
pub const START_ONE_IN: u64 = 16;
/// Lines at the head of a long prefix searched for a start anchor, and left out at most.
pub const MAX_DROPPED_LINES: usize = 64;

/// FNV-1a, 64 bits.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Whether `line` (without its newline) ends a prefix.
pub fn is_anchor(line: &str) -> bool {
    fnv1a(line.trim_end().as_bytes()).is_multiple_of(ANCHOR_ONE_IN)
}

/// Whether `line` (without its newline) starts a long prefix: the line's FNV-1a hash mixed
/// (MurmurHash3's 64-bit finalizer, so that these lines do not follow the anchors') a multiple of
/// `START_ONE_IN`.
pub fn is_start_anchor(line: &str) -> bool {
    let mut h = fnv1a(line.trim_end().as_bytes());
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^= h >> 33;
    h.is_multiple_of(START_ONE_IN)
}

/// The byte offset in `prefix` (whole lines) where the prompt's prefix starts: at the first start
/// anchor among its first `MAX_DROPPED_LINES` lines when it has `LONG_PREFIX_LINES` lines or more
/// and there is one, else 0.
pub fn prefix_start(prefix: &str) -> usize {
    if prefix.matches('\n').count() < LONG_PREFIX_LINES {
        return 0;
    }
    let mut at = 0;
    for line in prefix.split_inclusive('\n').take(MAX_DROPPED_LINES) {
        if is_start_anchor(line.trim_end_matches('\n')) {
            return at;
        }
        at += line.len();
    }
    0
}

/// The byte offset in `before` (all the text before the cursor) where the written middle starts:
/// just after the nearest anchor line above the cursor's line, or, with none among the
/// `MAX_WRITTEN_LINES` finished lines above it, at the start of the furthest of them. Always at a
/// line's start, never after the cursor's line starts.
pub fn written_middle_start(before: &str) -> usize {
    // Line starts, the cursor's line last.
    let cursor_line = before.rfind('\n').map_or(0, |i| i + 1);
    let mut end = cursor_line;
    for _ in 0..MAX_WRITTEN_LINES {
        if end == 0 {
            return 0;
        }
        // The finished line that ends at `end` (its newline at end - 1).
        let start = before[..end - 1].rfind('\n').map_or(0, |i| i + 1);
        if is_anchor(&before[start..end - 1]) {
            return end;
        }
        end = start;
    }
    end
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Lines that are anchors and lines that are not, found by the rule itself.
    fn lines(anchor: bool, n: usize) -> Vec<String> {
        (0..)
            .map(|i| format!("x = {i}"))
            .filter(|l| is_anchor(l) == anchor)
            .take(n)
            .collect()
    }

    #[test]
    fn the_middle_starts_after_the_nearest_anchor() {
        let (a, o) = (lines(true, 2), lines(false, 4));
        let before = format!("{}\n{}\n{}\n{}\n    ret", o[0], a[0], o[1], o[2]);
        let at = written_middle_start(&before);
        assert_eq!(&before[at..], format!("{}\n{}\n    ret", o[1], o[2]));
        // Typing a line that is no anchor leaves the prefix as it was.
        let next = format!("{}\n{}\n{}\n{}\n    return 1\n", o[0], a[0], o[1], o[2]);
        assert_eq!(written_middle_start(&next), at);
        // A finished anchor line moves it.
        let after = format!("{}\n{}\n{}\n", o[0], a[0], a[1]);
        assert_eq!(written_middle_start(&after), after.len());
        // Trailing whitespace is no part of a line's identity.
        let spaced = format!("{}  \r\nz", a[0]);
        assert_eq!(written_middle_start(&spaced), spaced.len() - 1);
    }

    #[test]
    fn without_an_anchor_near_the_middle_holds_a_bounded_number_of_lines() {
        assert_eq!(written_middle_start(""), 0);
        assert_eq!(written_middle_start("no newline"), 0);
        let o = lines(false, MAX_WRITTEN_LINES + 5);
        // Fewer finished lines than the bound, none an anchor: all of it is the middle.
        let short = format!("{}\n{}\nab", o[0], o[1]);
        assert_eq!(written_middle_start(&short), 0);
        let long = o.join("\n") + "\n";
        let at = written_middle_start(&long);
        assert_eq!(long[at..].lines().count(), MAX_WRITTEN_LINES);
        assert!(at == 0 || long.as_bytes()[at - 1] == b'\n');
    }

    #[test]
    fn a_long_prefix_starts_at_its_first_start_anchor_and_keeps_it_while_the_window_slides() {
        let starts: Vec<String> = (0..)
            .map(|i| format!("s = {i}"))
            .filter(|l| is_start_anchor(l))
            .take(1)
            .collect();
        let plain: Vec<String> = (0..)
            .map(|i| format!("p = {i}"))
            .filter(|l| !is_start_anchor(l))
            .take(400)
            .collect();
        let window = |lines: &[String]| lines.iter().map(|l| format!("{l}\n")).collect::<String>();
        // 10 plain lines, the start anchor, then plain lines: 200 lines in all.
        let mut file: Vec<String> = plain[..10].to_vec();
        file.push(starts[0].clone());
        file.extend(plain[10..200].iter().cloned());
        let prefix = window(&file[..200]);
        let at = prefix_start(&prefix);
        assert!(
            prefix[at..].starts_with(&starts[0]),
            "{}",
            &prefix[at..at + 20]
        );
        // The window slides by one line: the prefix still starts at the same line.
        let slid = window(&file[1..201]);
        assert_eq!(
            slid[prefix_start(&slid)..],
            format!("{}{}\n", &prefix[at..], file[200])
        );
        // A short prefix keeps its head; a long one without a start anchor near its head too.
        let short = window(&file[..LONG_PREFIX_LINES - 1]);
        assert_eq!(prefix_start(&short), 0);
        let none = window(&plain[..300]);
        assert_eq!(prefix_start(&none), 0);
    }

    #[test]
    fn about_one_line_in_eight_is_an_anchor() {
        let n = (0..4000)
            .filter(|i| is_anchor(&format!("    y = f({i})")))
            .count();
        assert!((400..600).contains(&n), "{n}");
        let n = (0..4000)
            .filter(|i| is_start_anchor(&format!("    y = f({i})")))
            .count();
        assert!((180..320).contains(&n), "{n}");
    }
}
