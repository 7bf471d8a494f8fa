//! A request body as it arrives: read as JSON (`json_body`), every top-level field checked by
//! name (`check_fields`, shared by every API), then deserialized once (`typed`). For the chat and
//! text completions that is `WireRequest`, the fields of both endpoints as the client sent them;
//! `chat` reads it into the common request that `validate` checks.

use super::error::ApiError;
use super::Kind;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::http::StatusCode;
use drafting::SpecOverrides;
use serde::{Deserialize, Deserializer};
use serde_json::Value;

/// Message content: a string or a list of text parts.
#[derive(Deserialize)]
#[serde(untagged)]
pub(super) enum Content {
    Text(String),
    Parts(Vec<ContentPart>),
}

#[derive(Deserialize)]
pub(super) struct ContentPart {
    #[serde(rename = "type")]
    pub kind: String,
    pub text: Option<String>,
}

#[derive(Deserialize)]
pub(super) struct ChatMessage {
    pub role: String,
    pub content: Option<Content>,
    /// An assistant turn's calls: `{"id", "type": "function", "function": {"name", "arguments":
    /// <JSON text>}}`.
    pub tool_calls: Option<Vec<Value>>,
    /// A `tool` turn: the call it answers.
    pub tool_call_id: Option<String>,
    pub name: Option<String>,
    /// An assistant turn's reasoning, as vLLM and llama.cpp return it (`reasoning` in newer
    /// vLLM), for templates that show it.
    #[serde(alias = "reasoning")]
    pub reasoning_content: Option<String>,
}

#[derive(Deserialize)]
#[serde(untagged)]
pub(super) enum Stop {
    One(String),
    Many(Vec<String>),
}

#[derive(Deserialize, Default)]
pub(super) struct StreamOptions {
    #[serde(default)]
    pub include_usage: bool,
}

/// The fields pld reads, of both endpoints (those of the other endpoint were refused or dropped
/// by `check_fields`).
#[derive(Deserialize)]
pub(super) struct WireRequest {
    /// The served model's name; absent or null means the served model (one model per server).
    pub model: Option<String>,
    pub max_tokens: Option<usize>,
    pub max_completion_tokens: Option<usize>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<i64>,
    pub min_p: Option<f32>,
    pub repetition_penalty: Option<f32>,
    pub seed: Option<u64>,
    pub stop: Option<Stop>,
    pub n: Option<usize>,
    #[serde(default)]
    pub stream: bool,
    pub stream_options: Option<StreamOptions>,
    pub num_speculative_tokens: Option<usize>,
    pub prompt_lookup_max: Option<usize>,
    pub prompt_lookup_min: Option<usize>,
    pub speculative_config: Option<SpecOverrides>,
    /// Chat: true or false (with `top_logprobs`); text completions: the number of alternatives.
    pub logprobs: Option<Value>,
    pub top_logprobs: Option<usize>,
    /// `{"type": "text" | "json_object"}` or `{"type": "json_schema", "json_schema": {"schema":
    /// ..., "name": ..., "strict": ...}}`.
    pub response_format: Option<Value>,
    /// llama.cpp's extensions: a JSON Schema, or a grammar in GBNF.
    pub json_schema: Option<Value>,
    pub grammar: Option<String>,

    // Chat completions only.
    /// Required; `None` only when absent (a null is a wrong type).
    #[serde(default, deserialize_with = "present")]
    pub messages: Option<Vec<ChatMessage>>,
    pub tools: Option<Value>,
    pub tool_choice: Option<Value>,
    /// vLLM's settings for where the prompt ends (see `PromptEnd`).
    pub add_generation_prompt: Option<bool>,
    pub continue_final_message: Option<bool>,
    /// `low`, `medium` or `high`, for templates that take it (gpt-oss's).
    pub reasoning_effort: Option<String>,

    // Text completions only.
    /// Required; `None` only when absent (a null is refused as not a string).
    #[serde(default, deserialize_with = "present")]
    pub prompt: Option<Value>,
}

/// A required field, read even when null: absent is `None` (through `default`).
fn present<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Option<T>, D::Error> {
    T::deserialize(d).map(Some)
}

/// A required field that was absent, refused as serde words it.
pub(super) fn missing(field: &str) -> ApiError {
    ApiError::bad_request(format!("invalid request: missing field `{field}`"), None)
}

impl Kind {
    /// The fields of this endpoint's requests that pld reads, besides `COMMON_FIELDS`.
    fn fields(self) -> &'static [&'static str] {
        match self {
            Kind::Chat => &[
                "messages",
                "tools",
                "tool_choice",
                "add_generation_prompt",
                "continue_final_message",
                "reasoning_effort",
            ],
            Kind::Text => &["prompt"],
        }
    }
}

/// Fields read by both endpoints.
pub(super) const COMMON_FIELDS: &[&str] = &[
    "model",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "repetition_penalty",
    "seed",
    "stop",
    "n",
    "stream",
    "stream_options",
    "num_speculative_tokens",
    "prompt_lookup_max",
    "prompt_lookup_min",
    "speculative_config",
    "logprobs",
    "top_logprobs",
    "response_format",
    "json_schema",
    "grammar",
];

