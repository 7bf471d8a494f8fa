//! `Delta`, a piece of a reply as it streams: what both readers of replies hand out, `tools`'
//! `ReplyStream` and the harmony reader under it (`harmony::HarmonyStream`), kept below both so
//! that neither imports the other for it.

/// A piece of a reply, as it streams.
#[derive(Clone, Debug, PartialEq)]
pub enum Delta {
    /// What the client sees as the answer.
    Content(String),
    /// The model's reasoning (harmony's analysis channel).
    Reasoning(String),
}