/// OpenAI fields accepted only with the value that changes nothing (what pld does anyway);
/// any other value is refused rather than silently ignored.
pub(super) fn neutral(field: &str, v: &Value) -> Option<bool> {
    let empty = |v: &Value| {
        v.is_null()
            || v.as_object().is_some_and(|o| o.is_empty())
            || v.as_array().is_some_and(|a| a.is_empty())
    };
    Some(match field {
        "user" => v.is_string() || v.is_null(),
        "frequency_penalty" | "presence_penalty" => v.is_null() || v.as_f64() == Some(0.0),
        "logit_bias" | "metadata" => empty(v),
        "parallel_tool_calls" | "store" => v.is_null() || v.is_boolean(),
        "echo" => v.is_null() || v.as_bool() == Some(false),
        "suffix" => v.is_null(),
        "best_of" => v.is_null() || v.as_u64() == Some(1),
        _ => return None,
    })
}

/// Checks every top-level field of a request: fields pld reads (`known`) pass; fields whose value
/// pld cannot honour (`neutral` says which values change nothing) and unknown fields are a 400
/// naming the field, unless the server is lenient, in which case they are logged and dropped.
pub(super) fn check_fields(
    body: &mut Value,
    known: &[&str],
    neutral: fn(&str, &Value) -> Option<bool>,
    lenient: bool,
) -> Result<(), ApiError> {
    let Some(object) = body.as_object_mut() else {
        return Err(ApiError::bad_request(
            "the request body must be a JSON object",
            None,
        ));
    };
    let mut ignored = Vec::new();
    for (name, value) in object.iter() {
        if known.contains(&name.as_str()) {
            continue;
        }
        let problem = match neutral(name, value) {
            Some(true) => continue,
            Some(false) => format!("'{name}' is not supported with this value ({value})"),
            None => format!("Unrecognized request argument supplied: {name}"),
        };
        if !lenient {
            return Err(ApiError::bad_request(problem, Some(name)));
        }
        tracing::warn!(field = %name, "ignored: {problem}");
        ignored.push(name.clone());
    }
    for name in ignored {
        object.remove(&name);
    }
    Ok(())
}

/// A body as JSON; unreadable (too large: 413) or not JSON is an error.
pub(super) fn json_body(body: Result<Bytes, BytesRejection>) -> Result<Value, ApiError> {
    let body = body.map_err(|e| {
        let message = if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            "request body is too large".into()
        } else {
            format!("cannot read the request body: {e}")
        };
        ApiError::new(e.status(), "invalid_request_error", message)
    })?;
    serde_json::from_slice(&body)
        .map_err(|e| ApiError::bad_request(format!("invalid JSON body: {e}"), None))
}

/// A checked body deserialized into an API's fields; a field of the wrong type is a 400 naming
/// it by its path.
pub(super) fn typed<T: serde::de::DeserializeOwned>(value: Value) -> Result<T, ApiError> {
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        let param = (path != ".").then_some(path);
        ApiError::bad_request(
            format!("invalid request: {}", e.into_inner()),
            param.as_deref(),
        )
    })
}

/// Reads a chat or text completion's body into its fields, turning every way it can be wrong
/// into a 400 (or 413): unreadable, not JSON, a field refused by `check_fields`, a field of the
/// wrong type (named by its path).
pub(super) fn parse(
    body: Result<Bytes, BytesRejection>,
    kind: Kind,
    lenient: bool,
) -> Result<WireRequest, ApiError> {
    let mut value = json_body(body)?;
    let known: Vec<&str> = COMMON_FIELDS.iter().chain(kind.fields()).copied().collect();
    check_fields(&mut value, &known, neutral, lenient)?;
    typed(value)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// JSON values whose object keys are mostly the request's own fields, so that the typed
    /// reading is reached with wrong types, nesting and values.
    fn request_like() -> impl Strategy<Value = Value> {
        let keys: Vec<&'static str> = COMMON_FIELDS
            .iter()
            .copied()
            .chain([
                "messages",
                "prompt",
                "role",
                "content",
                "logit_bias",
                "tools",
                "x",
            ])
            .collect();
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            any::<f64>()
                .prop_map(|f| serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)),
            "[a-z ]{0,12}".prop_map(Value::from),
        ];
        leaf.prop_recursive(4, 48, 6, move |inner| {
            let keys = keys.clone();
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
                proptest::collection::vec((proptest::sample::select(keys), inner), 0..6).prop_map(
                    |kv| Value::Object(kv.into_iter().map(|(k, v)| (k.to_string(), v)).collect())
                ),
            ]
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

        /// Any body is read into a request or refused with a 400; nothing panics.
        #[test]
        fn any_body_is_read_or_refused(v in request_like(), chat in any::<bool>(), lenient in any::<bool>()) {
            let kind = if chat { Kind::Chat } else { Kind::Text };
            let bytes = Bytes::from(serde_json::to_vec(&v).unwrap());
            match parse(Ok(bytes), kind, lenient) {
                Ok(request) => {
                    let _ = super::super::chat::logprobs(&request, kind);
                }
                Err(e) => prop_assert_eq!(e.status, StatusCode::BAD_REQUEST),
            }
        }

        #[test]
        fn any_bytes_are_read_or_refused(raw in proptest::collection::vec(any::<u8>(), 0..200)) {
            if let Err(e) = parse(Ok(Bytes::from(raw)), Kind::Chat, false) {
                prop_assert_eq!(e.status, StatusCode::BAD_REQUEST);
            }
        }
    }
}
